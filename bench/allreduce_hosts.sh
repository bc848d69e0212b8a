#!/usr/bin/env bash
# AllReduce with a host per rank (one mlfabricd each, emulated on this
# machine) against Open MPI restricted to TCP, alternated in one run so
# that the machine's noise falls on both alike.
#
#   bazel build //api:allreduce_benchmark //tools/run:mlfabric-run
#   bench/allreduce_hosts.sh [--ranks "2 4"] [--counts "1024 16384 ..."] [--pairs 2]
#                            [--repeats 30] [--mlfabric_args "--daemon_arg ..."]
#                            [--baseline OTHER_TREE]
#
# Prints one line per (ranks, float32 count): the mean milliseconds per
# AllReduce of every pair, mlfabric first, and the ratio mlfabric / MPI of
# the pairs' sums. --baseline also runs the same mlfabric command from
# another checkout's bazel-bin (built the same way, e.g. an older commit
# in a git worktree) in every pair, and adds its column and the ratio
# mlfabric / baseline. Counts below the backend's MPI threshold
# (MLFABRIC_ALLREDUCE_MPI_BELOW, 64 KiB by default) are summed by MPI
# under mlfabric too; the script sets the threshold to 0 so that every
# size measures the mlfabric data path.
set -euo pipefail
cd "$(dirname "$0")/.."

ranks="2 4"
counts="1024 16384 262144 1048576 4194304 16777216"
pairs=2
repeats=30
mlfabric_args=""
baseline=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --ranks) ranks="$2"; shift 2 ;;
    --counts) counts="$2"; shift 2 ;;
    --pairs) pairs="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    --mlfabric_args) mlfabric_args="$2"; shift 2 ;;
    --baseline) baseline="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "allreduce_hosts.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

run=bazel-bin/tools/run/mlfabric-run
bench=bazel-bin/api/allreduce_benchmark
binaries=("$run" "$bench")
if [[ -n "$baseline" ]]; then
  binaries+=("$baseline/bazel-bin/tools/run/mlfabric-run" "$baseline/bazel-bin/api/allreduce_benchmark")
fi
for binary in "${binaries[@]}"; do
  if [[ ! -x "$binary" ]]; then
    echo "allreduce_hosts.sh: $binary is not built; run:" >&2
    echo "  bazel build //api:allreduce_benchmark //tools/run:mlfabric-run (in its tree)" >&2
    exit 2
  fi
done

# The mean milliseconds of one run (the benchmark prints "X ms per AllReduce").
mean_ms() {
  local out
  if ! out=$("$@" 2>&1); then
    echo "allreduce_hosts.sh: failed: $*" >&2
    echo "$out" | tail -5 >&2
    exit 1
  fi
  echo "$out" | sed -n 's/.*: \([0-9.]*\) ms per AllReduce.*/\1/p' | tail -1
}

echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')" \
     "load $(cut -d' ' -f1 /proc/loadavg)"
if [[ -n "$baseline" ]]; then
  echo "# baseline: $baseline (commit $(git -C "$baseline" rev-parse --short HEAD 2>/dev/null || echo '?'))"
  printf '%-6s %-10s %-22s %-22s %-22s %-8s %s\n' ranks floats "baseline ms" "mlfabric ms" \
         "mpi-tcp ms" "/mpi" "/baseline"
else
  printf '%-6s %-10s %-28s %-28s %s\n' ranks floats "mlfabric ms (per pair)" "mpi-tcp ms (per pair)" ratio
fi
# Sum of the first list over the sum of the second ("a b -- c d").
ratio_of() {
  printf '%s\n' "$@" | awk '/--/{m=1; next} {if (m) b+=$1; else a+=$1} END {printf "%.2f", a / b}'
}
for n in $ranks; do
  for count in $counts; do
    fabric=() mpi=() base=()
    for ((p = 0; p < pairs; ++p)); do
      if [[ -n "$baseline" ]]; then
        # shellcheck disable=SC2086
        base+=("$(MLFABRIC_ALLREDUCE_MPI_BELOW=0 mean_ms "$baseline/bazel-bin/tools/run/mlfabric-run" \
                    -np "$n" --ranks_per_host 1 $mlfabric_args \
                    "$baseline/bazel-bin/api/allreduce_benchmark" --count="$count" \
                    --repeats="$repeats")")
      fi
      # shellcheck disable=SC2086
      fabric+=("$(MLFABRIC_ALLREDUCE_MPI_BELOW=0 mean_ms "$run" -np "$n" --ranks_per_host 1 \
                  $mlfabric_args "$bench" --count="$count" --repeats="$repeats")")
      mpi+=("$(OMPI_MCA_btl=tcp,self mean_ms "$run" -np "$n" "$bench" --backend=mpi \
                  --count="$count" --repeats="$repeats")")
    done
    to_mpi=$(ratio_of "${fabric[@]}" -- "${mpi[@]}")
    if [[ -n "$baseline" ]]; then
      printf '%-6s %-10s %-22s %-22s %-22s %-8s %s\n' "$n" "$count" "${base[*]}" "${fabric[*]}" \
             "${mpi[*]}" "$to_mpi" "$(ratio_of "${fabric[@]}" -- "${base[@]}")"
    else
      printf '%-6s %-10s %-28s %-28s %s\n' "$n" "$count" "${fabric[*]}" "${mpi[*]}" "$to_mpi"
    fi
  done
done
