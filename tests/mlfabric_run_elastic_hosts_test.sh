#!/usr/bin/env bash
# mlfabric-run's elastic mode across hosts (tools/run/elastic.h): three
# network-namespace hosts (the scheduler's, n1, n2), reached as in
# tests/mlfabric_run_hosts_test.sh through an Open MPI plm_rsh_agent that
# enters a host's namespace. The host discovery script lists n1 (2 slots)
# and n2 (1 slot), then drops n2, then lists it again. Every rank is its own
# `mpirun -np 1 --host H` launch and every host gets its own mlfabricd:
# checks that the ranks run in their host's namespace with its daemon's
# socket, that n2's rank and daemon stop when it vanishes, that its return
# starts a daemon again and a rank with the freed number, that every rank
# is a worker of the job (tests/elastic_member.cc registers through its
# host's daemon: the scheduler logs it joining, leaving with its host and
# joining again under its number), that the job ends
# with 0 once its ranks have, and that no daemon, scheduler, launcher or
# socket is left. Needs root (namespaces): prints "SKIPPED: <reason>"
# without, fails under CI.
set -euo pipefail
source "$TEST_SRCDIR/mlfabric/testing/prereq.sh"
root="$TEST_SRCDIR/mlfabric"
netns="$root/testing/mlfabric-netns"
run="$root/tools/run/mlfabric-run"
[[ $(id -u) == 0 ]] || skip_or_fail "network namespaces need root"
prefix="mlre$(( $$ % 10000 ))-"
hosts=sch,n1,n2
probe=$("$netns" probe --prefix="$prefix" 2>&1) || skip_or_fail "network namespaces unusable here: $probe"
"$netns" create --prefix="$prefix" --hosts="$hosts" --rate_bps=1e9 >/dev/null
trap '"$netns" destroy --prefix="$prefix" --hosts="$hosts" >/dev/null 2>&1 || true; rm -rf /tmp/"$prefix"n[12]' EXIT
layout=$("$netns" layout --prefix="$prefix" --hosts="$hosts")
address() { python3 -c 'import json,sys; print(json.load(sys.stdin)["hosts"][sys.argv[1]]["address"])' "$1" <<<"$layout"; }
n1=$(address n1); n2=$(address n2)

# mpirun calls `agent HOST COMMAND...` as it would ssh (as in
# mlfabric_run_hosts_test.sh: the host's namespace, host name and /tmp).
agent="$TEST_TMPDIR/netns-agent"
"$root/testing/netns_agent.sh" "$prefix" "$layout" n1 n2 > "$agent"
chmod +x "$agent"
mpi=(--mpirun_arg --mca --mpirun_arg plm_rsh_agent --mpirun_arg "$agent"
     --mpirun_arg --mca --mpirun_arg plm_rsh_no_tree_spawn --mpirun_arg 1
     --mpirun_arg --mca --mpirun_arg oob_tcp_if_include --mpirun_arg veth0
     --mpirun_arg --mca --mpirun_arg btl_tcp_if_include --mpirun_arg veth0
     --mpirun_arg --mca --mpirun_arg btl --mpirun_arg tcp,self)

work="$TEST_TMPDIR/elastic"
mkdir -p "$work"
printf '#!/bin/sh\ncat %s/hosts\n' "$work" > "$work/discover.sh"
# The discovery script may run at any moment: the list is replaced whole
# (rename), never seen empty or half written.
set_hosts() {
  printf '%s\n' "$1" > "$work/hosts.new"
  mv "$work/hosts.new" "$work/hosts"
}
chmod +x "$work/discover.sh"
# A rank: says where it runs (the namespace's host name) and with which
# daemon, then registers as the job's worker until $work/done exists.
cat > "$work/rank.sh" <<EOF
#!/bin/sh
test -S "\$MLFABRIC_DAEMON_SOCKET" || { echo "rank \$MLFABRIC_RANK: no daemon socket" >&2; exit 9; }
echo "start rank=\$MLFABRIC_RANK size=\$MLFABRIC_SIZE host=\$MLFABRIC_HOSTNAME uts=\$(hostname)" \
  "socket=\$MLFABRIC_DAEMON_SOCKET" >> "$work/ranks.txt"
