#!/usr/bin/env bash
# mlfabric-run across hosts: three network-namespace hosts
# with distinct addresses, two slots each, the scheduler and mpirun in a
# fourth namespace. Open MPI's plm_rsh_agent is a wrapper that enters the
# host's namespace (as ssh would log in to it); mlfabric-run starts one
# mlfabricd per host through mpirun itself. Runs a 6-rank AllReduce check
# (tests/allreduce_check.cc: ranks of one host sum in shared memory, hosts
# through the scheduler) and the async parameter-server example
# (examples/cpp_worker.cc), then checks that no daemon, scheduler or socket
# of either run is left. A rank that fails is the third run: its job ends
# with the rank's code and everything is stopped all the same.
# Needs root (namespaces): prints "SKIPPED: <reason>" without, fails under CI.
set -euo pipefail
source "$TEST_SRCDIR/mlfabric/testing/prereq.sh"
root="$TEST_SRCDIR/mlfabric"
netns="$root/testing/mlfabric-netns"
run="$root/tools/run/mlfabric-run"
[[ $(id -u) == 0 ]] || skip_or_fail "network namespaces need root"
prefix="mlrh$(( $$ % 10000 ))-"
hosts=sch,n1,n2,n3
probe=$("$netns" probe --prefix="$prefix" 2>&1) || skip_or_fail "network namespaces unusable here: $probe"
"$netns" create --prefix="$prefix" --hosts="$hosts" --rate_bps=1e9 >/dev/null
trap '"$netns" destroy --prefix="$prefix" --hosts="$hosts" >/dev/null 2>&1 || true; rm -rf /tmp/"$prefix"n[123]' EXIT
layout=$("$netns" layout --prefix="$prefix" --hosts="$hosts")
address() { python3 -c 'import json,sys; print(json.load(sys.stdin)["hosts"][sys.argv[1]]["address"])' "$1" <<<"$layout"; }

# mpirun calls `agent HOST COMMAND...` as it would ssh. The command runs
# in the host's network namespace and, as on a machine of its own, with its
# own host name (a UTS namespace) and temporary directory
# (testing/netns_enter.sh).
agent="$TEST_TMPDIR/netns-agent"
"$root/testing/netns_agent.sh" "$prefix" "$layout" n1 n2 n3 > "$agent"
chmod +x "$agent"
hostfile="$TEST_TMPDIR/hostfile"
for h in n1 n2 n3; do echo "$(address $h) slots=2"; done > "$hostfile"

# With a hostfile Open MPI places the ranks: --ranks_per_host is refused.
set +e
refused=$("$run" -np 2 --hostfile "$hostfile" --ranks_per_host 2 true 2>&1)
code=$?
set -e
[[ $code == 2 && "$refused" == *"with --hostfile, Open MPI places them"* ]] ||
  { echo "--ranks_per_host with --hostfile: exit $code: $refused"; exit 1; }

# All "hosts" are one machine here: Open MPI's shared-memory transport
# would see one host name and one /dev/shm across namespaces, so ranks
# talk TCP over the namespaces' links, as on separate machines.
mpi=(--mpirun_arg --mca --mpirun_arg plm_rsh_agent --mpirun_arg "$agent"
     --mpirun_arg --mca --mpirun_arg plm_rsh_no_tree_spawn --mpirun_arg 1
     --mpirun_arg --mca --mpirun_arg oob_tcp_if_include --mpirun_arg veth0
     --mpirun_arg --mca --mpirun_arg btl_tcp_if_include --mpirun_arg veth0
     --mpirun_arg --mca --mpirun_arg btl --mpirun_arg tcp,self)
launch() {  # launch OUT ARGS...: mlfabric-run in the scheduler's namespace
  local out=$1; shift
  timeout -s INT 240 ip netns exec "${prefix}sch" "$run" -v --hostfile "$hostfile" "${mpi[@]}" \
    "$@" > "$out" 2>&1 || echo "exit $?" >> "$out"
  cat "$out"
}
left() { pgrep -f "mlfabric-run-hosts" || true; }

echo "== 6-rank AllReduce across 3 hosts"
launch "$TEST_TMPDIR/allreduce.txt" -np 6 "$root/tests/allreduce_check"
[[ $(grep -c "allreduce_check rank [0-5]: OK" "$TEST_TMPDIR/allreduce.txt") == 6 ]]
grep -q "one mlfabricd on each of $(address n1), $(address n2), $(address n3)" "$TEST_TMPDIR/allreduce.txt"
[[ -z $(left) ]] || { echo "left running:"; left; exit 1; }

echo "== async parameter server, 6 workers across 3 hosts"
launch "$TEST_TMPDIR/ps.txt" -np 6 "$root/examples/cpp_worker"
grep -q "6 workers x 30 pushes: applied 180, dropped 0, failed 0" "$TEST_TMPDIR/ps.txt"
[[ $(grep -c "cpp_worker rank [0-5]: OK" "$TEST_TMPDIR/ps.txt") == 6 ]]
[[ -z $(left) ]] || { echo "left running:"; left; exit 1; }

echo "== a rank that fails: the job ends with its code, nothing is left"
launch "$TEST_TMPDIR/fail.txt" -np 3 /bin/sh -c 'test "$OMPI_COMM_WORLD_RANK" != 1 || exit 7; sleep 30'
grep -q "the job exited with 7; logs in /tmp/mlfabric-run-hosts-" "$TEST_TMPDIR/fail.txt"
[[ -z $(left) ]] || { echo "left running:"; left; exit 1; }
# A failed job keeps its logs (the scheduler's, each host's daemon's).
logs=$(sed -n 's/.*the job exited with 7; logs in \(.*\)$/\1/p' "$TEST_TMPDIR/fail.txt")
[[ -s $logs/scheduler.log && -n $(ls "$logs"/*.log) ]]
rm -rf "$logs"
echo "mlfabric-run started and stopped a daemon per host for every job"
