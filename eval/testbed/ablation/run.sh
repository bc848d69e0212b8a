#!/usr/bin/env bash
# Runs one of this package's experiment drivers (mercury_ablation.py,
# tls_colocated.py: the name of the symlink/target decides) with the venv's
# Python (matplotlib for the plots) and the binaries of this runfiles tree.
# --help lists the flags.
set -euo pipefail
if [[ -n "${RUNFILES_DIR:-}" ]]; then
  root="$RUNFILES_DIR/mlfabric"
elif [[ -d "$0.runfiles/mlfabric" ]]; then
  root="$0.runfiles/mlfabric"
else
  root="$(cd "$(dirname "$0")/../../.." && pwd)"
fi
python="${MLFABRIC_VENV:-/opt/mlfabric/venv}/bin/python"
[[ -x "$python" ]] || python=python3
export MLFABRIC_TESTBED_BIN_ROOT="$root"
case "$(basename "$0")" in
  mercury-ablation*) script=mercury_ablation.py ;;
  tls-colocated*) script=tls_colocated.py ;;
  *) echo "run.sh: unknown experiment $(basename "$0")" >&2; exit 2 ;;
esac
exec "$python" "$root/eval/testbed/ablation/$script" "$@"
