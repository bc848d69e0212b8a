#!/usr/bin/env bash
# dataplane_benchmark --json FILE adds its run to FILE in the structure of
# docs/results/dataplane.json, and tools/docs/results_tables.py renders
# docs/results.md §4 from it: one tiny real run (one round of 10 MiB, two
# daemons and the scheduler over loopback, about 15 s) added to a copy of
# the committed file. Checks the structure, that the earlier runs are kept
# and the new one added, and that the table shows it; no time is asserted.
set -euo pipefail
root="$TEST_SRCDIR/mlfabric"
bench="$root/bench/dataplane_benchmark"
tree="$TEST_TMPDIR/tree"
json="$tree/docs/results/dataplane.json"
mkdir -p "$tree/docs/results"

# Bad input is refused before anything runs, naming what was wrong.
if out=$("$bench" --gib=0.01 --rounds=1 --json "$tree/no/such/dir/x.json" 2>&1); then
  echo "FAIL: --json into a missing directory was accepted"
  exit 1
fi
grep -qF "no writable directory $tree/no/such/dir" <<<"$out"
echo '{"what": "something else"}' >"$tree/other.json"
if out=$("$bench" --gib=0.01 --rounds=1 --json "$tree/other.json" 2>&1); then
  echo "FAIL: --json into another benchmark's file was accepted"
  exit 1
fi
grep -qF "exists but is not the JSON of dataplane_benchmark runs" <<<"$out"

cp "$root/docs/results/dataplane.json" "$json"
chmod u+w "$json"
"$bench" --gib=0.01 --rounds=1 --json "$json"

python3 - "$root/tools/docs" "$tree" "$json" "$root/docs/results/dataplane.json" <<'PY'
import json, re, sys
sys.path.insert(0, sys.argv[1])
import results_tables

tree, path, committed = sys.argv[2], sys.argv[3], json.load(open(sys.argv[4]))
data = json.load(open(path))
for key in ["what", "date", "commit", "command", "note", "goodput_daemon_over_raw", "cpu_s_per_gb",
            "context_switches_per_mib", "encryption", "authentication", "preemption", "targets"]:
    assert key in data, "no field %s in %s" % (key, list(data))
assert list(data)[:5] == ["what", "date", "commit", "command", "note"], list(data)
assert re.fullmatch(r"2026-11-28 to \d{4}-\d\d-\d\d|2026-11-28", data["date"]), data["date"]
assert "bazel run -c opt //bench:dataplane_benchmark -- --gib=0.01 --rounds=1" in data["command"], data["command"]
assert not any("--json" in c for c in data["command"]), data["command"]
goodput = data["goodput_daemon_over_raw"]
assert goodput[:4] == committed["goodput_daemon_over_raw"] and len(goodput) == 5, goodput
assert goodput[4] > 0, goodput
for figure in ("cpu_s_per_gb", "context_switches_per_mib"):
    for daemon in ("sending", "receiving"):
        new, old = data[figure][daemon], committed[figure][daemon]
        assert new["min"] <= old["min"] and new["max"] >= old["max"], (figure, daemon, new, old)
for kept in ("encryption", "authentication", "preemption", "targets"):
    assert data[kept] == committed[kept], kept
rows = results_tables.dataplane(tree)
want = "| goodput, daemon / raw socket | 83 %, 96 %, 104 %, 103 %, " + results_tables.percent(goodput[4]) + " |"
assert rows[2].startswith(want), "row %s, expected %s" % (rows[2], want)
print("\n".join(rows))
PY
echo "dataplane_json_test: the run's JSON renders as the §4 table"
