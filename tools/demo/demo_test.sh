#!/usr/bin/env bash
# The README's demo must run end to end and exit 0, training for real.
set -euo pipefail
out=$(tools/demo/mlfabric-demo --seconds=3 --workers=3 2>&1) || { echo "$out"; exit 1; }
echo "$out"
grep -q "mlfabric-demo: OK" <<<"$out"
grep -q "^\[ 1.0s\] server:" <<<"$out"            # progress once a second
test "$(grep -c '^worker w[0-9]*: .* failed 0 ' <<<"$out")" -eq 3
# No process the demo started may outlive it.
if pgrep -f "mlfabric-cluster-.*\.sock" >/dev/null; then
  echo "orphaned processes:"; pgrep -af "mlfabric-cluster-.*\.sock"; exit 1
fi
