#!/usr/bin/env bash
# The README's demo must run end to end and exit 0, training for real; it
# prints the admin dashboard's address, and a worker slowed by 400 ms per
# iteration (against ~20-50 ms for the others) is reported as a straggler.
set -euo pipefail
out=$(tools/demo/mlfabric-demo --seconds=3 --workers=3 --slow_worker=3 --slow_ms=400 2>&1) ||
  { echo "$out"; exit 1; }
echo "$out"
grep -q "mlfabric-demo: OK" <<<"$out"
grep -q "^\[ 1.0s\] server:" <<<"$out"            # progress once a second
test "$(grep -c '^worker w[0-9]*: .* failed 0 ' <<<"$out")" -eq 3
grep -q "^admin dashboard: http://127.0.0.1:[0-9]*/" <<<"$out"
grep -q "^scheduler: straggler: worker w3 of job demo" <<<"$out"
if grep -q "^scheduler: straggler: worker w[12] " <<<"$out"; then
  echo "a worker that was not slowed was flagged"; exit 1
fi
# No process the demo started may outlive it.
if pgrep -f "mlfabric-cluster-.*\.sock" >/dev/null; then
  echo "orphaned processes:"; pgrep -af "mlfabric-cluster-.*\.sock"; exit 1
fi
