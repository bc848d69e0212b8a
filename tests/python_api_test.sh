#!/usr/bin/env bash
# 2 Python ranks under mlfabric-run (mpirun + scheduler with jobs "demo" and
# "other" + 2 daemons): tests/python_api_check.py (Python servers with
# callbacks, multi-tensor pushes with priorities, bad input, replicas).
# Skips, saying why, when the venv has no TensorFlow.
set -euo pipefail
source "$TEST_SRCDIR/mlfabric/testing/prereq.sh"
python="${MLFABRIC_VENV:-/opt/mlfabric/venv}/bin/python"
if ! "$python" -c "import tensorflow, numpy" >/dev/null 2>&1; then
  skip_or_fail "$python cannot import tensorflow/numpy; run tools/bootstrap"
fi
root="$TEST_SRCDIR/mlfabric"
export PYTHONPATH="$root/python"
out="$TEST_TMPDIR/out.txt"
timeout 280 "$root/tools/run/mlfabric-run" -v -np 2 --extra_job other:other-token \
  --divergence_bound 1000 \
  "$python" -X faulthandler "$root/tests/python_api_check.py" 2>&1 | tee "$out"
[[ $(grep -c "python_api_check rank [0-1]: OK" "$out") == 2 ]]
