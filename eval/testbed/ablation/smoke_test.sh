#!/usr/bin/env bash
# Smoke versions of the Mercury ablation ("mercury") and the TensorLights
# co-located jobs ("tls"): tiny runs on a namespace cluster (or loopback,
# where the drivers print "SKIPPED: ..." for the shaped part), then checks
# on results.json: every variant ran without error, every push is accounted
# for (issued = applied + dropped + failed, none failed, the servers applied
# what the workers were told), every worker finished its iterations, no
# negative time, and the plots exist. Nothing about speed.
set -euo pipefail
which="$1"
root="$TEST_SRCDIR/mlfabric"
out="$TEST_TMPDIR/$which"
python="${MLFABRIC_VENV:-/opt/mlfabric/venv}/bin/python"
[[ -x "$python" ]] || python=python3
prefix="mlfm-$which${$: -3}-"
prefix="${prefix:0:12}"
if [[ "$which" == mercury ]]; then
  "$root/eval/testbed/ablation/mercury-ablation" --models=resnet50 --variants=prio,fifo,whole,prio+rounds,single \
    --workers=2 --iterations=3 --warmup=1 --byte_scale=200 --prefix="$prefix" --out="$out" \
    --timeout_s=120 2>&1 | tee "$TEST_TMPDIR/log.txt"
else
  "$root/eval/testbed/ablation/tls-colocated" --jobs=2 --workers=2 --iterations=4 --warmup=1 \
    --byte_scale=8 --compute_ms=20 --rr_period_s=0.5 --start_delay_s=1 --prefix="$prefix" \
    --out="$out" --timeout_s=120 2>&1 | tee "$TEST_TMPDIR/log.txt"
fi
"$python" - "$which" "$out/results.json" <<'PY'
import json, math, os, sys
which, path = sys.argv[1], sys.argv[2]
r = json.load(open(path))
runs = r["runs"]
mode = r["config"]["mode"]
if mode != "netns":
    if os.environ.get("MLFABRIC_REQUIRE_PREREQS") == "1":
        sys.exit("FAILED: missing prerequisite (required under CI): network namespaces (%s)"
                 % r["config"]["fallback_reason"])
    print("SKIPPED: namespace part (%s); checked the loopback run only" % r["config"]["fallback_reason"])
if which == "mercury":
    want = ["prio", "fifo", "whole", "prio+rounds", "single"]
    assert [x["variant"] for x in runs] == want, [x["variant"] for x in runs]
    for x in runs:
        s = x["summary"]
        assert not x["error"], "%s: %s" % (x["variant"], x["error"])
        assert s["accounted"], "%s: pushes not accounted for: %s" % (x["variant"], s)
        assert not s["negative_times"], x["variant"]
        layers = len(next(iter(x["workers"].values()))["layers"])
        assert layers == 18, layers  # ResNet-50: stem, 16 blocks, fc
        if x["variant"] == "single":
            # one push of all layers per iteration and worker
            assert s["pushes"] == 2 * 3, s["pushes"]
        else:
            # every layer of every iteration pushed once by each worker
            assert s["pushes"] == 2 * 3 * layers, s["pushes"]
        # rounds: the server sees each round once, counting all its pushes
        assert s["server_applied"] == s["pushes"], s
        for w, wr in x["workers"].items():
            its = wr["iterations"]
            assert [i["iteration"] for i in its] == [0, 1, 2], (w, its)
            assert all(i["iteration_s"] > 0 for i in its), (w, its)
            if x["variant"] != "single":
                assert all(i["front_ready_s"] >= 0 and i["all_ready_s"] >= i["front_ready_s"]
                           for i in its), (w, its)
        assert s["iteration_mean_s"] > 0 and math.isfinite(s["iteration_mean_s"])
else:
    assert [x["variant"] for x in runs] == ["fifo", "one", "rr"], [x["variant"] for x in runs]
    for x in runs:
        s = x["summary"]
        assert not x["error"], "%s: %s" % (x["variant"], x["error"])
        assert s["accounted"], "%s: pushes not accounted for: %s" % (x["variant"], s)
        assert not s["negative_times"], x["variant"]
        assert s["pushes"] == 2 * 2 * 4, s["pushes"]
        assert sorted(s["jct_s"]) == ["j0", "j1"], s["jct_s"]
        assert all(v > 0 for v in s["jct_s"].values()), s["jct_s"]
        assert len(s["barrier_means"]) == 2 * 3, s["barrier_means"]  # 2 jobs x (4 - 1 warm-up)
        assert all(v >= 0 for v in s["barrier_vars"]), s["barrier_vars"]
        for j, e in x["jobs"].items():
            assert e["server"]["barriers_completed"] == 4, (j, e["server"])
        if mode == "netns" and x["variant"] != "fifo":
            assert "--mode=" + x["variant"] in x["nicprio"], x["nicprio"]
print("%s smoke test: OK (%s): %s" % (which, mode, ", ".join(
    "%s %.3f" % (x["variant"], x["summary"].get("iteration_mean_s", x["summary"].get("avg_jct_s")))
    for x in runs)))
PY
for png in $( [[ "$which" == mercury ]] && echo "mercury-iteration mercury-front-layer" || echo "tls-jct tls-barrier"); do
  [[ -s "$out/$png.png" ]] || { echo "missing plot $png.png"; exit 1; }
done
