"""mercury-ablation: packet priorities on/off and whole-tensor transfers.

The Mercury ablation (mercury.md §II-B, §IV, §VI). On an emulated
cluster (scheduler host ``sch``, parameter-server host ``ps``, workers
``w1..wN``; eval/testbed/netns_cluster.py) each worker runs
eval/testbed/apps/profile_worker with a real network's layer sizes
(VGG-16, ResNet-50; scaled by --byte_scale together with the link rate) in
the per-layer pipeline of mercury.md Fig. 1: the backward pass pushes every
layer's gradient as soon as it is produced (last layer first), each layer's
model comes back as soon as its push is applied, and the next forward pass
waits layer by layer for its parameters. Variants:

  prio   Mercury: each push carries tensor priority = layer index, so the
         daemon's packet queue sends a later-produced front layer before the
         queued packets of back layers (packet-level priority, §IV-A);
  fifo   the same pushes with one priority: packets leave in arrival order;
  whole  whole-tensor transfers: one push at a time in production order, the
         next only after the previous one is applied (no interleaving; every
         tensor pays a full submit/plan/ack round, the "startup time" of §III).
  prio+rounds, fifo+rounds
         the same with Mercury PS rounds (§IV Key idea 3): every layer server
         sums the workers' pushes packet by packet in its daemon and streams
         the sum back to gets issued right after the push, so a layer's push
         and pull overlap (synchronous across workers; gets all at once).
  single the plain PS reference: the whole backward pass, then ONE push of
         all layers (tensors with priority = layer index) to one server, then
         one get of the whole model; no overlap of communication with
         computation at all.

Pulls (gets) leave the server's daemon as plain TCP streams without packet
priority; for prio/fifo/whole the worker pulls one layer at a time
(--max_pulls=1), most urgent first for prio and in arrival order otherwise,
which carries the variant's order into the pull direction.

Network: worker NICs at --link_bps (both directions), the PS NIC at
workers x link_bps (the PS is not the bottleneck, as with Mercury's several
PS shards). The daemons tell the scheduler --sched_link_bps (default 10
Gbit/s, the paper's NIC) so that MLfabric's reservations do not serialise
the transfers: the packet queue decides what goes on the wire, which is what
this ablation isolates (with the true rate the scheduler time-slices the
transfers and packet priorities have nothing to reorder; see docs/results.md, Part 2).
The worker namespaces' TCP send buffers are capped (--tcp_wmem_max) so the
queue, not a multi-megabyte socket buffer, holds the backlog.

Writes <out>/results.json, <out>/mercury-*.png (with --plots) and a summary
table. Exit 0 iff every variant ran and every push is accounted for.
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
import netns_cluster  # noqa: E402
import profile_cluster as pc  # noqa: E402

JOB, TOKEN = "mercury", "mercury-token-0123456789"  # >= 16 characters off loopback


def log_tails(out, names, lines=4):
    """The last lines of each of `names`' logs in `out`, for an error that
    must say why without them (a test's logs go with its sandbox)."""
    text = ""
    for name in names:
        path = os.path.join(out, name + ".log")
        tail = open(path).read().splitlines()[-lines:] if os.path.exists(path) else ["(no log)"]
        text += "\n  %s.log: %s" % (name, "\n    ".join(tail) or "(empty)")
    return text


def log_warnings(out, names, lines=8):
    """The last warning and error lines (" W " / " E " after the time) of
    each of `names`' logs in `out`: a variant that hangs says what the
    scheduler and the daemons saw (a round that never filled, a dropped
    push) before its sandbox goes."""
    text = ""
    for name in names:
        path = os.path.join(out, name + ".log")
        if not os.path.exists(path):
            continue
        found = [line for line in open(path, errors="replace").read().splitlines()
                 if " W " in line[:26] or " E " in line[:26]][-lines:]
        if found:
            text += "\n  %s.log warnings:\n    %s" % (name, "\n    ".join(found))
    return text


def run_variant(cluster, args, model, variant, out):
    cp = pc.ControlPlane(cluster, args.bin_root, out)
    # "prio+rounds"/"fifo+rounds": Mercury PS rounds with streamed sums.
    base, rounds = variant.split("+")[0], variant.endswith("+rounds")
    layout = "single" if base == "single" else "per_layer"
    workers = ["w%d" % i for i in range(1, args.workers + 1)]
    result = {"model": model, "variant": variant, "error": "", "workers": {}}
    try:
        cp.start_scheduler("sch", [{"name": JOB, "token": TOKEN, "tau_max": 1000}],
                           planner=args.planner, batch_interval_ms=args.batch_interval_ms,
                           default_link_bps=args.sched_link_bps)
        sockets = {}
        for h in ["ps"] + workers:
            sockets[h], _ = cp.start_daemon(h, h, uplink_bps=args.sched_link_bps,
                                            downlink_bps=args.sched_link_bps,
                                            extra=["--payload_bytes=%d" % args.payload_bytes])
        cp.wait_sockets(sockets.values())
        server_out = os.path.join(out, "server.json")
        cp.popen("ps", "server", [cp.binary("eval/testbed/apps/profile_server"),
                                  "--socket=" + sockets["ps"], "--job=" + JOB,
                                  "--token=" + TOKEN, "--model=" + model,
                                  "--byte_scale=%g" % args.byte_scale, "--layout=" + layout,
                                  "--round_size=%d" % (args.workers if rounds else 0),
                                  "--out=" + server_out])
        pc.wait_until(lambda: "serving" in open(os.path.join(out, "server.log")).read(), 60,
                      "profile_server to register its servers")
        procs = {}
        for w in workers:
            procs[w] = cp.popen(w, w, [cp.binary("eval/testbed/apps/profile_worker"),
                                       "--socket=" + sockets[w], "--name=" + w, "--job=" + JOB,
                                       "--token=" + TOKEN, "--model=" + model,
                                       "--byte_scale=%g" % args.byte_scale,
                                       "--compute_scale=%g" % args.compute_scale,
                                       "--layout=" + layout,
                                       "--variant=" + ("prio" if base == "single" else base),
                                       "--iterations=%d" % args.iterations,
                                       "--max_pulls=%d" % (0 if rounds else args.max_pulls),
                                       "--rounds=%s" % ("true" if rounds else "false"),
                                       "--out=" + os.path.join(out, w + ".json")])
        progress = pc.Progress("%s/%s" % (model, variant))
        deadline = time.time() + args.timeout_s
        while any(p.poll() is None for p in procs.values()):
            if time.time() > deadline:
                ended = {w: p.returncode for w, p in procs.items() if p.poll() is not None}
                raise RuntimeError("workers did not finish within %.0f s (ended: %s)%s"
                                   % (args.timeout_s, ended or "none",
                                      log_tails(out, workers + ["server"]) +
                                      log_warnings(out, ["scheduler", "daemon-ps"] +
                                                   ["daemon-" + w for w in workers])))
            cp.check_alive()
            progress.update("%d/%d workers done" % (
                sum(p.poll() is not None for p in procs.values()), len(procs)))
            time.sleep(0.2)
        cp.stop(["server"])
        codes = {w: p.returncode for w, p in procs.items()}
        for w in workers:
            path = os.path.join(out, w + ".json")
            result["workers"][w] = json.load(open(path)) if os.path.exists(path) else None
        result["server"] = json.load(open(server_out)) if os.path.exists(server_out) else None
        if any(codes.values()):
            result["error"] = "worker exit codes %s (logs in %s)" % (codes, out)
    except Exception as e:  # recorded; the other variants still run
        result["error"] = str(e)
    finally:
        cp.stop_all()
    return summarise(result, args.warmup)


def summarise(result, warmup):
    iters, front, stall, all_ready = [], [], [], []
    issued = applied = dropped = failed = get_failures = 0
    negative = False
    for w, r in result["workers"].items():
        if r is None:
            result["error"] = result["error"] or "%s wrote no results" % w
            continue
        for rec in r["iterations"][warmup:]:
            if "iteration_s" in rec:
                iters.append(rec["iteration_s"])
            # single: the whole model comes back at once, exit - enter after
            # the backward pass.
            back = rec.get("front_ready_s", rec.get("exit_s", 0) - rec.get("enter_s", 0))
            front.append(back)
            all_ready.append(rec.get("all_ready_s", back))
            stall.append(rec.get("next_fp_stall_s", back))
        for rec in r["iterations"]:
            if rec.get("iteration_s", 0) < 0 or rec.get("fp_stall_s", 0) < 0:
                negative = True
        p = r["pushes"]
        issued += p["issued"]
        applied += p["applied"]
        dropped += p["dropped"]
        failed += p["failed"]
        get_failures += r["get_failures"]
    server_applied = (result.get("server") or {}).get("applied", -1)
    result["summary"] = {
        "iterations": len(iters),
        "iteration_mean_s": pc.mean(iters), "iteration_p50_s": pc.percentile(iters, 0.5),
        "iteration_p95_s": pc.percentile(iters, 0.95),
        "front_ready_mean_s": pc.mean(front), "all_ready_mean_s": pc.mean(all_ready),
        "fp_stall_mean_s": pc.mean(stall),
        "pushes": issued, "applied": applied, "dropped": dropped, "failed": failed,
        "get_failures": get_failures, "server_applied": server_applied,
        "accounted": issued == applied + dropped + failed and server_applied == applied
                     and failed == 0 and get_failures == 0,
        "negative_times": negative,
        "iteration_s": iters, "front_ready_s": front,
    }
    return result


def plot(results, out, img_prefix):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = sorted({r["model"] for r in results}, key=lambda m: [r["model"] for r in results].index(m))
    variants = sorted({r["variant"] for r in results},
                      key=lambda v: [r["variant"] for r in results].index(v))
    paths = []
    fig, axes = plt.subplots(1, len(models), figsize=(4.5 * len(models), 3.6), squeeze=False)
    for ax, m in zip(axes[0], models):
        rs = [next(r for r in results if r["model"] == m and r["variant"] == v) for v in variants]
        means = [r["summary"]["iteration_mean_s"] for r in rs]
        p95 = [r["summary"]["iteration_p95_s"] for r in rs]
        x = range(len(variants))
        ax.bar(x, means, color=["#2a7", "#888", "#c63", "#27a", "#777", "#a5c"][:len(variants)])
        ax.errorbar(x, means, yerr=[[0] * len(means), [max(0, b - a) for a, b in zip(means, p95)]],
                    fmt="none", ecolor="k", capsize=4)
        ax.set_xticks(list(x))
        ax.set_xticklabels(variants, rotation=20)
        ax.set_ylabel("iteration time (s), mean; bar to p95")
        ax.set_title("%s profile" % m)
        for i, v in enumerate(means):
            ax.text(i, v, "%.3f" % v, ha="center", va="bottom", fontsize=8)
    fig.tight_layout()
    p = os.path.join(out, img_prefix + "iteration.png")
    fig.savefig(p, dpi=110)
    paths.append(p)
    plt.close(fig)
    fig, axes = plt.subplots(1, len(models), figsize=(4.5 * len(models), 3.6), squeeze=False)
    for ax, m in zip(axes[0], models):
        for v in variants:
            r = next(r for r in results if r["model"] == m and r["variant"] == v)
            xs = sorted(r["summary"]["front_ready_s"])
            if xs:
                ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=v)
        ax.set_xlabel("first layer's model back, s after the backward pass")
        ax.set_ylabel("CDF over iterations")
        ax.set_title("%s profile" % m)
        ax.legend()
    fig.tight_layout()
    p = os.path.join(out, img_prefix + "front-layer.png")
    fig.savefig(p, dpi=110)
    paths.append(p)
    plt.close(fig)
    return paths


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="vgg16,resnet50")
    parser.add_argument("--variants", default="prio,fifo,whole")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2, help="iterations left out of the means")
    parser.add_argument("--byte_scale", type=float, default=50,
                        help="layer bytes / this; the link rate is 10 Gbit/s / this too")
    parser.add_argument("--compute_scale", type=float, default=1.0)
    parser.add_argument("--link_bps", type=float, default=0,
                        help="worker NIC rate (default 10 Gbit/s / byte_scale)")
    parser.add_argument("--sched_link_bps", type=float, default=10e9)
    parser.add_argument("--planner", default="mlfabric", choices=["mlfabric", "fifo"])
    parser.add_argument("--max_pulls", type=int, default=1,
                        help="gets in flight per worker: 1 = one at a time in priority (prio) "
                             "or arrival order; 0 = all at once (fair share on the link)")
    parser.add_argument("--batch_interval_ms", type=float, default=20)
    parser.add_argument("--payload_bytes", type=int, default=32768)
    parser.add_argument("--tcp_wmem_max", type=int, default=131072)
    parser.add_argument("--prefix", default="mlfm-a-")
    parser.add_argument("--mode", default="auto", choices=["auto", "netns", "loopback"])
    parser.add_argument("--timeout_s", type=float, default=600)
    parser.add_argument("--out", default="/tmp/mercury-ablation")
    parser.add_argument("--plots", type=int, default=1)
    parser.add_argument("--img_prefix", default="mercury-")
    parser.add_argument("--bin_root", default=pc.bin_root_default())
    args = parser.parse_args(argv)
    if args.link_bps <= 0:
        args.link_bps = 10e9 / args.byte_scale
    models = args.models.split(",")
    variants = args.variants.split(",")
    for v in variants:
        if v not in ("prio", "fifo", "whole", "prio+rounds", "fifo+rounds", "single"):
            parser.error("--variants: unknown variant %r (prio, fifo, whole, prio+rounds, "
                         "fifo+rounds, single)" % v)
    os.makedirs(args.out, exist_ok=True)
    workers = ["w%d" % i for i in range(1, args.workers + 1)]
    hosts = ["sch", "ps"] + workers
    results = []
    with netns_cluster.Cluster(hosts, prefix=args.prefix, mode=args.mode,
                               rate_bps=args.link_bps) as cluster:
        if cluster.mode != "netns":
            print("SKIPPED: shaped links: %s; running on unshaped loopback (structure only, "
                  "the figures mean nothing)" % cluster.fallback_reason, flush=True)
        else:
            cluster.set_rate("sch", up_bps=10e9, down_bps=10e9)
            cluster.set_rate("ps", up_bps=args.link_bps * args.workers,
                             down_bps=args.link_bps * args.workers)
            for w in workers:
                pc.set_sysctl(cluster, w, "net.ipv4.tcp_wmem", "4096 16384 %d" % args.tcp_wmem_max)
                pc.set_sysctl(cluster, w, "net.ipv4.tcp_limit_output_bytes", args.tcp_wmem_max)
        print("mercury-ablation: %s cluster, %d workers, models %s, variants %s, %d iterations "
              "(%d warm-up), bytes / %g, worker NIC %.3g Mbit/s, PS NIC %.3g Mbit/s, scheduler "
              "told %.3g Gbit/s, compute x %g, max_pulls %d, logs in %s" %
              (cluster.mode, args.workers, ",".join(models), ",".join(variants),
               args.iterations, args.warmup, args.byte_scale, args.link_bps / 1e6,
               args.link_bps * args.workers / 1e6, args.sched_link_bps / 1e9,
               args.compute_scale, args.max_pulls, args.out), flush=True)
        for m in models:
            for v in variants:
                d = os.path.join(args.out, "%s-%s" % (m, v))
                r = run_variant(cluster, args, m, v, d)
                s = r["summary"]
                print("  %-9s %-6s iteration %.3f s (p95 %.3f) | front layer back %.3f s after "
                      "backward | stall %.3f s | pushes %d applied %d dropped %d failed %d%s" %
                      (m, v, s["iteration_mean_s"], s["iteration_p95_s"], s["front_ready_mean_s"],
                       s["fp_stall_mean_s"], s["pushes"], s["applied"], s["dropped"], s["failed"],
                       ("  ERROR: " + r["error"]) if r["error"] else ""), flush=True)
                results.append(r)
                with open(os.path.join(args.out, "results.json"), "w") as f:
                    json.dump({"config": dict(vars(args), mode=cluster.mode,
                                              fallback_reason=cluster.fallback_reason,
                                              machine={"cpus": os.cpu_count(),
                                                       "uname": " ".join(os.uname())}),
                               "runs": results}, f, indent=1)
    print()
    rows = []
    for m in models:
        for v in variants:
            # Each variant against FIFO packets with the same server kind.
            ref = "fifo+rounds" if v.endswith("+rounds") else "fifo"
            base = next((r for r in results if r["model"] == m and r["variant"] == ref), None)
            r = next(r for r in results if r["model"] == m and r["variant"] == v)
            s = r["summary"]
            vs = ("%+.1f%%" % (100 * (s["iteration_mean_s"] / base["summary"]["iteration_mean_s"]
                                   - 1)) if base and v != ref else "")
            rows.append([m, v, "%.3f" % s["iteration_mean_s"], "%.3f" % s["iteration_p50_s"],
                         "%.3f" % s["iteration_p95_s"], vs, "%.3f" % s["front_ready_mean_s"],
                         "%.3f" % s["all_ready_mean_s"], "%.3f" % s["fp_stall_mean_s"],
                         s["iterations"], "yes" if s["accounted"] else "NO"])
    pc.print_table(["model", "variant", "iter mean s", "p50", "p95", "vs fifo(+rounds)", "front back s",
                    "all back s", "fp stall s", "n", "accounted"], rows)
    if args.plots and results:
        for p in plot(results, args.out, args.img_prefix):
            print("plot:", p)
    ok = all(not r["error"] and r["summary"]["accounted"] and not r["summary"]["negative_times"]
             for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
