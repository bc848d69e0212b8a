#!/usr/bin/env bash
# Runs an MLfabric job on the hosts of an Open MPI hostfile (docs/operations/many-hosts.md):
#
#   examples/many_hosts.sh HOSTFILE NP COMMAND [ARGS...]
#   examples/many_hosts.sh hosts.txt 8 python3 train.py      # hosts.txt: "node1 slots=4" ...
#
# 1. starts mlfabric-scheduler on this machine (the head node);
# 2. on each host of HOSTFILE, for each of its slots, starts one mlfabricd
#    (emulated host h<rank>, Unix socket $DIR/h<rank>.sock) -- over ssh, or
#    directly when the host is this machine; mpirun fills the slots in file
#    order, so rank r finds its daemon at $DIR/h<r>.sock on its own host;
# 3. runs MLFABRIC_SOCKET_DIR=$DIR mlfabric-run -np NP --hostfile HOSTFILE
#    COMMAND, which reuses these daemons instead of starting its own;
# 4. stops every process it started (also on failure or Ctrl-C) and exits
#    with the job's code.
#
# Requirements on a real cluster: passwordless ssh from the head node, the
# same paths on every host (a shared filesystem or the same build), and
# addresses every host can reach: HEAD_ADDR (this machine's, default
# 127.0.0.1) and the hosts' names as written in HOSTFILE. Environment:
#   MLFABRIC_BIN   directory holding scheduler/mlfabric-scheduler,
#                  daemon/mlfabricd, tools/run/mlfabric-run (default bazel-bin)
#   DELAY_BOUND    the job's tau_max (default 30); PLANNER (default mlfabric)
#   SOCKET_DIR     where daemons put sockets and logs (default a new /tmp dir)
set -euo pipefail
if [[ $# -lt 3 ]]; then
  sed -n '2,8p' "$0" >&2
  exit 2
fi
hostfile=$1 np=$2
shift 2
bin=${MLFABRIC_BIN:-bazel-bin}
scheduler="$bin/scheduler/mlfabric-scheduler" daemon="$bin/daemon/mlfabricd"
run="$bin/tools/run/mlfabric-run"
for f in "$scheduler" "$daemon" "$run"; do
  [[ -x $f ]] || { echo "many_hosts.sh: $f is not built (set MLFABRIC_BIN)" >&2; exit 2; }
done
head_addr=${HEAD_ADDR:-127.0.0.1}
delay_bound=${DELAY_BOUND:-30}
dir=${SOCKET_DIR:-$(mktemp -d /tmp/mlfabric-hosts-XXXXXX)}
mkdir -p "$dir"

local_pids=()
remote=()  # "host pid"
cleanup() {
  for entry in "${remote[@]+"${remote[@]}"}"; do
    ssh "${entry% *}" "kill ${entry#* }" 2>/dev/null || true
  done
  for pid in "${local_pids[@]+"${local_pids[@]}"}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${local_pids[@]+"${local_pids[@]}"}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

is_local() {
  [[ $1 == localhost || $1 == 127.0.0.1 || $1 == "$(hostname)" || $1 == "$(hostname -f)" ]]
}

# 1. The scheduler, with the job's bounds. No token or secret ships: the
# job's token is $MLFABRIC_JOB_TOKEN or a random one, and the hosts
# authenticate with a cluster secret made for this run (in $dir, mode 0600,
# read by every daemon: on a shared filesystem, or copied below).
export MLFABRIC_JOB_TOKEN=${MLFABRIC_JOB_TOKEN:-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}
secret="$dir/cluster.secret"
(umask 077; od -An -N32 -tx1 /dev/urandom | tr -d ' \n' > "$secret")
printf '{"planner": "%s", "jobs": [{"name": "%s", "token": "%s", "tau_max": %d}]}\n' \
  "${PLANNER:-mlfabric}" "${MLFABRIC_JOB:-demo}" "$MLFABRIC_JOB_TOKEN" \
  "$delay_bound" > "$dir/scheduler.json"
chmod 600 "$dir/scheduler.json"
"$scheduler" --config="$dir/scheduler.json" --listen_address="$head_addr" --grpc_port=0 \
  --cluster_secret_file="$secret" --port_file="$dir/scheduler.port" > "$dir/scheduler.log" 2>&1 &
local_pids+=($!)
for _ in $(seq 100); do [[ -s $dir/scheduler.port ]] && break; sleep 0.1; done
[[ -s $dir/scheduler.port ]] || { echo "many_hosts.sh: the scheduler did not start; see $dir/scheduler.log" >&2; exit 1; }
address="$head_addr:$(cat "$dir/scheduler.port")"

# 2. One daemon per slot, on the slot's host.
rank=0
while read -r host rest; do
  [[ -z $host || $host == \#* ]] && continue
  slots=$(sed -n 's/.*slots=\([0-9]*\).*/\1/p' <<< "$rest")
  for _ in $(seq "${slots:-1}"); do
    ((rank < np)) || break
    # The data-plane address other hosts reach this daemon at (an IP).
    if is_local "$host"; then
      listen=$head_addr
    else
      listen=$(getent ahostsv4 "$host" | awk 'NR == 1 {print $1}')
      [[ -n $listen ]] || { echo "many_hosts.sh: cannot resolve $host" >&2; exit 2; }
    fi
    args=(--host="h$rank" --scheduler="$address" --listen_address="$listen"
          --local_socket="$dir/h$rank.sock" --cluster_secret_file="$secret")
    if is_local "$host"; then
      "$daemon" "${args[@]}" > "$dir/h$rank.log" 2>&1 &
      local_pids+=($!)
    else
      ssh "$host" "mkdir -p '$dir' && umask 077 && cat > '$secret'" < "$secret"
      pid=$(ssh "$host" "mkdir -p '$dir' && nohup '$daemon' ${args[*]} > '$dir/h$rank.log' 2>&1 < /dev/null & echo \$!")
      remote+=("$host $pid")
    fi
    rank=$((rank + 1))
  done
done < "$hostfile"
((rank == np)) || { echo "many_hosts.sh: $hostfile has $rank slots for $np ranks" >&2; exit 2; }
# Daemons are ready once their sockets exist (on this machine; remote
# ranks wait for theirs: clients retry the connection for 30 s).
for r in $(seq 0 $((np - 1))); do
  for _ in $(seq 100); do [[ -S $dir/h$r.sock ]] && break; sleep 0.1; done
done
echo "many_hosts.sh: scheduler at $address, $np daemons, logs in $dir" >&2

# 3. The job.
code=0
MLFABRIC_SOCKET_DIR=$dir MLFABRIC_SCHEDULER=$address \
  "$run" -np "$np" --hostfile "$hostfile" --delay_bound "$delay_bound" "$@" || code=$?
exit $code
