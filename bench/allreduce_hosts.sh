#!/usr/bin/env bash
# AllReduce with a host per rank (one mlfabricd each, emulated on this
# machine) against Open MPI restricted to TCP, alternated in one run so
# that the machine's noise falls on both alike.
#
#   bazel build //api:allreduce_benchmark //tools/run:mlfabric-run
#   bench/allreduce_hosts.sh [--ranks "2 4"] [--counts "1024 16384 ..."] [--pairs 2]
#                            [--repeats 30] [--mlfabric_args "--daemon_arg ..."]
#                            [--baseline OTHER_TREE | --baseline_args "ARGS"]
#                            [--json FILE] [--bazel_bin DIR]
#                            [--collective allreduce|alltoall|reducescatter|broadcast|allgather]
#                            [--op sum|min|max]
#
# Prints one line per (ranks, float32 count): the mean milliseconds per
# AllReduce of every pair, mlfabric first, and the ratio mlfabric / MPI of
# the pairs' sums. --json FILE also writes the run as JSON in the structure
# of docs/results/allreduce-hosts.json (what, date, commit, command, note,
# the per-pair means of every cell, the target ratios of the sizes that
# have one), so that a new run can replace that file and
# `python3 tools/docs/results_tables.py --write` renders its table. --baseline also runs the same mlfabric command from
# another checkout's bazel-bin (built the same way, e.g. an older commit
# in a git worktree) in every pair, and adds its column and the ratio
# mlfabric / baseline. --baseline_args instead makes the baseline this
# tree's mlfabric command with ARGS added to its mlfabric-run flags (e.g.
# "--scheduler_arg --round_grants=false"). Counts below the backend's MPI threshold
# (MLFABRIC_ALLREDUCE_MPI_BELOW, 64 KiB by default) are summed by MPI
# under mlfabric too; the script sets the threshold to 0 so that every
# size measures the mlfabric data path. --bazel_bin DIR runs the binaries
# of DIR/tools/run and DIR/api instead of bazel-bin's (a test's runfiles).
# --collective times another of allreduce_benchmark's collectives the same
# way (its --count is each rank's buffer; an Alltoall's send buffer), and
# writes it as the JSON's "collective"; the default is allreduce.
# --op min|max times AllReduce or ReduceScatter under that reduce op
# (between hosts, exchanges of blocks; written as the JSON's "op").
set -euo pipefail
cd "$(dirname "$0")/.."
invocation=("$0" "$@")
prog=allreduce_hosts.sh
source bench/bench_lib.sh

ranks="2 4"
counts="1024 16384 262144 1048576 4194304 16777216"
pairs=2
repeats=30
mlfabric_args=""
baseline=""
baseline_args=""
json=""
bazel_bin=bazel-bin
collective=allreduce
op=sum
while [[ $# -gt 0 ]]; do
  case "$1" in
    --ranks) ranks="$2"; shift 2 ;;
    --counts) counts="$2"; shift 2 ;;
    --pairs) pairs="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    --mlfabric_args) mlfabric_args="$2"; shift 2 ;;
    --baseline) baseline="$2"; shift 2 ;;
    --baseline_args) baseline_args="$2"; shift 2 ;;
    --json) json="$2"; shift 2 ;;
    --bazel_bin) bazel_bin="$2"; shift 2 ;;
    --collective) collective="$2"; shift 2 ;;
    --op) op="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "allreduce_hosts.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

for value in $ranks $counts $pairs $repeats; do
  if [[ ! "$value" =~ ^[1-9][0-9]*$ ]]; then
    echo "allreduce_hosts.sh: '$value' in --ranks, --counts, --pairs or --repeats is not a positive integer" >&2
    exit 2
  fi
done
# The name allreduce_benchmark prints in "ms per NAME".
declare -A call_name=([allreduce]=AllReduce [allgather]=Allgather [broadcast]=Broadcast
                      [alltoall]=Alltoall [reducescatter]=ReduceScatter)
if [[ -z "${call_name[$collective]:-}" ]]; then
  echo "allreduce_hosts.sh: --collective '$collective' is not one of: ${!call_name[*]}" >&2
  exit 2
fi
call=${call_name[$collective]}
case "$op" in
  sum) ;;
  min|max)
    if [[ $collective != allreduce && $collective != reducescatter ]]; then
      echo "allreduce_hosts.sh: --op $op applies to allreduce and reducescatter, not $collective" >&2
      exit 2
    fi ;;
  *) echo "allreduce_hosts.sh: --op '$op' is not one of: sum min max" >&2; exit 2 ;;
esac
if [[ -n "$json" && ! -d "$(dirname "$json")" ]]; then
  echo "allreduce_hosts.sh: --json $json: no directory $(dirname "$json")" >&2
  exit 2
fi

run=$bazel_bin/tools/run/mlfabric-run
bench=$bazel_bin/api/allreduce_benchmark
binaries=("$run" "$bench")
if [[ -n "$baseline" && -n "$baseline_args" ]]; then
  echo "allreduce_hosts.sh: give --baseline or --baseline_args, not both" >&2
  exit 2
fi
# The baseline arm: another tree's binaries, or this tree's with more flags.
base_run="" base_bench="" base_what=""
if [[ -n "$baseline" ]]; then
  base_run=$baseline/bazel-bin/tools/run/mlfabric-run
  base_bench=$baseline/bazel-bin/api/allreduce_benchmark
  base_what="the same mlfabric command from the tree $baseline"
  binaries+=("$base_run" "$base_bench")
elif [[ -n "$baseline_args" ]]; then
  base_run=$bazel_bin/tools/run/mlfabric-run
  base_bench=$bazel_bin/api/allreduce_benchmark
  base_what="the same mlfabric command with $baseline_args"