exec "$root/tests/elastic_member" "$work/done"
EOF
chmod +x "$work/rank.sh"
: > "$work/ranks.txt"

log="$work/run.txt"
wait_for() {  # wait_for FILE PATTERN [COUNT]: 90 s at most, while the launcher runs
  local file=$1 pattern=$2 count=${3:-1}
  for _ in $(seq 900); do
    [[ $(grep -c -- "$pattern" "$file" || true) -ge $count ]] && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "FAILED: no $count line(s) '$pattern' in $file; the launcher said:"; cat "$log"
  echo "ranks:"; cat "$work/ranks.txt"; exit 1
}

set_hosts "$(printf '%s:2\n%s:1' "$n1" "$n2")"
ip netns exec "${prefix}sch" "$run" --host-discovery-script "$work/discover.sh" \
  --min-np 2 --discovery_interval_s 0.5 "${mpi[@]}" "$work/rank.sh" > "$log" 2>&1 &
pid=$!
echo "== n1 (2 slots) and n2 (1 slot)"
wait_for "$log" "host $n2: starting its mlfabricd through mpirun"
wait_for "$log" "host $n2 appeared: starting rank 2 (slot 1 of 1; size 3)"
wait_for "$work/ranks.txt" "start rank=2 size=3 host=$n2 uts=${prefix}n2 socket=/tmp/mlfabric-run-hosts-.*/$n2.sock"
wait_for "$work/ranks.txt" "host=$n1 uts=${prefix}n1" 2
dir=$(sed -n "s/.*socket=\(.*\)\/$n2.sock$/\1/p" "$work/ranks.txt" | head -1)
[[ -n $dir ]] || { echo "FAILED: no run directory in $work/ranks.txt"; exit 1; }
for r in 0 1; do wait_for "$dir/scheduler.log" "job demo: worker rank$r joined on $n1"; done
wait_for "$dir/scheduler.log" "job demo: worker rank2 joined on $n2"
wait_for "$log" "elastic_member rank2: registered on $n2 (size 3)"

echo "== n2 vanishes"
set_hosts "$n1:2"
wait_for "$log" "host $n2 vanished: stopping rank 2"
wait_for "$log" "rank 2 on $n2 exited with .* (stopped)"
wait_for "$log" "host $n2: stopped its mlfabricd"
[[ ! -e $dir/$n2.sock ]] || { echo "FAILED: $n2's daemon socket is left"; cat "$log"; exit 1; }
[[ -e $dir/$n1.sock ]]
wait_for "$dir/scheduler.log" "job demo: worker rank2 left ("

echo "== n2 is back"
set_hosts "$(printf '%s:2\n%s:1' "$n1" "$n2")"
wait_for "$log" "host $n2: starting its mlfabricd through mpirun" 2
wait_for "$log" "host $n2 appeared: starting rank 2 (slot 1 of 1; size 3)" 2
wait_for "$work/ranks.txt" "start rank=2 size=3 host=$n2 uts=${prefix}n2" 2
wait_for "$dir/scheduler.log" "job demo: worker rank2 joined on $n2" 2
grep "job demo: worker" "$dir/scheduler.log"
touch "$work/done"
code=0; wait "$pid" || code=$?
cat "$log"
[[ $code == 0 ]] || { echo "FAILED: the job exited with $code"; exit 1; }
[[ $(grep -c "^start " "$work/ranks.txt") == 4 ]]
grep -q "host $n1: stopped its mlfabricd" "$log"
[[ ! -e $dir ]] || { echo "FAILED: $dir is left after a job that succeeded"; exit 1; }
# This run's processes only (another job's mlfabric-run may be running).
left=$(pgrep -af "$dir|$work/rank.sh" | grep -v pgrep || true)
[[ -z $left ]] || { echo "FAILED: left running: $left"; exit 1; }
echo "mlfabric-run elastic: n2's rank and daemon followed its discovery"
