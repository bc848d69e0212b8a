#!/usr/bin/env bash
# Keras steps per second across shaped links, mpi against mlfabric
# (docs/results.md §3.3): two network-namespace hosts,
# one rank each, links shaped to --rate_bps, launched by mlfabric-run from
# a third namespace with a hostfile (Open MPI over TCP between the hosts,
# mpi_yield_when_idle 1). Runs python/benchmarks/keras_steps.py in pairs,
# mpi then mlfabric (A B A B: the machine is shared), and prints each
# pair's steps per second and their ratio.
#
#   bazel build //python:runtime //tools/run:mlfabric-run //testing:mlfabric-netns
#   python/benchmarks/keras_hosts.sh [--model digits|mobilenetv2] [--pairs 2] \
#       [--rate_bps 8.9e8] [--straggle 0.10,4] [--env NAME=VALUE]... [--json FILE]
#
# --json FILE also writes the run as its model's entry of FILE, in the
# structure of docs/results/keras-hosts.json (keras_hosts_json.py), so that
# `python3 tools/docs/results_tables.py --write` renders its table.
# --env passes a variable to every rank of the mlfabric runs (for example
# MLFABRIC_ALLREDUCE_MPI_BELOW=0: every AllReduce through the scheduler).
# Needs root (network namespaces) and the venv of tools/bootstrap.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin="$root/bazel-bin"
run="$bin/tools/run/mlfabric-run"
netns="$bin/testing/mlfabric-netns"
python="${MLFABRIC_VENV:-/opt/mlfabric/venv}/bin/python"
invocation=("python/benchmarks/keras_hosts.sh")  # the command measured, without --json
model=digits pairs=2 rate=8.9e8 straggle=0.10,4 json=""
envs=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --model) model=$2; invocation+=("$1" "$2"); shift 2;;
    --pairs) pairs=$2; invocation+=("$1" "$2"); shift 2;;
    --rate_bps) rate=$2; invocation+=("$1" "$2"); shift 2;;
    --straggle) straggle=$2; invocation+=("$1" "$2"); shift 2;;
    --env) envs+=("$2"); invocation+=("$1" "$2"); shift 2;;
    --json) json=$2; shift 2;;
    *) echo "keras_hosts.sh: unknown argument '$1' (see the comment at the top)" >&2; exit 2;;
  esac
done
if [[ -n "$json" && ! -d "$(dirname "$json")" ]]; then
  echo "keras_hosts.sh: --json $json: no directory $(dirname "$json")" >&2
  exit 2
fi
[[ $(id -u) == 0 ]] || { echo "keras_hosts.sh: network namespaces need root" >&2; exit 2; }
for f in "$run" "$netns"; do
  [[ -x $f ]] || { echo "keras_hosts.sh: $f is not built: bazel build //python:runtime //tools/run:mlfabric-run //testing:mlfabric-netns" >&2; exit 2; }
done
prefix="mlk$(( $$ % 1000 ))-"
hosts=sch,n1,n2
work=$(mktemp -d /tmp/keras-hosts-XXXXXX)
"$netns" create --prefix="$prefix" --hosts="$hosts" --rate_bps="$rate" >/dev/null
trap '"$netns" destroy --prefix="$prefix" --hosts="$hosts" >/dev/null 2>&1 || true; rm -rf "$work" /tmp/"$prefix"n[12]' EXIT
layout=$("$netns" layout --prefix="$prefix" --hosts="$hosts")
address() { python3 -c 'import json,sys; print(json.load(sys.stdin)["hosts"][sys.argv[1]]["address"])' "$1" <<<"$layout"; }

# mpirun's "ssh": enter the host's namespace with a host name and /tmp of
# its own (testing/netns_enter.sh says why).
"$root/testing/netns_agent.sh" "$prefix" "$layout" n1 n2 > "$work/agent"
chmod +x "$work/agent"
for h in n1 n2; do echo "$(address $h) slots=1"; done > "$work/hostfile"
mpi=()
for kv in plm_rsh_agent="$work/agent" plm_rsh_no_tree_spawn=1 oob_tcp_if_include=veth0 \
          btl_tcp_if_include=veth0 btl=tcp,self mpi_yield_when_idle=1; do
  mpi+=(--mpirun_arg --mca --mpirun_arg "${kv%%=*}" --mpirun_arg "${kv#*=}")
done

steps() {  # steps BACKEND [NAME=VALUE...]: rank 0's steps per second
  local backend=$1; shift
  local out="$work/$backend.txt"
  ip netns exec "${prefix}sch" env PYTHONPATH="$root/python" "$@" \
    timeout -s INT 900 "$run" --hostfile "$work/hostfile" "${mpi[@]}" -np 2 \
    "$python" "$root/python/benchmarks/keras_steps.py" --backend "$backend" --model "$model" \
    --straggle "$straggle" > "$out" 2>&1 || { cat "$out" >&2; return 1; }
  sed -n 's/.*: \([0-9.]*\) steps\/s.*/\1/p' "$out" | tail -1
}
echo "keras_hosts: model $model, 2 hosts at $rate bit/s, straggle $straggle, mlfabric env: ${envs[*]:-(none)}"
for ((p = 1; p <= pairs; ++p)); do
  a=$(steps mpi)
  b=$(steps mlfabric ${envs[@]+"${envs[@]}"})
  python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); print('pair %s: mpi %.1f, mlfabric %.1f steps/s: %.2fx' % (sys.argv[3], a, b, b / a))" "$a" "$b" "$p"
  echo "$a $b" >> "$work/pairs"
done
if [[ -n "$json" ]]; then
  env_args=()
  for kv in ${envs[@]+"${envs[@]}"}; do env_args+=(--env "$kv"); done
  python3 "$root/python/benchmarks/keras_hosts_json.py" "$json" --model "$model" \
    --rate_bps "$rate" --straggle "$straggle" --pairs "$work/pairs" \
    --command "$(printf '%q ' "${invocation[@]}" | sed 's/ $//')" ${env_args[@]+"${env_args[@]}"}
fi
