"""Reading a testbed run: which systems are which, the push and iteration
phases from the run's logs, and the summary table printed at the end."""
import json
import os

JOB = "tb"  # the job every system runs as


def is_async(system):
    """Systems whose workers push to a parameter server (server.jsonl)."""
    return (system.startswith("mlfabric-a") or system.startswith("mlfabric-ssp") or
            system == "vanilla")


def iteration_phases(logs, window):
    """Where an asynchronous worker's iteration goes (means over all workers).

    A worker's log has, per iteration, its compute time and its push's
    t_push and t_done; `iter_s` runs from one push to the next. With
    --window=1 an iteration is compute, then the push until its outcome,
    then the get of the next model: `get_s` is what is left of the next
    iteration after its compute and this push. With --window=2 the push
    overlaps the next iteration, so get_s is not meaningful there (None).
    """
    applied, dropped, get = [], [], []
    for ev in logs.values():
        iters = {e["iter"]: e for e in ev if e["event"] == "iter"}
        for p in (e for e in ev if e["event"] == "push"):
            wait = p["t_done"] - p["t_push"]
            (applied if p["outcome"] == "applied" else dropped).append(wait)
            nxt = iters.get(p["iter"] + 1)
            if nxt is not None and "compute_s" in nxt:
                get.append(nxt["iter_s"] - nxt["compute_s"] - wait)
    mean = lambda xs: sum(xs) / len(xs) if xs else None
    g = mean(get)
    return {"push_applied_s": mean(applied), "push_dropped_s": mean(dropped),
            "get_s": g if window == 1 and g is not None and g >= 0 else None}


def read_push_phases(d):
    """The job's mean push phases from <d>/delays.json (scheduler view), or None."""
    try:
        with open(os.path.join(d, "delays.json")) as f:
            return json.load(f)["push_phases"].get(JOB)
    except (OSError, ValueError, KeyError):
        return None


def ssp_system(system):
    """(K, tau or None) of "mlfabric-ssp<K>" or "mlfabric-ssp<K>-a<tau>", else None."""
    if not system.startswith("mlfabric-ssp"):
        return None
    k, _, tau = system[len("mlfabric-ssp"):].partition("-a")
    if not k.isdigit() or (tau and not tau.isdigit()) or (_ and not tau):
        return None
    return int(k), int(tau) if tau else None


def backup_workers(system):
    return int(system[len("mlfabric-s-b"):]) if system.startswith("mlfabric-s-b") else 0

def ms(seconds):
    return "%.0f" % (1e3 * seconds) if seconds is not None else "-"


def summary_table(results, target):
    rows = []
    systems = results["systems"]
    ref = systems.get("rr-sync", {}).get("tta_s")
    header = ("system", "TTA s", "vs RR", "final acc", "iters", "mean iter ms", "push ms",
              "get ms", "applied", "dropped", "failed", "delay p50/p99", "ok")
    rows.append(header)
    for name, r in systems.items():
        delays = r.get("delays") or []
        dtxt = "%d/%d" % (delays[len(delays) // 2], delays[min(len(delays) - 1,
                                                               int(0.99 * len(delays)))]) \
            if delays else "-"
        tta = r.get("tta_s")
        rows.append((name, "%.1f" % tta if tta is not None else ">%.0f" % r.get("wall_s", 0),
                     "%.2fx" % (ref / tta) if ref and tta else "-",
                     "%.3f" % r["final_accuracy"] if r.get("final_accuracy") is not None else "-",
                     str(r.get("iterations", 0)),
                     "%.0f" % (1e3 * r["mean_iteration_s"]) if r.get("mean_iteration_s") else "-",
                     ms(r.get("push_applied_s")), ms(r.get("get_s")),
                     str(r.get("applied", 0)), str(r.get("dropped", 0)), str(r.get("failed", 0)),
                     dtxt, "yes" if r.get("accounted") and not r.get("error") else "NO"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                       enumerate(zip(row, widths))) for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    for name, r in systems.items():
        ph = r.get("scheduler_push_phases")
        if ph and ph.get("applied"):
            lines.append("%s: an applied push at the scheduler took %s ms: %s ms waiting for its "
                         "batch, %s ms planned until its bytes reach the server, %s ms later than "
                         "planned (means of %d)" % (
                             name, ms(ph["latency_s"]), ms(ph["queued_s"]), ms(ph["planned_s"]),
                             ms(ph["late_s"]), ph["applied"]))
    return "\n".join(lines) + (
        "\n(TTA: time to %.0f%% test accuracy; vs RR: RR-Sync TTA / TTA; asynchronous "
        "workers: push ms = mean from a push to its outcome, applied ones; get ms = mean "
        "wait for the next model, --window=1 only)" % (100 * target))
