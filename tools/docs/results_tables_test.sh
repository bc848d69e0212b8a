#!/bin/bash
# Fails when a generated table of docs/results.md differs from what
# results_tables.py renders from the committed JSON, after proving on
# fixtures that the check catches a drifted table, a marker naming no
# table, a table whose markers are gone, a table written by hand outside
# the markers and a summary figure naming nothing, that the summary follows
# the files its figures come from, and that --write repairs the drift. Reads the doc and the JSON from the source tree this script's
# runfile links to, so the test is tagged "external" (never cached).
set -euo pipefail
script="${TEST_SRCDIR:-.}/mlfabric/tools/docs/results_tables.py"
root="$(cd "$(dirname "$(readlink -f "$script")")/../.." && pwd)"
if [[ ! -f $root/WORKSPACE || ! -f $root/docs/results.md ]]; then
  echo "results_tables_test: cannot find the source tree from $script (got $root)" >&2
  exit 1
fi
fixture="$(mktemp -d)"
trap 'rm -rf "$fixture"' EXIT

# expect_failure NAME MESSAGE: the check must fail on $fixture/NAME and say MESSAGE.
expect_failure() {
  local out
  if out="$(python3 "$script" --root "$root" --doc "$fixture/$1" --check 2>&1)"; then
    echo "results_tables_test: the check passed $1; it said:" >&2
    echo "$out" >&2
    exit 1
  fi
  if ! grep -qF -- "$2" <<<"$out"; then
    echo "results_tables_test: on $1 the check did not report \"$2\"; it said:" >&2
    echo "$out" >&2
    exit 1
  fi
}

# The fixtures start from the doc with its tables rendered anew, so that
# they prove the check whatever state the committed doc is in.
base="$fixture/base.md"
cp "$root/docs/results.md" "$base"
python3 "$script" --root "$root" --doc "$base" --write >/dev/null

# A cell of the simulator's Table 2 changed by hand.
sed '/^<!-- table: sim-table2 /,/^<!-- end table -->/s/| simulator, τ = 30 | 0\.[0-9][0-9] |/| simulator, τ = 30 | 9.99 |/' \
    "$base" >"$fixture/drifted.md"
if cmp -s "$base" "$fixture/drifted.md"; then
  echo "results_tables_test: the fixture did not change the Table 2 row; has the table moved?" >&2
  exit 1
fi
expect_failure drifted.md "is out of date: table(s) "
expect_failure drifted.md "sim-table2"
expect_failure drifted.md "-| simulator, τ = 30 | 9.99 |"

# --write puts the rendered table back, and nothing else changes.
python3 "$script" --root "$root" --doc "$fixture/drifted.md" --write >/dev/null
python3 "$script" --root "$root" --doc "$fixture/drifted.md" --check >/dev/null
sed '/^<!-- table: sim-table2 /,/^<!-- end table -->/d' "$base" >"$fixture/a.md"
sed '/^<!-- table: sim-table2 /,/^<!-- end table -->/d' "$fixture/drifted.md" >"$fixture/b.md"
if ! diff -u "$fixture/a.md" "$fixture/b.md"; then
  echo "results_tables_test: --write changed lines outside the drifted table" >&2
  exit 1
fi

# A new run's JSON without --write: the table no longer matches its file.
tree="$fixture/tree"
mkdir -p "$tree/eval/sim" "$tree/eval/testbed" "$tree/eval/elastic" "$tree/docs"
cp -r "$root/eval/sim/results" "$tree/eval/sim/"
cp "$root"/eval/testbed/*_results.json "$tree/eval/testbed/"
cp -r "$root/eval/elastic/results" "$tree/eval/elastic/"
cp -r "$root/docs/results" "$tree/docs/"
python3 -c 'import json, sys
path = sys.argv[1]
data = json.load(open(path))
data["overhead"][-1]["ms_mean"] = 70.0
json.dump(data, open(path, "w"))' "$tree/eval/sim/results/overhead.json"
cp "$base" "$fixture/rerun.md"
if out="$(python3 "$script" --root "$tree" --doc "$fixture/rerun.md" --check 2>&1)" ||
    ! grep -qF -- "/ 70 ms | 1460 ms |" <<<"$out"; then
  echo "results_tables_test: a changed overhead.json did not fail the check with its new row; it said:" >&2
  echo "$out" >&2
  exit 1
fi

# A transcribed ratio that its rounded figures do not give is refused.
python3 -c 'import json, sys
path = sys.argv[1]
data = json.load(open(path))
data["pairs"][0]["ratio"] = 4.0
json.dump(data, open(path, "w"))' "$tree/docs/results/testbed-shards.json"
if out="$(python3 "$script" --root "$tree" --doc "$fixture/rerun.md" --check 2>&1)" ||
    ! grep -qF -- "pair 1's ratio: 4.00 is not 36.2 / 11.1" <<<"$out"; then
  echo "results_tables_test: a ratio its figures do not give did not fail the check; it said:" >&2
  echo "$out" >&2
  exit 1
fi

# The Summary's measured cells are computed from the sections' files: a
# new shards run changes the summary too.
python3 -c 'import json, sys
path = sys.argv[1]
data = json.load(open(path))
data["pairs"][0]["ratio"] = 3.0
data["pairs"][0]["shards_applied_per_s"] = 33.3
json.dump(data, open(path, "w"))' "$tree/docs/results/testbed-shards.json"
if out="$(python3 "$script" --root "$tree" --doc "$fixture/rerun.md" --check 2>&1)" ||
    ! grep -qF -- "+| four shards ≥ 3× the updates per second of one server | | 3.00–3.45× |" <<<"$out"; then
  echo "results_tables_test: a new shards ratio did not change the summary's cell; it said:" >&2
  echo "$out" >&2
  exit 1
fi
# A summary cell naming no computed figure is refused.
python3 -c 'import json, sys
path = sys.argv[1]
data = json.load(open(path))
data["goals"][0]["measured"] = "{testbed-table2: no such figure}"
json.dump(data, open(path, "w"))' "$tree/docs/results/summary.json"
if out="$(python3 "$script" --root "$tree" --doc "$fixture/rerun.md" --check 2>&1)" ||
    ! grep -qF -- "'{testbed-table2: no such figure}' names no computed figure" <<<"$out"; then
  echo "results_tables_test: an unknown summary figure did not fail the check; it said:" >&2
  echo "$out" >&2
  exit 1
fi

# A table written by hand, outside the markers, fails the check.
awk '{print} /^## 8\. Not measured here/ {print ""; print "| a | b |"; print "| --- | --- |"; print "| 1 | 2 |"}' \
    "$base" >"$fixture/hand.md"
expect_failure hand.md "a Markdown table outside the generated-table markers"
sed 's/^<!-- table: sim-overhead /<!-- table: no-such-table /' "$base" >"$fixture/unknown.md"
expect_failure unknown.md "no generated table is named 'no-such-table'"
sed '/^<!-- table: sim-overhead /,/^<!-- end table -->/d' "$base" >"$fixture/unmarked.md"
expect_failure unmarked.md "no markers for the generated table(s) sim-overhead"
# Its opening marker alone gone: the table is one written by hand.
sed '/^<!-- table: sim-overhead /d' "$base" >"$fixture/unopened.md"
expect_failure unopened.md "a Markdown table outside the generated-table markers"
sed '0,/^<!-- end table -->/{/^<!-- end table -->/d}' "$base" >"$fixture/unended.md"
expect_failure unended.md "has no '<!-- end table -->' after it"

exec python3 "$script" --root "$root" --check
