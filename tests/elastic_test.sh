#!/usr/bin/env bash
# Horovod's elastic state API (tests/elastic_check.py) on 2 ranks under
# mlfabric-run, with the mpi and the mlfabric AllReduce backends:
# ObjectState, TensorFlowState, TensorFlowKerasState / KerasState, the Keras
# elastic callbacks in model.fit, and run() retrying after a membership
# change. Skips, saying why, when the venv has no TensorFlow/Keras.
set -euo pipefail
source "$TEST_SRCDIR/mlfabric/testing/prereq.sh"
python="${MLFABRIC_VENV:-/opt/mlfabric/venv}/bin/python"
if ! "$python" -c "import tensorflow, keras" >/dev/null 2>&1; then
  skip_or_fail "$python cannot import tensorflow/keras; run tools/bootstrap"
fi
root="$TEST_SRCDIR/mlfabric"
export PYTHONPATH="$root/python" MPLCONFIGDIR="$TEST_TMPDIR/matplotlib" TMPDIR="$TEST_TMPDIR"
for backend in mpi mlfabric; do
  out="$TEST_TMPDIR/out-$backend.txt"
  echo "== backend $backend"
  MLFABRIC_ALLREDUCE_BACKEND="$backend" \
    timeout 290 "$root/tools/run/mlfabric-run" -np 2 --ranks_per_host 1 \
    "$python" -X faulthandler "$root/tests/elastic_check.py" 2>&1 | tee "$out"
  [[ $(grep -c "elastic_check rank [0-1]: OK" "$out") == 2 ]]
done
