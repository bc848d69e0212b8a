#!/bin/bash
# Checks that dependencies between top-level packages run down the layer
# order declared in check_layering.py (C++ includes, BUILD labels, imports
# within python/mlfabric). The check reads the source tree this script's
# runfile links to, not declared inputs, so the test is tagged "external"
# (never cached): every `bazel test //...` looks at the tree as it is.
set -euo pipefail
script="${TEST_SRCDIR:-.}/mlfabric/tools/layering/check_layering.py"
root="$(cd "$(dirname "$(readlink -f "$script")")/../.." && pwd)"
if [[ ! -f $root/WORKSPACE || ! -d $root/tools/layering ]]; then
  echo "layering_test: cannot find the source tree from $script (got $root)" >&2
  exit 1
fi
exec python3 "$script" "$root"
