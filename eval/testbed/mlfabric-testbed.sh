#!/usr/bin/env bash
# `bazel run //eval/testbed:mlfabric-testbed -- FLAGS`: runs mlfabric_testbed.py
# with the venv's Python (matplotlib for the plots) and the binaries of this
# runfiles tree. --help lists the flags.
set -euo pipefail
if [[ -n "${RUNFILES_DIR:-}" ]]; then
  root="$RUNFILES_DIR/mlfabric"
elif [[ -d "$0.runfiles/mlfabric" ]]; then
  root="$0.runfiles/mlfabric"
else
  root="$(cd "$(dirname "$0")/../.." && pwd)"
fi
python="${MLFABRIC_VENV:-/opt/mlfabric/venv}/bin/python"
[[ -x "$python" ]] || python=python3
export MLFABRIC_TESTBED_BIN_ROOT="$root"
exec "$python" "$root/eval/testbed/mlfabric_testbed.py" "$@"
