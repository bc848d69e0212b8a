#!/usr/bin/env bash
# Horovod's collectives (AllReduce, Allgather, Broadcast, Alltoall,
# ReduceScatter) with every rank on this machine, the mlfabric backend (one
# daemon, sums in shared memory) against Open MPI, alternated in one run
# so that the machine's noise falls on both alike.
#
#   bazel build //api:allreduce_benchmark //tools/run:mlfabric-run
#   bench/collectives_one_host.sh [--ranks "2 4"] [--counts "262144 4194304"] [--pairs 2]
#                                 [--repeats 20] [--collectives "allreduce allgather ..."]
#                                 [--json FILE] [--bazel_bin DIR]
#
# Every pair runs `mlfabric-run -np N --ranks_per_host N allreduce_benchmark
# --collective=C` with --backend=mpi, then with the mlfabric backend. Prints
# one line per (collective, ranks, float32 count): the mean milliseconds per
# call of every pair, MPI first, and the ratio mlfabric / MPI of the pairs'
# sums. The count is what allreduce_benchmark's --count says (each rank's
# buffer, its Allgather part, its Alltoall send buffer). --json FILE also
# writes the run as JSON in the structure of
# docs/results/collectives-one-host.json (what, date, commit, command,
# note, the per-pair means of every cell, the target), so that a new run can
# replace that file and `python3 tools/docs/results_tables.py --write`
# renders its table. --bazel_bin DIR runs the binaries of DIR/tools/run and
# DIR/api instead of bazel-bin's (a test's runfiles).
set -euo pipefail
cd "$(dirname "$0")/.."
invocation=("$0" "$@")
prog=collectives_one_host.sh
source bench/bench_lib.sh

ranks="2 4"
counts="262144 4194304"
pairs=2
repeats=20
collectives="allreduce allgather broadcast alltoall reducescatter"
json=""
bazel_bin=bazel-bin
while [[ $# -gt 0 ]]; do
  case "$1" in
    --ranks) ranks="$2"; shift 2 ;;
    --counts) counts="$2"; shift 2 ;;
    --pairs) pairs="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    --collectives) collectives="$2"; shift 2 ;;
    --json) json="$2"; shift 2 ;;
    --bazel_bin) bazel_bin="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "collectives_one_host.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

for value in $ranks $counts $pairs $repeats; do
  if [[ ! "$value" =~ ^[1-9][0-9]*$ ]]; then
    echo "collectives_one_host.sh: '$value' in --ranks, --counts, --pairs or --repeats is not a positive integer" >&2
    exit 2
  fi
done
# The name each prints in "ms per NAME".
declare -A call_name=([allreduce]=AllReduce [allgather]=Allgather [broadcast]=Broadcast
                      [alltoall]=Alltoall [reducescatter]=ReduceScatter)
for collective in $collectives; do
  if [[ -z "${call_name[$collective]:-}" ]]; then
    echo "collectives_one_host.sh: '$collective' in --collectives is not one of: ${!call_name[*]}" >&2
    exit 2
  fi
done
if [[ -n "$json" && ! -d "$(dirname "$json")" ]]; then
  echo "collectives_one_host.sh: --json $json: no directory $(dirname "$json")" >&2
  exit 2
fi

run=$bazel_bin/tools/run/mlfabric-run
bench=$bazel_bin/api/allreduce_benchmark
for binary in "$run" "$bench"; do
  if [[ ! -x "$binary" ]]; then
    echo "collectives_one_host.sh: $binary is not built; run:" >&2
    echo "  bazel build //api:allreduce_benchmark //tools/run:mlfabric-run" >&2
    exit 2
  fi
done


commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
# The goal: no collective slower than this many times Open MPI's from this
# many float32 (1 MiB) on.
target_ratio=2
target_from_count=262144

# The run as docs/results/collectives-one-host.json holds it
# (results_tables.py renders it below §3.1's table).
write_json() {
  echo "{"
  echo "  \"what\": \"Horovod's collectives with every rank on one machine, the mlfabric backend (one daemon, sums in shared memory) against Open MPI, alternated in one run (docs/results.md §3.1)\","
  echo "  \"date\": \"$(date -u +%Y-%m-%d)\","
  echo "  \"commit\": \"$commit\","
  echo "  \"command\": $(json_string "$(measured_command)"),"
  echo "  \"note\": \"Written by bench/collectives_one_host.sh --json: per (collective, ranks, float32 count) the mean milliseconds per call of each pair, both backends under mlfabric-run -np N --ranks_per_host N (Open MPI on its shared-memory transport). count is allreduce_benchmark's --count: each rank's buffer, its part of the Allgather, its Alltoall send buffer, its ReduceScatter input. The Allgather is AllReducer::Allgather on both backends. The table's ratio is the sum of the mlfabric means over the sum of the MPI means, as the script prints it. target is the goal (ratio at most target.ratio from target.from_count floats on), not a measurement.\","
  echo "  \"results\": ["
  local i
  for ((i = 0; i < ${#cells[@]}; ++i)); do
    echo "    ${cells[i]}$( ((i + 1 < ${#cells[@]})) && echo ",")"
  done
  echo "  ],"
  echo "  \"target\": {\"ratio\": $target_ratio, \"from_count\": $target_from_count}"
  echo "}"
}

echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) commit $commit load $(cut -d' ' -f1 /proc/loadavg)"
printf '%-14s %-6s %-10s %-24s %-24s %s\n' collective ranks floats "mpi ms (per pair)" \
       "mlfabric ms (per pair)" ratio
cells=()
for collective in $collectives; do
  for n in $ranks; do
    for count in $counts; do
      mpi=() fabric=()
      for ((p = 0; p < pairs; ++p)); do
        args=(-np "$n" --ranks_per_host "$n" "$bench" --collective="$collective"
              --count="$count" --repeats="$repeats")
        mpi+=("$(mean_ms "${call_name[$collective]}" "$run" "${args[@]}" --backend=mpi)")
        fabric+=("$(mean_ms "${call_name[$collective]}" "$run" "${args[@]}" --backend=mlfabric)")
      done
      printf '%-14s %-6s %-10s %-24s %-24s %s\n' "$collective" "$n" "$count" "${mpi[*]}" \
             "${fabric[*]}" "$(ratio_of "${fabric[@]}" -- "${mpi[@]}")"
      cells+=("{\"collective\": \"$collective\", \"ranks\": $n, \"count\": $count, \"mpi_ms\": [$(join_by ", " "${mpi[@]}")], \"mlfabric_ms\": [$(join_by ", " "${fabric[@]}")]}")
    done
  done
done
if [[ -n "$json" ]]; then
  write_json >"$json.tmp"
  mv "$json.tmp" "$json"
  echo "# wrote $json"
fi
