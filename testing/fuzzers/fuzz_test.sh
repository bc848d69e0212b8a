#!/usr/bin/env bash
# Fuzzes every target (//testing/fuzzers: the packet parser, the planner JSON
# contract and both planners, the scheduler's config loader, the admin
# request handling, the local IPC framing, the scheduler's control-plane
# handlers and a daemon's data sessions) with libFuzzer for a short time
# each, seeded by their committed corpora. The fuzzers are built by the asan
# build, which tools/test runs it in:
#   bazel test --config=asan //testing/fuzzers:fuzz_test
# Arguments: NAME=BINARY=CORPUS_DIR (CORPUS_DIR may be empty) per target;
# --not-libfuzzer first when the build linked no libFuzzer (any build but
# --config=asan), which fails with that command.
set -euo pipefail
if [[ "${1:-}" == --not-libfuzzer ]]; then
  echo "fuzz_test: these fuzzers were built without libFuzzer; it runs in the asan build:" >&2
  echo "  bazel test --config=asan //testing/fuzzers:fuzz_test   (tools/test does)" >&2
  exit 1
fi
artifacts="${TEST_UNDECLARED_OUTPUTS_DIR:-${TEST_TMPDIR:-/tmp}}"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
# Bazel's test sharding (shard_count in BUILD): this shard fuzzes every
# TEST_TOTAL_SHARDS-th target, so the shards run side by side.
shard=${TEST_SHARD_INDEX:-0}
shards=${TEST_TOTAL_SHARDS:-1}
[[ -n "${TEST_SHARD_STATUS_FILE:-}" ]] && touch "$TEST_SHARD_STATUS_FILE"
index=0
for spec in "$@"; do
  (( index++ % shards == shard )) || continue
  name=${spec%%=*}
  rest=${spec#*=}
  binary=${rest%%=*}
  corpus=${rest#*=}
  # New inputs go to a copy: the committed corpus stays as it is.
  work="$tmp/corpus-$name"
  rm -rf "$work" && mkdir -p "$work"
  [[ -n "$corpus" ]] && cp "$corpus"/* "$work/"
  log="$tmp/$name.log"
  # grpc_handlers runs the whole service per input: about 26 inputs a
  # second in the asan build (-O0) here, so it gets longer.
  seconds=${FUZZ_SECONDS:-10}
  [[ "$name" == grpc_handlers ]] && seconds=${FUZZ_SECONDS:-30}
  if ! "$binary" -max_total_time="$seconds" -print_final_stats=1 -rss_limit_mb=1024 \
      -artifact_prefix="$artifacts/" "$work" >"$log" 2>&1; then
    tail -60 "$log"
    echo "fuzz_test: $name failed (log above); a crashing input, if any, is in $artifacts" >&2
    exit 1
  fi
  runs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+)/\1/p' "$log")
  # Proof that the fuzzer ran: far more inputs than its seeds (at most 10
  # per target). Not a rate.
  minimum=200
  [[ "$name" == packet ]] && minimum=1000
  if [[ -z "$runs" || "$runs" -lt $minimum ]]; then
    tail -20 "$log"
    echo "fuzz_test: $name ran ${runs:-no} inputs in ${seconds} s; expected at least $minimum (its seeds and their mutations)" >&2
    exit 1
  fi
  echo "fuzz_test: $name: ${runs} inputs in ${seconds} s, no crash"
done
