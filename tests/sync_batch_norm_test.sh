#!/usr/bin/env bash
# 2 ranks under mlfabric-run (mpirun + scheduler + a daemon per rank):
# tests/sync_batch_norm_check.py checks SyncBatchNormalization (mpi and
# mlfabric backends) against one BatchNormalization over both ranks'
# batches: outputs, moving statistics, gradients, masks, model.fit. Skips,
# saying why, when the venv has no TensorFlow/Keras.
set -euo pipefail
source "$TEST_SRCDIR/mlfabric/testing/prereq.sh"
python="${MLFABRIC_VENV:-/opt/mlfabric/venv}/bin/python"
if ! "$python" -c "import tensorflow, keras" >/dev/null 2>&1; then
  skip_or_fail "$python cannot import tensorflow/keras; run tools/bootstrap"
fi
root="$TEST_SRCDIR/mlfabric"
export PYTHONPATH="$root/python" MPLCONFIGDIR="$TEST_TMPDIR/matplotlib" TMPDIR="$TEST_TMPDIR"
out="$TEST_TMPDIR/out.txt"
timeout 290 "$root/tools/run/mlfabric-run" -np 2 --ranks_per_host 1 \
  "$python" -X faulthandler "$root/tests/sync_batch_norm_check.py" 2>&1 | tee "$out"
[[ $(grep -c "sync_batch_norm_check rank [0-1]: OK" "$out") == 2 ]]
