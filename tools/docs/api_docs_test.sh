#!/bin/bash
# The API reference has no undocumented public name: Doxygen, over the
# public C++ headers with tools/docs/Doxyfile, warns about none, and every
# public function, class and method of the Python package has a docstring.
# Both checks are first shown to catch a fixture's undocumented names. Reads
# the source tree (tagged "external" and "local", like docs_test).
set -euo pipefail
here="${TEST_SRCDIR:-.}/mlfabric/tools/docs"
source "${TEST_SRCDIR:-.}/mlfabric/testing/prereq.sh"
root="$(cd "$(dirname "$(readlink -f "$here/check_docstrings.py")")/../.." && pwd)"
if [[ ! -f $root/WORKSPACE ]]; then
  echo "api_docs_test: cannot find the source tree (got $root)" >&2
  exit 1
fi
command -v doxygen >/dev/null || skip_or_fail "doxygen is not installed (tools/bootstrap installs it: tools/deps/docs.deb)"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$root"

# The C++ check on a fixture: one documented and one undocumented struct.
mkdir -p "$work/fixture"
printf '// Documented.\nstruct Good {\n  int a = 0;  // documented too\n};\nstruct Bad {\n  int b = 0;\n};\n' \
  >"$work/fixture/fixture.h"
mkdir -p "$work/fixture-out" "$work/out"
(cat tools/docs/Doxyfile; echo "INPUT = $work/fixture/fixture.h") |
  MLFABRIC_DOCS_OUT="$work/fixture-out" doxygen - >/dev/null 2>&1
for expected in "Compound Bad is not documented" "Member b (variable) of struct Bad is not documented"; do
  if ! grep -qF "$expected" "$work/fixture-out/doxygen-warnings.txt"; then
    echo "api_docs_test: Doxygen did not report '$expected'; it said:" >&2
    cat "$work/fixture-out/doxygen-warnings.txt" >&2
    exit 1
  fi
done
if grep -q "Good" "$work/fixture-out/doxygen-warnings.txt"; then
  echo "api_docs_test: Doxygen reported the documented struct:" >&2
  cat "$work/fixture-out/doxygen-warnings.txt" >&2
  exit 1
fi

# The Python check on a fixture package.
mkdir -p "$work/pkg/sub"
printf '"""A module."""\ndef good():\n    """Documented."""\ndef bad():\n    pass\ndef _private():\n    pass\n' \
  >"$work/pkg/__init__.py"
printf 'class C:\n    def method(self):\n        pass\n' >"$work/pkg/sub/mod.py"
if out="$(python3 tools/docs/check_docstrings.py "$work/pkg")"; then
  echo "api_docs_test: the docstring check passed an undocumented package" >&2
  exit 1
fi
for expected in "bad has no docstring" "C has no docstring" "C.method has no docstring" \
    "mod.py: the module has no docstring"; do
  if ! grep -qF "$expected" <<<"$out"; then
    echo "api_docs_test: the docstring check did not report '$expected'; it said:" >&2
    echo "$out" >&2
    exit 1
  fi
done
if grep -qE "good|_private" <<<"$out"; then
  echo "api_docs_test: the docstring check reported a documented or private name:" >&2
  echo "$out" >&2
  exit 1
fi

# The real API.
MLFABRIC_DOCS_OUT="$work/out" doxygen tools/docs/Doxyfile >/dev/null 2>&1
if [[ -s "$work/out/doxygen-warnings.txt" ]]; then
  echo "api_docs_test: Doxygen warned about the public C++ headers:" >&2
  cat "$work/out/doxygen-warnings.txt" >&2
  exit 1
fi
echo "api_docs_test: the C++ headers: no undocumented name"
python3 tools/docs/check_docstrings.py python/mlfabric