fi
for binary in "${binaries[@]}"; do
  if [[ ! -x "$binary" ]]; then
    echo "allreduce_hosts.sh: $binary is not built; run:" >&2
    echo "  bazel build //api:allreduce_benchmark //tools/run:mlfabric-run (in its tree)" >&2
    exit 2
  fi
done


commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)

echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) commit $commit" \
     "load $(cut -d' ' -f1 /proc/loadavg)"
if [[ -n "$base_run" ]]; then
  if [[ -n "$baseline" ]]; then
    echo "# baseline: $baseline (commit $(git -C "$baseline" rev-parse --short HEAD 2>/dev/null || echo '?'))"
  else
    echo "# baseline: mlfabric-run $baseline_args"
  fi
  printf '%-6s %-10s %-22s %-22s %-22s %-8s %s\n' ranks floats "baseline ms" "mlfabric ms" \
         "mpi-tcp ms" "/mpi" "/baseline"
else
  printf '%-6s %-10s %-28s %-28s %s\n' ranks floats "mlfabric ms (per pair)" "mpi-tcp ms (per pair)" ratio
fi
# The goal mlfabric / MPI over TCP per float32 count (docs/results.md §3.2);
# sizes without one get no target.
declare -A target_ratio=([65536]=3 [1048576]=2 [16777216]=1.5)
[[ $collective == allreduce && $op == sum ]] || target_ratio=()  # the targets are AllReduce's
# The run as docs/results/allreduce-hosts.json holds it (results_tables.py
# renders §3.2 from it).
write_json() {
  local targets=() count
  for count in $counts; do
    if [[ -n "${target_ratio[$count]:-}" ]]; then
      targets+=("\"$count\": ${target_ratio[$count]}")
    fi
  done
  echo "{"
  echo "  \"what\": \"$call with a daemon per rank (emulated hosts over loopback TCP) against Open MPI restricted to TCP, alternated in one run (docs/results.md §3.2)\","
  echo "  \"date\": \"$(date -u +%Y-%m-%d)\","
  echo "  \"commit\": \"$commit\","
  echo "  \"command\": $(json_string "$(measured_command)"),"
  echo "  \"note\": \"Written by bench/allreduce_hosts.sh --json: per (ranks, float32 count) the mean milliseconds per $call of each pair, mlfabric with --ranks_per_host 1 and Open MPI with OMPI_MCA_btl=tcp,self$([[ -n "$base_run" ]] && echo ", and baseline_ms $base_what"). The table's ratio is the sum of the mlfabric means over the sum of the MPI means, as the script prints it. target_ratio is the goal per size, not a measurement.\","
  if [[ -n "$baseline" ]]; then
    echo "  \"baseline_commit\": \"$(git -C "$baseline" rev-parse --short HEAD 2>/dev/null || echo unknown)\","
  fi
  echo "  \"results\": ["
  local i
  for ((i = 0; i < ${#cells[@]}; ++i)); do
    echo "    ${cells[i]}$( ((i + 1 < ${#cells[@]})) && echo ",")"
  done
  echo "  ],"
  echo "  \"target_ratio\": {$(join_by ", " "${targets[@]}")}"
  echo "}"
}
cells=()
for n in $ranks; do
  for count in $counts; do
    fabric=() mpi=() base=()
    for ((p = 0; p < pairs; ++p)); do
      if [[ -n "$base_run" ]]; then
        # shellcheck disable=SC2086
        base+=("$(MLFABRIC_ALLREDUCE_MPI_BELOW=0 mean_ms "$call" "$base_run" \
                    -np "$n" --ranks_per_host 1 $mlfabric_args $baseline_args \
                    "$base_bench" --collective="$collective" --op="$op" --count="$count" \
                    --repeats="$repeats")")
      fi
      # shellcheck disable=SC2086
      fabric+=("$(MLFABRIC_ALLREDUCE_MPI_BELOW=0 mean_ms "$call" "$run" -np "$n" --ranks_per_host 1 \
                  $mlfabric_args "$bench" --collective="$collective" --op="$op" --count="$count" \
                  --repeats="$repeats")")
      mpi+=("$(OMPI_MCA_btl=tcp,self mean_ms "$call" "$run" -np "$n" "$bench" --backend=mpi \
                  --collective="$collective" --op="$op" --count="$count" --repeats="$repeats")")
    done
    to_mpi=$(ratio_of "${fabric[@]}" -- "${mpi[@]}")
    if [[ -n "$base_run" ]]; then
      printf '%-6s %-10s %-22s %-22s %-22s %-8s %s\n' "$n" "$count" "${base[*]}" "${fabric[*]}" \
             "${mpi[*]}" "$to_mpi" "$(ratio_of "${fabric[@]}" -- "${base[@]}")"
    else
      printf '%-6s %-10s %-28s %-28s %s\n' "$n" "$count" "${fabric[*]}" "${mpi[*]}" "$to_mpi"
    fi
    cell="{"
    [[ $collective == allreduce && $op == sum ]] || cell+="\"collective\": \"$collective\", "
    [[ $op == sum ]] || cell+="\"op\": \"$op\", "
    cell+="\"ranks\": $n, \"count\": $count, \"mlfabric_ms\": [$(join_by ", " "${fabric[@]}")],"
    cell+=" \"mpi_tcp_ms\": [$(join_by ", " "${mpi[@]}")]"
    if [[ -n "$base_run" ]]; then
      cell+=", \"baseline_ms\": [$(join_by ", " "${base[@]}")]"
    fi
    cells+=("$cell}")
  done
done
if [[ -n "$json" ]]; then
  write_json >"$json.tmp"
  mv "$json.tmp" "$json"
  echo "# wrote $json"
fi
