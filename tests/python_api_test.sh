#!/usr/bin/env bash
# 2 Python ranks under mlfabric-run (mpirun + scheduler with jobs "demo" and
# "other" + 2 daemons): tests/python_api_check.py (Python servers with
# callbacks, multi-tensor pushes with priorities, bad input, replicas).
# Then: an uncaught exception ends the job; cross_rank / cross_size on 3
# ranks, on one host and with two hosts' local ranks (both backends).
# Skips, saying why, when the venv has no TensorFlow.
set -euo pipefail
source "$TEST_SRCDIR/mlfabric/testing/prereq.sh"
require_python tensorflow numpy
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

# Horovod's cross_rank / cross_size from the launcher's local ranks: on one
# host (mlfabric-run's default) 0 and 1 on every rank; with the local ranks
# of two hosts of different sizes (ranks 0 and 1 on one, rank 2 alone on
# the other, set here as a hostfile launch would), the ranks of local rank 0
# are {0, 2} and of local rank 1 {1}. Both backends; the TensorFlow and
# Keras modules' functions (the package's own, re-exported) are compared
# with the mlfabric backend only: importing TensorFlow costs each rank about
# 8 CPU-s, and the backend does not change what they re-export.
cross="$TEST_TMPDIR/cross.txt"
check_cross='
import os, sys, mlfabric
mlfabric.init()
r = mlfabric.rank()
want = {"one": (0, 1), "two": {0: (0, 2), 1: (0, 1), 2: (1, 2)}[r]}[sys.argv[1]]
got = (mlfabric.cross_rank(), mlfabric.cross_size())
same = True
if sys.argv[2] == "modules":
    import mlfabric.tensorflow as mtf, mlfabric.keras as mk
    same = got == (mtf.cross_rank(), mtf.cross_size()) == (mk.cross_rank(), mk.cross_size())
print("cross rank %d %s: %s %s" % (r, sys.argv[1], got, "OK" if got == want and same else
      "FAILED, expected %s" % (want,)), flush=True)
'
for backend in mpi mlfabric; do
  modules=core
  [[ $backend == mlfabric ]] && modules=modules
  timeout 120 env MLFABRIC_ALLREDUCE_BACKEND=$backend "$root/tools/run/mlfabric-run" -np 3 \
    "$python" -c "$check_cross" one $modules 2>&1 | tee "$cross"
  [[ $(grep -c "cross rank [0-2] one: (0, 1) OK" "$cross") == 3 ]]
  timeout 120 env MLFABRIC_ALLREDUCE_BACKEND=$backend "$root/tools/run/mlfabric-run" -np 3 \
    bash -c 'if [[ $MLFABRIC_RANK == 2 ]]; then export MLFABRIC_LOCAL_RANK=0 MLFABRIC_LOCAL_SIZE=1
             else export MLFABRIC_LOCAL_RANK=$MLFABRIC_RANK MLFABRIC_LOCAL_SIZE=2; fi
             exec "$@"' cross "$python" -c "$check_cross" two $modules 2>&1 | tee "$cross"
  [[ $(grep -c "cross rank [0-2] two: ([01], [12]) OK" "$cross") == 3 ]]
done
echo "python_api_test: cross_rank and cross_size as Horovod's"
