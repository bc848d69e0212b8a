#!/usr/bin/env bash
# Fuzzes the planner JSON contract (both planners), the scheduler's config
# loader, the admin request handling, the local IPC framing, the
# scheduler's control-plane handlers and a daemon's data sessions with libFuzzer for a short time each
# (tools/fuzz), seeded by their committed corpora. Without
# clang this reports a skip with the reason (a failure under CI, where
# tools/bootstrap installs clang).
set -euo pipefail
source "${TEST_SRCDIR:-.}/mlfabric/testing/prereq.sh"
if ! command -v clang++ >/dev/null; then
  skip_or_fail "clang++ is not installed (tools/bootstrap installs it from tools/deps/fuzz.deb)"
fi
seconds=${FUZZ_SECONDS:-10}
export FUZZ_ARTIFACTS="${TEST_UNDECLARED_OUTPUTS_DIR:-${TEST_TMPDIR:-/tmp}}"
targets=(plan_json scheduler_config admin ipc grpc_handlers data_session)
log="${TEST_TMPDIR:-/tmp}/fuzz.log"
# One build of all targets (each source compiled once), then each fuzzed.
if ! tools/fuzz "$(IFS=,; echo "${targets[*]}")" "$seconds" >"$log" 2>&1; then
  tail -60 "$log"
  echo "fuzz_test: a target failed (log above); a crashing input, if any, is in $FUZZ_ARTIFACTS" >&2
  exit 1
fi
grep '^fuzz: building' "$log"
for target in "${targets[@]}"; do
  # The executed-units line of this target's run: after its "fuzzing" line.
  runs=$(sed -nE "/^fuzz: fuzzing $target for/,/^stat::number_of_executed_units/ \
                  s/^stat::number_of_executed_units: *([0-9]+)/\1/p" "$log")
  # Proof that the fuzzer ran: far more inputs than its seeds (at most 10
  # per target). Not a rate: on a busy 2-core machine grpc_handlers, the
  # slowest per input, ran 762 in 10 s.
  if [[ -z "$runs" || "$runs" -lt 200 ]]; then
    echo "fuzz_test: $target ran ${runs:-no} inputs; expected at least 200 (its seeds and their mutations)" >&2
    exit 1
  fi
  echo "fuzz_test: $target: ${runs} inputs in ${seconds} s, no crash"
done
