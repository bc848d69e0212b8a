#!/bin/bash
# push_path.py on a two-host round whose stamps are known (testdata/push_path).
set -euo pipefail
here="$(dirname "$0")"
out="$(python3 "$here/push_path.py" "$here/testdata/push_path")"
echo "$out"
expect() {
  if ! grep -qE "^$1 +$2 +$3 " <<<"$out"; then
    echo "FAIL: expected '$1' with n=$2, median $3" >&2
    exit 1
  fi
}
expect "submit RPC" 2 0.450
expect "daemon -> scheduler" 2 0.200
expect "command -> packet" 1 0.100
expect "round: last submit -> round complete" 1 0.200
expect "round: round complete -> batch cycle" 1 0.100
expect "round: batch cycle -> commands queued" 1 0.200
expect "round: round complete -> first command" 1 1.800
expect "round: round complete -> last command" 1 2.300
expect "round: last submit -> first packet" 1 2.100
echo PASS
