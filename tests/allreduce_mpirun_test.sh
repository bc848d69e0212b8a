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
