#!/bin/bash
# Runs check_docs.py over the source tree, after proving on a small fixture
# tree that it catches each kind of problem it is for. The check reads the
# tree this script's runfile links to, not declared inputs, so the test is
# tagged "external" (never cached).
set -euo pipefail
script="${TEST_SRCDIR:-.}/mlfabric/tools/docs/check_docs.py"
root="$(cd "$(dirname "$(readlink -f "$script")")/../.." && pwd)"
if [[ ! -f $root/WORKSPACE || ! -d $root/tools/docs ]]; then
  echo "docs_test: cannot find the source tree from $script (got $root)" >&2
  exit 1
fi

fixture="$(mktemp -d)"
trap 'rm -rf "$fixture"' EXIT
mkdir -p "$fixture/docs" "$fixture/pkg"
printf 'cc_binary(\n    name = "tool",\n)\n' >"$fixture/pkg/BUILD"
printf '// The tool (added for issue 9).\nint main() { return 0; }\n' >"$fixture/pkg/tool.cc"
printf '# Guide\n\n## Two words\n\nSee [the readme](../README.md#title).\n' >"$fixture/docs/guide.md"
{
  printf '# Title\n\n```sh\nbazel build //pkg:tool //pkg:missing\nbazel-bin/pkg/gone\ntools/nowhere.sh\n```\n\n'
  printf 'See [a guide](docs/guide.md#two-words), [a gap](docs/none.md), [a bad anchor](docs/guide.md#three).\n'
  printf 'This came from issue 12.\n'
  printf 'The design is in %s/DESIGN.md.\n' "../sha""red"
  for _ in $(seq 200); do echo "line"; done
} >"$fixture/README.md"
if out="$(python3 "$script" "$fixture")"; then
  echo "docs_test: the checker passed a tree with broken links, commands and docs" >&2
  exit 1
fi
for expected in \
    "link to docs/none.md: no such file" \
    "docs/guide.md has no heading '#three'" \
    "//pkg:missing: no such Bazel target" \
    "bazel-bin/pkg/gone: no Bazel target builds it" \
    "tools/nowhere.sh: no such script" \
    "'issue 12': docs name no issue numbers" \
    "pkg/tool.cc:1: 'issue 9': comments name no issue numbers" \
    "refers to a path outside the repository" \
    "README.md: 211 lines; keep it to 200"; do
  if ! grep -qF "$expected" <<<"$out"; then
    echo "docs_test: the checker did not report '$expected'; it said:" >&2
    echo "$out" >&2
    exit 1
  fi
done
for passed in "//pkg:tool" "guide.md#two-words" "README.md#title"; do
  if grep -qF "$passed" <<<"$out"; then
    echo "docs_test: the checker reported '$passed', which is correct; it said:" >&2
    echo "$out" >&2
    exit 1
  fi
done

exec python3 "$script" "$root"
