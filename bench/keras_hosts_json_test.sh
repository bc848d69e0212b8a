#!/usr/bin/env bash
# keras_hosts.sh --json hands its pairs to keras_hosts_json.py, which writes
# them as their model's entry of a file in the structure of
# docs/results/keras-hosts.json; tools/docs/results_tables.py renders
# docs/results.md §3.3 from it. Here, without a run (that needs root and
# TensorFlow): pairs written into a copy of the committed file replace that
# model's entry and keep the other's, a new file is created, the table
# shows the new ratios, and bad pairs are refused naming the line.
set -euo pipefail
root="$TEST_SRCDIR/mlfabric"
writer="$root/python/benchmarks/keras_hosts_json.py"
tree="$TEST_TMPDIR/tree"
json="$tree/docs/results/keras-hosts.json"
mkdir -p "$tree/docs/results"
cp "$root/docs/results/keras-hosts.json" "$json"
chmod u+w "$json"

printf '1.2 1.5\n1.25 1.6\n' >"$TEST_TMPDIR/pairs"
python3 "$writer" "$json" --model mobilenetv2 --rate_bps 8.9e8 --straggle 0.10,4 \
    --command "python/benchmarks/keras_hosts.sh --model mobilenetv2 --pairs 2" \
    --pairs "$TEST_TMPDIR/pairs" --env MLFABRIC_ALLREDUCE_MPI_BELOW=0

python3 - "$root/tools/docs" "$tree" "$json" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[1])
import results_tables

tree, path = sys.argv[2], sys.argv[3]
data = json.load(open(path))
models = {m["model"]: m for m in data["models"]}
assert sorted(models) == ["digits", "mobilenetv2"], sorted(models)
assert len(models["digits"]["pairs"]) == 19, "the digits entry was not kept"
new = models["mobilenetv2"]
assert new["env"] == ["MLFABRIC_ALLREDUCE_MPI_BELOW=0"], new["env"]
assert new["pairs"] == [
    {"mpi_steps_per_s": 1.2, "mlfabric_steps_per_s": 1.5, "ratio": 1.25},
    {"mpi_steps_per_s": 1.25, "mlfabric_steps_per_s": 1.6, "ratio": 1.28},
], new["pairs"]
assert new["command"].endswith("--model mobilenetv2 --pairs 2"), new["command"]
table = "\n".join(results_tables.keras_hosts(tree))
assert table.index("MobileNetV2") < table.index("digits"), "the models' order changed"
assert "| 1.25, 1.28 |" in table, table
assert "19 pairs: median 0.93, geometric mean 0.97" in table, table
print(table)
PY

# A file that does not exist yet is created with the file's fields.
python3 "$writer" "$tree/new.json" --model digits --rate_bps 1e9 --straggle 0.10,4 \
    --command "python/benchmarks/keras_hosts.sh" --pairs "$TEST_TMPDIR/pairs"
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert list(d) == ["what", "date", "commit", "command", "note", "models"], list(d); assert [m["model"] for m in d["models"]] == ["digits"]' "$tree/new.json"

# Bad pairs and a file of another kind are refused, naming what was wrong.
printf '1.2 1.5\n1.2 fast\n' >"$TEST_TMPDIR/bad"
if out=$(python3 "$writer" "$json" --model digits --rate_bps 1e9 --straggle 0.10,4 \
         --command x --pairs "$TEST_TMPDIR/bad" 2>&1); then
  echo "FAIL: a pair that is not a number was accepted"
  exit 1
fi
grep -qF "line 2: expected two steps-per-second figures" <<<"$out"
echo '{"what": "something else"}' >"$tree/other.json"
printf '1 2\n' >"$TEST_TMPDIR/one"
if out=$(python3 "$writer" "$tree/other.json" --model digits --rate_bps 1e9 --straggle 0.10,4 \
         --command x --pairs "$TEST_TMPDIR/one" 2>&1); then
  echo "FAIL: a file without a models list was accepted"
  exit 1
fi
grep -qF 'has no "models" list' <<<"$out"
echo "keras_hosts_json_test: passed"
