#!/usr/bin/env bash
# Data between parts of one host never crosses a socket (daemon/README.md
# "Same host, no socket"): two ranks, a host each, run
# tests/allreduce_check.cc (exact sums against MPI_Allreduce); then the
# daemons' own counters, from the lines they log as they stop, say that
# the root rank read round sums on its own host (h0) without a data
# session, that every get buffer a daemon lent to its rank came back, and
# that the push buffers a rank sent again were not mapped again.
set -euo pipefail
run="$TEST_SRCDIR/mlfabric/tools/run/mlfabric-run"
check="$TEST_SRCDIR/mlfabric/tests/allreduce_check"
out="$TEST_TMPDIR/out.txt"
MLFABRIC_KEEP_CLUSTER_DIR=1 "$run" -v -np 2 --ranks_per_host 1 "$check" 2>&1 | tee "$out"
if [[ $(grep -c "allreduce_check rank [0-1]: OK" "$out") -ne 2 ]]; then
  echo "FAIL: not both ranks summed exactly"
  exit 1
fi
dir=$(sed -n 's/^cluster: kept \(.*\)$/\1/p' "$out" | head -1)
if [[ -z "$dir" || ! -f "$dir/h0.log" || ! -f "$dir/h1.log" ]]; then
  echo "FAIL: no kept cluster directory with both daemons' logs in the output"
  exit 1
fi
trap 'rm -rf "$dir"' EXIT
# "... round sums read here (B B); get buffers lent L, given back G"
field() {  # field HOST PATTERN: the first number after PATTERN in HOST's stop line
  grep "stopped: pushes" "$dir/$1.log" | sed -n "s/.*$2 \([0-9]*\).*/\1/p" | head -1
}
for host in h0 h1; do
  if ! grep -q "stopped: pushes" "$dir/$host.log"; then
    echo "FAIL: $host's daemon logged no stop line"
    exit 1
  fi
  grep "stopped: pushes" "$dir/$host.log"
done
local_h0=$(grep "stopped: pushes" "$dir/h0.log" | sed -n 's/.* \([0-9]*\) round sums read here.*/\1/p')
echo "h0: $local_h0 round sums read on the host"
# Rank 0 runs the default root: its gets of every round of it are read on
# h0. (allreduce_check also runs a root per rank, so h1 reads some too.)
if [[ -z "$local_h0" || "$local_h0" -lt 1 ]]; then
  echo "FAIL: h0's rank read no round sum without a socket (${local_h0:-none})"
  exit 1
fi
for host in h0 h1; do
  lent=$(field "$host" "get buffers lent")
  back=$(field "$host" "given back")
  echo "$host: get buffers lent $lent, given back $back"
  if [[ -z "$lent" || "$lent" -lt 1 || "$lent" != "$back" ]]; then
    echo "FAIL: $host lent $lent get buffers and got $back back"
    exit 1
  fi
done
# "...; push buffers mapped N, reused M": a rank refills the push buffers
# its daemon released, and the daemon finds their mappings.
for host in h0 h1; do
  mapped=$(field "$host" "push buffers mapped")
  reused=$(field "$host" "reused")
  echo "$host: push buffers mapped $mapped, reused $reused"
  if [[ -z "$reused" || "$reused" -lt 1 ]]; then
    echo "FAIL: $host mapped every push buffer afresh (mapped $mapped, reused ${reused:-none})"
    exit 1
  fi
done
echo "same-host data: OK"
