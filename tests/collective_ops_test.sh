#!/usr/bin/env bash
# 2 Python ranks under mlfabric-run (mpirun + scheduler + a daemon per rank):
# tests/collective_ops_check.py checks Horovod's dtypes (int8, uint8, int16,
# uint16, bool) and reduce ops (Min, Max, Product) through the mpi and
# mlfabric backends, numpy and TensorFlow (eager and tf.function), and that
# mismatched ops and shapes raise FailedPreconditionError on every rank;
# alltoall, reducescatter and grouped_reducescatter with their gradients.
# Skips, saying why, when the venv has no TensorFlow.
set -euo pipefail
source "$TEST_SRCDIR/mlfabric/testing/prereq.sh"
require_python tensorflow numpy
root="$TEST_SRCDIR/mlfabric"
export PYTHONPATH="$root/python"
out="$TEST_TMPDIR/out.txt"
timeout 280 "$root/tools/run/mlfabric-run" -v -np 2 --ranks_per_host 1 \
  "$python" -X faulthandler "$root/tests/collective_ops_check.py" 2>&1 | tee "$out"
[[ $(grep -c "collective_ops_check rank [0-1]: OK" "$out") == 2 ]]
