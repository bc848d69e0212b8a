#!/usr/bin/env bash
# A Horovod-style Keras program (tests/horovod_keras_check.py) on 2 ranks
# under mlfabric-run, in both import orders: TensorFlow first with the
# mlfabric AllReduce backend, MLfabric first with the mpi backend; then the
# mlfabric backend with both ranks on one host (--ranks_per_host 2), where
# they sum in shared memory. Skips, saying why, when the venv has no
# TensorFlow.
set -euo pipefail
source "$TEST_SRCDIR/mlfabric/testing/prereq.sh"
require_python tensorflow keras
root="$TEST_SRCDIR/mlfabric"
export PYTHONPATH="$root/python" MPLCONFIGDIR="$TEST_TMPDIR/matplotlib"
for run in "tensorflow-first mlfabric 1" "mlfabric-first mpi 1" "tensorflow-first mlfabric 2"; do
  read -r order backend per_host <<<"$run"
  out="$TEST_TMPDIR/out-$order-$backend-$per_host.txt"
  echo "== import order $order, backend $backend, $per_host rank(s) per host"
  CHECK_IMPORT_ORDER="$order" MLFABRIC_ALLREDUCE_BACKEND="$backend" \
    timeout 280 "$root/tools/run/mlfabric-run" -np 2 --ranks_per_host "$per_host" \
    "$python" -X faulthandler "$root/tests/horovod_keras_check.py" 2>&1 | tee "$out"
  [[ $(grep -c "horovod_keras_check rank [0-1]: OK" "$out") == 2 ]]
done
