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

# The checker itself: a tree with an upward include and two headers that
# include each other must fail, naming both.
fixture="$(mktemp -d)"
trap 'rm -rf "$fixture"' EXIT
mkdir -p "$fixture/common" "$fixture/scheduler"
printf '#include "common/b.h"\n' >"$fixture/common/a.h"
printf '#include "common/a.h"\n' >"$fixture/common/b.h"
printf '#include "scheduler/plan.h"\n' >"$fixture/common/c.h"
: >"$fixture/scheduler/plan.h"
if out="$(python3 "$script" "$fixture")"; then
  echo "layering_test: the checker passed a tree with a cycle and an upward include" >&2
  exit 1
fi
for expected in "common/a.h -> common/b.h" "common/c.h:1: common/ uses scheduler/plan.h"; do
  if ! grep -qF "$expected" <<<"$out"; then
    echo "layering_test: the checker did not report '$expected'; it said:" >&2
    echo "$out" >&2
    exit 1
  fi
done

exec python3 "$script" "$root"
