#!/bin/sh
# netns_enter.sh NAMESPACE COMMAND-LINE: what an Open MPI plm_rsh_agent
# wrapper runs inside a host's network namespace (after `ip netns exec NS
# unshare --uts`): the command line gets a host name and a /tmp of its own,
# as on a machine of its own. Sharing both made Open MPI's launch hang in
# about 1 job of 4 (the daemons' and the job's ORTE daemons on "one" host
# name in one /tmp). The agents testing/netns_agent.sh writes run it.
ns="$1"; shift
hostname "$ns"
TMPDIR="/tmp/$ns"
mkdir -p "$TMPDIR"
export TMPDIR
exec /bin/sh -c "$*"
