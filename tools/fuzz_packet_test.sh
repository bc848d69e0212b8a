#!/usr/bin/env bash
# Fuzzes the Mercury packet parser with libFuzzer for a short time (the
# bad-input requirement: a pure parser with a libFuzzer target, run
# where clang is available). tools/bootstrap installs clang
# (tools/deps/fuzz.deb); on a machine without it this reports a skip with
# the reason rather than passing.
set -euo pipefail
source "${TEST_SRCDIR:-.}/mlfabric/testing/prereq.sh"
if ! command -v clang++ >/dev/null; then
  skip_or_fail "clang++ is not installed (tools/bootstrap installs it from tools/deps/fuzz.deb)"
fi
seconds=${FUZZ_SECONDS:-20}
export FUZZ_ARTIFACTS="${TEST_UNDECLARED_OUTPUTS_DIR:-${TEST_TMPDIR:-/tmp}}"
log="${TEST_TMPDIR:-/tmp}/fuzz-packet.log"
if ! tools/fuzz-packet "$seconds" >"$log" 2>&1; then
  tail -60 "$log"
  echo "fuzz_packet_test: the fuzzer failed; a crashing input is in $FUZZ_ARTIFACTS" >&2
  exit 1
fi
grep -E '^fuzz:|^Done [0-9]+ runs|^stat::(number_of_executed_units|new_units_added|peak_rss_mb)' "$log"
runs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+)/\1/p' "$log")
if [[ -z "$runs" || "$runs" -lt 1000 ]]; then
  echo "fuzz_packet_test: the fuzzer ran ${runs:-no} inputs; expected many" >&2
  exit 1
fi
echo "fuzz_packet_test: ${runs} inputs in ${seconds} s, no crash"
