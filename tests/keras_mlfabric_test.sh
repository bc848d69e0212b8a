#!/usr/bin/env bash
# 3 Python ranks under mlfabric-run (mpirun + a scheduler with the mlfabric
# planner + 3 daemons): tests/keras_check.py (sync Keras, bad input, TF ops,
# async PS on digits). Skips, saying why, when the venv has no TensorFlow.
set -euo pipefail
source "$TEST_SRCDIR/mlfabric/testing/prereq.sh"
require_python tensorflow keras sklearn
root="$TEST_SRCDIR/mlfabric"
export PYTHONPATH="$root/python"
export CHECK_PLANNER=mlfabric
# Every AllReduce through the scheduler's rounds, however small (the
# default sends calls below 64 KiB through MPI; horovod_keras_test and
# python_api_test run with it).
export MLFABRIC_ALLREDUCE_MPI_BELOW=0
out="$TEST_TMPDIR/out.txt"
"$root/tools/run/mlfabric-run" -v -np 3 --ranks_per_host 1 --planner mlfabric --delay_bound 1 \
  "$python" -X faulthandler "$root/tests/keras_check.py" 2>&1 | tee "$out"
[[ $(grep -c "keras_check rank [0-2]: OK" "$out") == 3 ]]
