#!/bin/sh
# netns_agent.sh PREFIX LAYOUT HOST...: prints an Open MPI plm_rsh_agent
# script for network-namespace hosts. mpirun calls `agent ADDRESS
# COMMAND...` as it would ssh; the script maps each HOST's address (from
# LAYOUT, the JSON of `mlfabric-netns layout`) to its namespace PREFIX+HOST
# and runs the command there through netns_enter.sh (beside this file),
# with a host name and a /tmp of its own. Used by
# tests/mlfabric_run_hosts_test.sh, tests/mlfabric_run_elastic_hosts_test.sh
# and python/benchmarks/keras_hosts.sh:
#   testing/netns_agent.sh "$prefix" "$layout" n1 n2 > agent && chmod +x agent
set -eu
prefix=$1 layout=$2
shift 2
enter="$(cd "$(dirname "$0")" && pwd)/netns_enter.sh"
echo '#!/bin/sh'
echo 'host="$1"; shift'
echo 'case "$host" in'
for h in "$@"; do
  address=$(printf '%s' "$layout" | python3 -c \
    'import json, sys; print(json.load(sys.stdin)["hosts"][sys.argv[1]]["address"])' "$h")
  echo "  $address) ns=$prefix$h;;"
done
echo '  *) echo "netns-agent: unknown host $host" >&2; exit 1;;'
echo 'esac'
echo "exec ip netns exec \"\$ns\" unshare --uts \"$enter\" \"\$ns\" \"\$*\""
