#!/usr/bin/env bash
# The monitor reads a real htb class's ceil on a shaped veth inside a
# network namespace. Needs root and namespaces; otherwise prints SKIPPED.
set -uo pipefail
probe="$PWD/monitor/tc_capacity_probe"
ns="mlf-tc-$$"
source "$TEST_SRCDIR/mlfabric/testing/prereq.sh"
if ! ip netns add "$ns" 2>/dev/null; then
  skip_or_fail "cannot create a network namespace (needs root and CAP_SYS_ADMIN)"
fi
trap 'ip netns del "$ns" 2>/dev/null' EXIT
set -e
ip -n "$ns" link add v0 type veth peer name v1
ip netns exec "$ns" tc qdisc add dev v0 root handle 1: htb default 10
ip netns exec "$ns" tc class add dev v0 parent 1: classid 1:10 htb rate 50mbit ceil 80mbit 2>/dev/null
got=$(ip netns exec "$ns" "$probe" v0 1:10)
echo "ceil of 1:10 read by the monitor: $got bps"
test "$got" = "80000000"
ip netns exec "$ns" tc class change dev v0 parent 1: classid 1:10 htb rate 50mbit ceil 20mbit 2>/dev/null
got=$(ip netns exec "$ns" "$probe" v0 1:10)
echo "after reshaping: $got bps"
test "$got" = "20000000"
if ip netns exec "$ns" "$probe" v0 1:99 2>/dev/null; then echo "a missing class must fail"; exit 1; fi
echo "tc_capacity_netns_test: ok"
