#!/usr/bin/env bash
# README example for Keras, examples/train_keras.py, as the README runs it:
# `mlfabric-run -np 4 python3 train_keras.py` (sync DistributedOptimizer on
# scikit-learn's digits) and `--mode async` with 2 ranks (a Python parameter
# server, per-layer pushes). Each must reach its test accuracy. Skips, saying
# why, when the venv has no TensorFlow.
set -euo pipefail
source "$TEST_SRCDIR/mlfabric/testing/prereq.sh"
require_python tensorflow keras sklearn
root="$TEST_SRCDIR/mlfabric"
export PYTHONPATH="$root/python"
# `python3` on PATH is the venv's, as after `source venv/bin/activate`.
export PATH="$(dirname "$python"):$PATH"
out="$TEST_TMPDIR/out.txt"
cd "$root/examples"
timeout 200 "$root/tools/run/mlfabric-run" -np 4 python3 train_keras.py --epochs 8 2>&1 | tee "$out"
[[ $(grep -c "train_keras rank [0-3]: OK" "$out") == 4 ]]
timeout 200 "$root/tools/run/mlfabric-run" -np 2 --delay_bound 4 \
  python3 train_keras.py --mode async --steps 100 2>&1 | tee "$out"
[[ $(grep -c "train_keras rank [0-1]: OK" "$out") == 2 ]]
echo "examples_keras_test: OK"
