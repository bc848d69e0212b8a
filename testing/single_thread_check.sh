#!/usr/bin/env bash
# A --run_under wrapper: runs a test under strace and fails it if the test
# starts a thread. tools/test runs the tests tagged "single_threaded" with
# it (bazel test --run_under=//testing:single_thread_check
# --test_tag_filters=single_threaded //...), since the tsan config leaves
# those tests out on that claim (.bazelrc). Processes a test starts
# (fork, posix_spawn) are not threads and are allowed.
set -uo pipefail
if ! command -v strace >/dev/null; then
  echo "FAILED: strace is not installed (tools/bootstrap installs it from tools/deps/core.deb)"
  exit 1
fi
trace="${TEST_TMPDIR:-$(mktemp -d)}/single_thread_check.strace"
strace -f -qq -e trace=clone,clone3 -e signal=none -o "$trace" "$@"
status=$?
threads=$(grep -c 'CLONE_THREAD' "$trace")
if [[ $threads -gt 0 ]]; then
  echo "FAILED: tagged single_threaded, but started $threads thread(s) (strace):"
  grep -m 3 'CLONE_THREAD' "$trace"
  echo "Remove the tag so that the tsan config tests it again."
  exit 1
fi
echo "single_thread_check: no thread started (exit status $status)"
exit $status
