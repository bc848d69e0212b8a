# Sourced by shell tests: skip_or_fail REASON... ends the test with
# "SKIPPED: REASON" (exit 0) outside CI, or fails it (exit 1) naming the
# missing prerequisite when MLFABRIC_REQUIRE_PREREQS=1 (tools/test sets it
# under CI=true, where tools/bootstrap installed everything). See prereq.h.
skip_or_fail() {
  if [[ "${MLFABRIC_REQUIRE_PREREQS:-0}" == "1" ]]; then
    echo "FAILED: missing prerequisite (required under CI, MLFABRIC_REQUIRE_PREREQS=1): $*"
    exit 1
  fi
  echo "SKIPPED: $*"
  exit 0
}
