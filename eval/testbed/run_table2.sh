#!/usr/bin/env bash
# The paper's Table 2 on the emulated testbed: MLfabric-A (delay bound 30,
# scaled to the worker count) against RR-Sync in all nine C x N settings, one
# mlfabric-testbed run per setting, then one table of TTA speedups.
#   eval/testbed/run_table2.sh OUT_DIR [extra mlfabric-testbed flags]
# Uses `bazel run`, or $TESTBED (a mlfabric-testbed command) when set.
set -euo pipefail
out="${1:?usage: run_table2.sh OUT_DIR [flags]}"
shift
mkdir -p "$out"
if [[ -n "${TESTBED:-}" ]]; then
  read -r -a testbed <<<"$TESTBED"
else
  testbed=(bazel run //eval/testbed:mlfabric-testbed --)
fi
for c in C1 C2 C3; do
  for n in N1 N2 N3; do
    "${testbed[@]}" --compute="$c" --network="$n" --systems=mlfabric-a30,rr-sync \
      --out="$out/$c-$n" "$@" || echo "$c-$n: some system failed (see $out/$c-$n)"
  done
done
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
rows = {}
for c in ("C1", "C2", "C3"):
    for n in ("N1", "N2", "N3"):
        path = os.path.join(out, "%s-%s" % (c, n), "results.json")
        if not os.path.exists(path):
            rows[(c, n)] = "missing"
            continue
        s = json.load(open(path))["systems"]
        a = next(v for k, v in s.items() if k.startswith("mlfabric-a"))
        rr = s.get("rr-sync", {})
        if a.get("tta_s") and rr.get("tta_s"):
            rows[(c, n)] = "%.2f (%.0f/%.0f s)" % (rr["tta_s"] / a["tta_s"], rr["tta_s"], a["tta_s"])
        else:
            rows[(c, n)] = "n/a (RR %s, A %s)" % (rr.get("tta_s"), a.get("tta_s"))
lines = ["| | N1 | N2 | N3 |", "| --- | --- | --- | --- |"]
for c in ("C1", "C2", "C3"):
    lines.append("| %s | %s |" % (c, " | ".join(rows[(c, n)] for n in ("N1", "N2", "N3"))))
text = "MLfabric-A TTA speedup over RR-Sync (RR-Sync TTA / MLfabric-A TTA):\n" + "\n".join(lines)
print(text)
open(os.path.join(out, "table2.md"), "w").write(text + "\n")
PY
