#!/usr/bin/env bash
# Smoke version of the testbed experiment: 3 workers, every system for a few
# seconds, on a namespace cluster (or loopback, with "SKIPPED: ..." printed
# for the namespace part). Asserts on the structure of results.json: every
# system ran, every push is accounted for (ended exactly once: applied or
# dropped; none failed, as no fault is injected; server count == workers'
# applied count), sync ranks did equal rounds, traffic crossed the shaped
# links, and no time is negative. Not on speed.
set -euo pipefail
root="$TEST_SRCDIR/mlfabric"
out="$TEST_TMPDIR/testbed"
python="${MLFABRIC_VENV:-/opt/mlfabric/venv}/bin/python"
[[ -x "$python" ]] || python=python3
"$root/eval/testbed/mlfabric-testbed" --workers=3 --compute=C2 --network=N3 \
  --systems=mlfabric-a30,mlfabric-s,vanilla,rr-sync,tr-sync --scale_tau=0 \
  --update_bytes=65536 --period_s=1 --duration_s=5 --grace_s=25 --target_accuracy=0.5 \
  --prefix="mlft-t$(($$ % 1000))-" --out="$out" --plots=1 2>&1 | tee "$TEST_TMPDIR/log.txt"
"$python" - "$out/results.json" <<'PY'
import json, os, sys
r = json.load(open(sys.argv[1]))
systems = r["systems"]
if r["config"]["mode"] != "netns" and os.environ.get("MLFABRIC_REQUIRE_PREREQS") == "1":
    sys.exit("FAILED: missing prerequisite (required under CI): network namespaces; the "
             "testbed fell back to loopback")
want = ["mlfabric-a30", "mlfabric-s", "vanilla", "rr-sync", "tr-sync"]
assert list(systems) == want, "systems that ran: %s" % list(systems)
for name, s in systems.items():
    assert not s["error"], "%s: %s" % (name, s["error"])
    assert s["accounted"], "%s: pushes not accounted for: %s" % (name, {k: s.get(k) for k in (
        "pushes", "applied", "dropped", "failed", "server_applied", "workers_finished")})
    assert s["workers_finished"] == 3, name
    assert s["iterations"] > 0 and s["curve"], "%s made no progress" % name
    assert all(t >= 0 for t, _ in s["curve"]), "%s: negative time in its curve" % name
    assert all(0 <= a <= 1 for _, a in s["curve"]), name
    assert all(x >= 0 for x in s["iteration_s"]), name
    assert s["tta_s"] is None or s["tta_s"] >= 0, name
    assert all(d >= 0 for d in s["delays"]), name
    if name in ("mlfabric-a30", "vanilla"):
        assert s["server_applied"] == s["applied"], name
        assert s["pushes"] == s["applied"] + s["dropped"] + s["failed"], name
        # Where the pushes' time went: the workers' view and the
        # scheduler's (its admin endpoint), which must add up.
        if s["applied"]:
            assert s["push_applied_s"] is not None and s["push_applied_s"] > 0, name
            ph = s["scheduler_push_phases"]
            assert ph and ph["applied"] > 0, "%s: no push phases from the scheduler" % name
            assert ph["queued_s"] >= 0 and ph["planned_s"] > 0, "%s: %s" % (name, ph)
            assert abs(ph["queued_s"] + ph["planned_s"] + ph["late_s"] - ph["latency_s"]) < 1e-6, \
                "%s: push phases do not add up: %s" % (name, ph)
    # Nothing here injects a fault (no host, daemon, link or scheduler is
    # stopped, and the shaped links carry every plan), so a failed push is
    # a defect, not an outcome to tolerate.
    assert not s.get("failed"), "%s: %d pushes failed: %s" % (
        name, s["failed"], s.get("fail_reasons"))
    if r["config"]["mode"] == "netns":
        assert s["links"] and all(l["up_bytes"] >= 0 for l in s["links"].values()), name
        moved = sum(l["up_bytes"] for h, l in s["links"].items() if h.startswith("w"))
        assert moved > 65536, "%s: workers sent only %d bytes over the shaped links" % (name, moved)
print("testbed_smoke_test: OK (%s): %s" % (r["config"]["mode"], ", ".join(
    "%s %d iterations" % (n, s["iterations"]) for n, s in systems.items())))
PY
for png in tta iteration drops links; do
  [[ -s "$out/testbed-$png.png" ]] || { echo "missing plot testbed-$png.png"; exit 1; }
done
