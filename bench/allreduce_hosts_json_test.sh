#!/usr/bin/env bash
# bench/allreduce_hosts.sh --json writes what tools/docs/results_tables.py
# renders as docs/results.md §3.2: a tiny real run (2 ranks, one pair of 3
# repeats at two sizes, a few seconds), then the table rendered from the
# file it wrote. Checks the structure and that the table shows the file's
# figures (the ratio is the sum of the mlfabric means over the sum of the
# MPI means); no time is asserted.
set -euo pipefail
root="$TEST_SRCDIR/mlfabric"
tree="$TEST_TMPDIR/tree"
json="$tree/docs/results/allreduce-hosts.json"
mkdir -p "$tree/docs/results"

# Bad input is refused before anything runs, naming what was wrong.
if out=$("$root/bench/allreduce_hosts.sh" --bazel_bin "$root" --pairs 0 --json "$json" 2>&1); then
  echo "FAIL: --pairs 0 was accepted"
  exit 1
fi
grep -qF "'0' in --ranks, --counts, --pairs or --repeats is not a positive integer" <<<"$out"
if out=$("$root/bench/allreduce_hosts.sh" --bazel_bin "$root" --json "$tree/no/such/dir/x.json" 2>&1); then
  echo "FAIL: --json into a missing directory was accepted"
  exit 1
fi
grep -qF "no directory $tree/no/such/dir" <<<"$out"

if out=$("$root/bench/allreduce_hosts.sh" --bazel_bin "$root" --op product 2>&1); then
  echo "FAIL: --op product was accepted"
  exit 1
fi
grep -qF -- "--op 'product' is not one of: sum min max" <<<"$out"

"$root/bench/allreduce_hosts.sh" --bazel_bin "$root" --ranks 2 --counts "1024 65536" --pairs 1 \
    --repeats 3 --json "$json"
# An AllReduce under max (between hosts, exchanges of blocks) is a row of
# its own in the collectives' table.
"$root/bench/allreduce_hosts.sh" --bazel_bin "$root" --ranks 2 --counts 1024 --pairs 1 \
    --repeats 3 --op max --json "$tree/docs/results/collectives-hosts-allreduce-max.json"

python3 - "$root/tools/docs" "$tree" "$json" <<'PY'
import json, re, sys
sys.path.insert(0, sys.argv[1])
import results_tables

tree, path = sys.argv[2], sys.argv[3]
data = json.load(open(path))
expected = ["what", "date", "commit", "command", "note", "results", "target_ratio"]
assert list(data) == expected, "fields %s, expected %s" % (list(data), expected)
assert re.fullmatch(r"\d{4}-\d\d-\d\d", data["date"]), data["date"]
command = data["command"]
assert 'bench/allreduce_hosts.sh --ranks 2 --counts "1024 65536" --pairs 1 --repeats 3' in command, command
assert "--json" not in command and "--bazel_bin" not in command, command
assert data["target_ratio"] == {"65536": 3}, data["target_ratio"]
cells = [(r["ranks"], r["count"]) for r in data["results"]]
assert cells == [(2, 1024), (2, 65536)], cells
rows = results_tables.allreduce_hosts(tree)
assert len(rows) == 4, rows
for row, result in zip(rows[2:], data["results"]):
    cells = [c.strip() for c in row.strip("|").split("|")]
    fabric, mpi = result["mlfabric_ms"], result["mpi_tcp_ms"]
    assert len(fabric) == len(mpi) == 1 and fabric[0] > 0 and mpi[0] > 0, result
    ratio = results_tables.sig(sum(fabric) / sum(mpi), 2) + "×"
    target = "≤ 3×" if result["count"] == 65536 else ""
    want = ["2", "{:,}".format(result["count"]), results_tables.sig(fabric[0], 3) + " ms",
            results_tables.sig(mpi[0], 3) + " ms", ratio, target]
    assert cells == want, "row %s, expected %s" % (cells, want)
print("\n".join(rows))
maxed = json.load(open(tree + "/docs/results/collectives-hosts-allreduce-max.json"))
assert [(r["collective"], r["op"]) for r in maxed["results"]] == [("allreduce", "max")], maxed
assert maxed["target_ratio"] == {}, maxed["target_ratio"]
table = results_tables.collectives_hosts(tree)
assert any(line.startswith("| AllReduce (Max) |") for line in table), table
print("\n".join(table))
PY
echo "allreduce_hosts_json_test: the run's JSON renders as the §3.2 table"
