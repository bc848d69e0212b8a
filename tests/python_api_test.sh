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
timeout 280 "$root/tools/run/mlfabric-run" -v -np 2 --ranks_per_host 1 --extra_job other:other-token \
  --divergence_bound 1000 \
  "$python" -X faulthandler "$root/tests/python_api_check.py" 2>&1 | tee "$out"
[[ $(grep -c "python_api_check rank [0-1]: OK" "$out") == 2 ]]

# A rank that raises an exception nobody catches ends the whole job, with a
# non-zero status, instead of leaving the other rank waiting in its next
# collective (and the job hanging in MPI_Finalize).
raised="$TEST_TMPDIR/raised.txt"
set +e
timeout 120 "$root/tools/run/mlfabric-run" -np 2 "$python" -c '
import mlfabric, numpy as np
mlfabric.init(backend="mpi")
if mlfabric.rank() == 1:
    raise KeyError("rank 1 fails")
mlfabric.allreduce(np.zeros(1, np.float32))
print("rank 0 should not get here", flush=True)
' > "$raised" 2>&1
code=$?
set -e
cat "$raised"
# mlfabric-run keeps a failed job's logs; this failure was the point.
kept=$(sed -n 's/.*logs in \(\/tmp\/mlfabric-cluster-[A-Za-z0-9]*\).*/\1/p' "$raised" | tail -1)
[[ -n "$kept" ]] && rm -rf "$kept"
[[ $code -ne 0 && $code -ne 124 ]] || { echo "FAILED: exit $code (124: the job hung)"; exit 1; }
grep -q "rank 1 of 2 ends on an uncaught KeyError" "$raised"
if grep -q "rank 0 should not get here" "$raised"; then
  echo "FAIL: rank 0 finished an allreduce that rank 1 never joined"
  exit 1
fi
echo "python_api_test: an uncaught exception ended the job (exit $code)"
