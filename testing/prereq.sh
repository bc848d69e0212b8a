# Sourced by shell tests: skip_or_fail REASON... ends the test with
# "SKIPPED: REASON" (exit 0) outside CI, or fails it (exit 1) naming the
# missing prerequisite when MLFABRIC_REQUIRE_PREREQS=1 (tools/test sets it
# under CI=true, where tools/bootstrap installed everything). See prereq.h.
# require_python MODULE... (below) does the same for the venv's Python.
skip_or_fail() {
  if [[ "${MLFABRIC_REQUIRE_PREREQS:-0}" == "1" ]]; then
    echo "FAILED: missing prerequisite (required under CI, MLFABRIC_REQUIRE_PREREQS=1): $*"
    exit 1
  fi
  echo "SKIPPED: $*"
  exit 0
}

# require_python MODULE...: sets $python to the venv tools/bootstrap builds
# ($MLFABRIC_VENV, default /opt/mlfabric/venv) and ends the test through
# skip_or_fail when that Python cannot import every MODULE.
require_python() {
  python="${MLFABRIC_VENV:-/opt/mlfabric/venv}/bin/python"
  if ! "$python" -c "import $(IFS=,; echo "$*")" >/dev/null 2>&1; then
    skip_or_fail "$python cannot import $(IFS=/; echo "$*"); run tools/bootstrap"
  fi
}
