#!/usr/bin/env bash
# prereq.sh and prereq.h: a skip outside CI, a failure under CI.
set -uo pipefail
here="$TEST_SRCDIR/mlfabric/testing"
out=$(MLFABRIC_REQUIRE_PREREQS=0 bash -c "source '$here/prereq.sh'; skip_or_fail no tool") ; code=$?
[[ $code == 0 && "$out" == "SKIPPED: no tool" ]] || { echo "outside CI: got $code '$out'"; exit 1; }
out=$(MLFABRIC_REQUIRE_PREREQS=1 bash -c "source '$here/prereq.sh'; skip_or_fail no tool") ; code=$?
[[ $code == 1 && "$out" == FAILED:*"no tool" ]] || { echo "under CI: got $code '$out'"; exit 1; }
MLFABRIC_REQUIRE_PREREQS=0 "$here/prereq_check" >/dev/null || { echo "C++ skip failed outside CI"; exit 1; }
if MLFABRIC_REQUIRE_PREREQS=1 "$here/prereq_check" >/dev/null; then
  echo "C++ skip passed under CI"; exit 1
fi
echo "prereq_test: skips outside CI, fails under CI (shell and C++)"
