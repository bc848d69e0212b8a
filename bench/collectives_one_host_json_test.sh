#!/usr/bin/env bash
# bench/collectives_one_host.sh --json writes what
# tools/docs/results_tables.py renders below docs/results.md §3.1's table:
# a tiny real run (2 ranks, one pair of 2 repeats of each collective at
# 64 KiB, where the mlfabric backend's sums leave MPI; allreduce_benchmark
# checks every call's result exactly), then the table rendered from the
# file it wrote. Checks the structure and that the table shows the file's
# figures; no time is asserted.
set -euo pipefail
root="$TEST_SRCDIR/mlfabric"
tree="$TEST_TMPDIR/tree"
json="$tree/docs/results/collectives-one-host.json"
mkdir -p "$tree/docs/results"

# Bad input is refused before anything runs, naming what was wrong.
if out=$("$root/bench/collectives_one_host.sh" --bazel_bin "$root" --collectives "allreduce gather" \
           --json "$json" 2>&1); then
  echo "FAIL: --collectives gather was accepted"
  exit 1
fi
grep -qF "'gather' in --collectives is not one of" <<<"$out"
if out=$("$root/bench/collectives_one_host.sh" --bazel_bin "$root" --repeats 0 2>&1); then
  echo "FAIL: --repeats 0 was accepted"
  exit 1
fi
grep -qF "'0' in --ranks, --counts, --pairs or --repeats is not a positive integer" <<<"$out"

"$root/bench/collectives_one_host.sh" --bazel_bin "$root" --ranks 2 --counts 16384 --pairs 1 \
    --repeats 2 --json "$json"

python3 - "$root/tools/docs" "$tree" "$json" <<'PY'
import json, re, sys
sys.path.insert(0, sys.argv[1])
import results_tables

tree, path = sys.argv[2], sys.argv[3]
data = json.load(open(path))
expected = ["what", "date", "commit", "command", "note", "results", "target"]
assert list(data) == expected, "fields %s, expected %s" % (list(data), expected)
assert re.fullmatch(r"\d{4}-\d\d-\d\d", data["date"]), data["date"]
command = data["command"]
assert "bench/collectives_one_host.sh --ranks 2 --counts 16384 --pairs 1 --repeats 2" in command, command
assert "--json" not in command and "--bazel_bin" not in command, command
assert data["target"] == {"ratio": 2, "from_count": 262144}, data["target"]
cells = [(r["collective"], r["ranks"], r["count"]) for r in data["results"]]
names = ["allreduce", "allgather", "broadcast", "alltoall", "reducescatter"]
assert cells == [(name, 2, 16384) for name in names], cells
rows = results_tables.collectives_one_host(tree)
assert rows[0] == "| collective | 2 ranks, 64 KiB |", rows[0]
assert len(rows) == 2 + len(names), rows
for row, result in zip(rows[2:], data["results"]):
    cells = [c.strip() for c in row.strip("|").split("|")]
    mpi, fabric = result["mpi_ms"], result["mlfabric_ms"]
    assert len(mpi) == len(fabric) == 1 and mpi[0] > 0 and fabric[0] > 0, result
    sig = results_tables.sig
    want = [results_tables.COLLECTIVES[result["collective"]],
            "%s× (%s / %s ms)" % (sig(fabric[0] / mpi[0], 2), sig(fabric[0], 3), sig(mpi[0], 3))]
    assert cells == want, "row %s, expected %s" % (cells, want)
print("\n".join(rows))

# From the target's size on, a ratio above the target is bold.
for result in data["results"]:
    result["count"] = data["target"]["from_count"]
    result["mlfabric_ms"] = [3 * result["mpi_ms"][0]]
json.dump(data, open(path, "w"))
for row in results_tables.collectives_one_host(tree)[2:]:
    assert row.split("|")[2].strip().startswith("**3.0×** ("), row
PY
echo "collectives_one_host_json_test: the run's JSON renders as the table below §3.1"
