#!/usr/bin/env bash
# 4 ranks under mlfabric-run (so under mpirun, with a scheduler and 4 daemons
# it starts and stops): tests/allreduce_check.cc compares the mlfabric and
# mpi AllReduce backends with MPI_Allreduce, exactly.
# Arguments go to mlfabric-run: with --ranks_per_host 2 (two hosts of two
# ranks) the mlfabric AllReduce sums on each host in shared memory and
# across the hosts through the scheduler; with 4, on one host only.
set -euo pipefail
run="$TEST_SRCDIR/mlfabric/tools/run/mlfabric-run"
check="$TEST_SRCDIR/mlfabric/tests/allreduce_check"
out="$TEST_TMPDIR/out.txt"
"$run" -v -np 4 "$@" "$check" 2>&1 | tee "$out"
grep -c "allreduce_check rank [0-3]: OK" "$out" | grep -qx 4
# mlfabric-run stopped what it started: no daemon of this run is left.
dir=$(sed -n 's/.*logs in \(.*\)$/\1/p' "$out" | head -1)
[[ -n "$dir" ]]
! pgrep -f "$dir/h0.sock" >/dev/null
echo "mlfabric-run stopped the scheduler and daemons in $dir"

# A rank that returns an error from main while the others wait in a
# collective for it: the job ends (non-zero, the rank's message), no hang in
# MPI_Finalize (exit 124 from timeout would mean one). Once, in the plain run.
if [[ $# -eq 0 ]]; then
  failed="$TEST_TMPDIR/failed_rank.txt"
  set +e
  timeout 120 "$run" -np 2 env ALLREDUCE_CHECK_FAIL_RANK=1 "$check" >"$failed" 2>&1
  code=$?
  set -e
  cat "$failed"
  [[ $code -ne 0 && $code -ne 124 ]] || { echo "FAILED: exit $code (124: the job hung)"; exit 1; }
  grep -q "rank 1 of 2 exits with status 3" "$failed"
  ! grep -q "passed a collective" "$failed"
  echo "a rank's error exit stopped the job (mlfabric-run exit $code)"
fi
