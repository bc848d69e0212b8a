#!/usr/bin/env bash
# A Keras model trained over a server group of 2 shards ends with the same
# weights as over one server: tests/keras_shards_check.py in 3
# ranks under mlfabric-run, each on an emulated host of its own. Skips, saying why, when the venv has no TensorFlow.
set -euo pipefail
source "$TEST_SRCDIR/mlfabric/testing/prereq.sh"
require_python tensorflow keras
root="$TEST_SRCDIR/mlfabric"
export PYTHONPATH="$root/python"
out="$TEST_TMPDIR/out.txt"
"$root/tools/run/mlfabric-run" -np 3 --ranks_per_host 1 --planner mlfabric \
  "$python" -X faulthandler "$root/tests/keras_shards_check.py" 2>&1 | tee "$out"
[[ $(grep -c "keras_shards_check rank [0-2]: OK" "$out") == 3 ]]
