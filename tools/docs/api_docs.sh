#!/bin/bash
# Renders the API reference to HTML: the C++ headers of api/ with Doxygen
# and the Python package (mlfabric, mlfabric.tensorflow, mlfabric.keras)
# with pdoc. Both come from tools/bootstrap (tools/deps/docs.deb, docs.pip).
#
#   tools/docs/api_docs.sh [OUT]      # default /tmp/mlfabric-api-docs
#
# Prints where the two index pages are; exits 1 if Doxygen warned (an
# undocumented public name) or pdoc failed.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="$(realpath -m "${1:-/tmp/mlfabric-api-docs}")"
venv="${MLFABRIC_VENV:-/opt/mlfabric/venv}"
for tool in doxygen "$venv/bin/pdoc"; do
  if ! command -v "$tool" >/dev/null; then
    echo "api_docs: $tool is missing; run tools/bootstrap" >&2
    exit 1
  fi
done
mkdir -p "$out"
MLFABRIC_DOCS_OUT="$out" doxygen tools/docs/Doxyfile
if [[ -s "$out/doxygen-warnings.txt" ]]; then
  cat "$out/doxygen-warnings.txt" >&2
  echo "api_docs: Doxygen warned (see above)" >&2
  exit 1
fi
# The Python package imports its native module (python/README.md).
bazel build //python:runtime >/dev/null
PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" TF_CPP_MIN_LOG_LEVEL=2 \
  "$venv/bin/pdoc" --docformat google -o "$out/python" mlfabric
echo "api_docs: C++ $out/cpp/html/index.html"
echo "api_docs: Python $out/python/index.html"
