#!/usr/bin/env bash
# 4 ranks under mlfabric-run (so under mpirun, with a scheduler and the
# daemons it starts and stops): tests/allreduce_check.cc compares the
# mlfabric and mpi AllReduce backends with MPI_Allreduce, exactly.
# Arguments go to mlfabric-run: with none (its default) the 4 ranks share
# this machine's one daemon and the mlfabric AllReduce sums in shared
# memory; with --ranks_per_host 2 (two emulated hosts of two ranks) on each
# host in shared memory and across the hosts through the scheduler; with
# --ranks_per_host 1 every rank is a host and every sum a scheduler round.
set -euo pipefail
run="$TEST_SRCDIR/mlfabric/tools/run/mlfabric-run"
check="$TEST_SRCDIR/mlfabric/tests/allreduce_check"
out="$TEST_TMPDIR/out.txt"
"$run" -v -np 4 "$@" "$check" 2>&1 | tee "$out"
grep -c "allreduce_check rank [0-3]: OK" "$out" | grep -qx 4
# As many daemons as hosts: one for the machine by default.
case "$*" in
  "") daemons=1;;
  "--ranks_per_host 2") daemons=2;;
  "--ranks_per_host 1") daemons=4;;
  *) echo "allreduce_mpirun_test: unexpected arguments '$*'"; exit 1;;
esac
grep -q "and $daemons mlfabricd; logs in" "$out"
# mlfabric-run stopped what it started: no daemon of this run is left.
dir=$(sed -n 's/.*logs in \(.*\)$/\1/p' "$out" | head -1)
[[ -n "$dir" ]]
if pgrep -f "$dir/h0.sock" >/dev/null; then
  echo "FAIL: a daemon of this run ($dir/h0.sock) still runs after mlfabric-run exited"
  exit 1
fi
echo "mlfabric-run stopped the scheduler and daemons in $dir"

# A rank that returns an error from main while the others wait in a
# collective for it: the job ends (non-zero, the rank's message), no hang in
# MPI_Finalize (exit 124 from timeout would mean one). Once, with a host
# per rank.
if [[ "$*" == "--ranks_per_host 1" ]]; then
  failed="$TEST_TMPDIR/failed_rank.txt"
  set +e
  timeout 120 "$run" -np 2 --ranks_per_host 1 env ALLREDUCE_CHECK_FAIL_RANK=1 "$check" \
    >"$failed" 2>&1
  code=$?
  set -e
  cat "$failed"
  [[ $code -ne 0 && $code -ne 124 ]] || { echo "FAILED: exit $code (124: the job hung)"; exit 1; }
  grep -q "rank 1 of 2 exits with status 3" "$failed"
  if grep -q "passed a collective" "$failed"; then
    echo "FAIL: a rank passed a collective that the failed rank never joined"
    exit 1
  fi
  echo "a rank's error exit stopped the job (mlfabric-run exit $code)"
fi
