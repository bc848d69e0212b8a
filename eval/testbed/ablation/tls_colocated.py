"""tls-colocated: co-located PS jobs under FIFO, TLs-One and TLs-RR.

TensorLights co-located jobs (tensorlights.md §III-V). --jobs synchronous PS jobs
run at once: all their parameter servers on one host ``ps`` (placement #1 of
Table I, the heaviest contention), their workers spread over ``w1..wW`` (one
worker of every job on every worker host, as in §III). Each job is
eval/testbed/apps/profile_server + profile_worker with ResNet-32's layer
sizes (the paper's model; bytes / --byte_scale), --compute_ms of compute per
iteration and a barrier per iteration: a worker pushes its gradient, waits
until every worker of its job has pushed, then gets the model. Each job
runs --iterations iterations; all start at the same wall-clock instant.

Where the priority is applied: on the PS host's NIC, with
mlfabric-nicprio (htb classes + u32 port filters, §V "Implementation"),
because in MLfabric the traffic TensorLights regulates -- the model updates
the PSes send to their workers (§IV-B) -- is the get replies of the servers'
daemons, which leave through the daemon's data socket and not through its
packet queue (mlfabricd --job_priority orders only queued pushes). Each job's
server has its own daemon on ``ps`` (data port 7000+k, barrier port 7100+k),
so a job is recognised by its PS port exactly as TensorLights does with
TensorFlow's PS ports. Variants:

  fifo  the PS NIC is one htb class (netns_cluster's shaping): packets of all
        jobs share one FIFO -- the paper's baseline;
  one   TLs-One: strict job priority, job 0 highest (ranking fixed; all jobs
        arrive together);
  rr    TLs-RR: the ranking rotates every --rr_period_s.
  one+in, rr+in
        the same, and also on the switch port feeding the PS (the gradients
        the workers push, matched by destination port): an extension, not
        the paper's design (§IV-B relies on the outbound priority to pace the
        inbound traffic indirectly).

Reports average job completion time (JCT) and the mean and variance of the
barrier wait time (per barrier, across the workers of a job; §III
Observation #2, Fig. 3/6). Writes <out>/results.json, tls-*.png (--plots)
and a summary table. Exit 0 iff every variant ran and every push is
accounted for.
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
import netns_cluster  # noqa: E402
import profile_cluster as pc  # noqa: E402

DATA_PORT, BARRIER_PORT = 7000, 7100


def job_name(k):
    return "j%d" % k


def in_switch(cluster, argv):
    """argv run inside the switch namespace (the PS's switch port, p-ps)."""
    return ["ip", "netns", "exec", cluster.ns_of_switch()] + list(argv)


def shape_ps_fifo(cluster, rate_bps):
    """(Re)installs netns_cluster's single-class htb on both PS directions:
    the PS uplink (veth0 in ps) and its downlink (port p-ps on the switch)."""
    if cluster.mode != "netns":
        return
    for wrap, dev in ((lambda a: cluster.wrap("ps", a), cluster.ifname),
                      (lambda a: in_switch(cluster, a), "p-ps")):
        netns_cluster._sh(wrap(["tc", "qdisc", "del", "dev", dev, "root"]), check=False)
        netns_cluster._sh(wrap(["tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb",
                                "default", "10"]))
        netns_cluster._sh(wrap(["tc", "class", "add", "dev", dev, "parent", "1:", "classid",
                                "1:10", "htb", "rate", "%dbit" % rate_bps, "ceil",
                                "%dbit" % rate_bps]))


def run_variant(cluster, args, variant, out):
    cp = pc.ControlPlane(cluster, args.bin_root, out)
    workers = ["w%d" % i for i in range(1, args.workers + 1)]
    jobs = [job_name(k) for k in range(args.jobs)]
    result = {"variant": variant, "error": "", "jobs": {}, "nicprio": ""}
    # "one+in"/"rr+in": also prioritise the gradients INTO the PS, on the
    # switch port that feeds it (not in the paper, which relies on the
    # outbound priority pacing the inbound traffic indirectly, §IV-B).
    mode, inbound = variant.split("+")[0], variant.endswith("+in")
    nicprio = None
    nicprio_in = None
    try:
        cp.start_scheduler("sch", [{"name": j, "token": j + "-token-0123456789", "tau_max": 1000}
                                   for j in jobs],
                           planner=args.planner, batch_interval_ms=args.batch_interval_ms,
                           default_link_bps=args.sched_link_bps)
        sockets, ports = {}, {}
        for k, j in enumerate(jobs):
            sockets["ps-" + j], ports[j] = cp.start_daemon(
                "ps-" + j, "ps", data_port=DATA_PORT + k, uplink_bps=args.sched_link_bps,
                downlink_bps=args.sched_link_bps)
        for w in workers:
            sockets[w], _ = cp.start_daemon(w, w, uplink_bps=args.sched_link_bps,
                                            downlink_bps=args.sched_link_bps)
        cp.wait_sockets(sockets.values())
        if mode in ("one", "rr"):
            if cluster.mode != "netns":
                result["nicprio"] = "not installed (loopback)"
            else:
                def nicprio_argv(interface):
                    argv = [cp.binary("daemon/nicprio/mlfabric-nicprio"),
                            "--interface=" + interface, "--mode=" + mode,
                            "--period_s=%g" % args.rr_period_s,
                            "--link_rate_bps=%d" % args.link_bps,
                            "--min_rate_bps=%d" % args.nicprio_min_rate_bps]
                    for k, j in enumerate(jobs):
                        argv.append("--job=%s:%d,%d" % (j, ports[j], BARRIER_PORT + k))
                    return argv
                cluster.run("ps", ["tc", "qdisc", "del", "dev", cluster.ifname, "root"])
                argv = nicprio_argv(cluster.ifname)
                nicprio = cp.popen("ps", "nicprio", argv)
                pc.wait_until(lambda: "1:10" in cluster.run(
                    "ps", ["tc", "class", "show", "dev", cluster.ifname]).stdout, 30,
                    "mlfabric-nicprio to install its classes")
                result["nicprio"] = " ".join(argv[1:])
                if inbound:
                    netns_cluster._sh(in_switch(cluster, ["tc", "qdisc", "del", "dev", "p-ps",
                                                          "root"]))
                    argv = nicprio_argv("p-ps")
                    nicprio_in = subprocess.Popen(
                        in_switch(cluster, argv), stdout=cp.log("nicprio-in"),
                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                        start_new_session=True)
                    cp.started.append(("nicprio-in", nicprio_in))
                    pc.wait_until(lambda: "1:10" in netns_cluster._sh(in_switch(
                        cluster, ["tc", "class", "show", "dev", "p-ps"])).stdout, 30,
                        "mlfabric-nicprio to install its classes on p-ps")
                    result["nicprio"] += " ; switch port: " + " ".join(argv[1:])
        barrier_host = cluster.ip("ps")
        for k, j in enumerate(jobs):
            cp.popen("ps", "server-" + j, [
                cp.binary("eval/testbed/apps/profile_server"), "--socket=" + sockets["ps-" + j],
                "--job=" + j, "--token=" + j + "-token-0123456789", "--model=" + args.model,
                "--byte_scale=%g" % args.byte_scale, "--layout=single",
                "--barrier_address=" + barrier_host,
                "--barrier_port=%d" % (BARRIER_PORT + k if cluster.mode == "netns"
                                       else ports.setdefault("barrier-" + j, pc.free_port())),
                "--barrier_workers=%d" % args.workers,
                "--out=" + os.path.join(out, "server-%s.json" % j)])
        for j in jobs:
            pc.wait_until(lambda: "serving" in open(os.path.join(out, "server-%s.log" % j)).read(),
                          60, "profile_server of %s" % j)
        tcp_before = pc.tcp_counters(cluster, "ps")
        start_at = time.time() + args.start_delay_s
        procs = {}
        for k, j in enumerate(jobs):
            port = BARRIER_PORT + k if cluster.mode == "netns" else ports["barrier-" + j]
            for w in workers:
                name = "%s-%s" % (j, w)
                procs[name] = cp.popen(w, name, [
                    cp.binary("eval/testbed/apps/profile_worker"), "--socket=" + sockets[w],
                    "--name=" + name, "--job=" + j, "--token=" + j + "-token-0123456789",
                    "--model=" + args.model, "--byte_scale=%g" % args.byte_scale,
                    "--compute_total_s=%g" % (args.compute_ms / 1e3), "--layout=single",
                    "--variant=prio", "--iterations=%d" % args.iterations,
                    "--barrier=%s:%d" % (barrier_host, port), "--start_at_unix=%.3f" % start_at,
                    "--out=" + os.path.join(out, name + ".json")])
        progress = pc.Progress("tls/" + variant)
        deadline = time.time() + args.timeout_s
        while any(p.poll() is None for p in procs.values()):
            if time.time() > deadline:
                raise RuntimeError("workers did not finish within %.0f s" % args.timeout_s)
            cp.check_alive()
            for name, proc in (("nicprio", nicprio), ("nicprio-in", nicprio_in)):
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError("mlfabric-nicprio exited (code %s); see %s/%s.log"
                                       % (proc.returncode, out, name))
            progress.update("%d/%d workers done" % (
                sum(p.poll() is not None for p in procs.values()), len(procs)))
            time.sleep(0.2)
        result["ps_tcp"] = pc.counter_delta(tcp_before, pc.tcp_counters(cluster, "ps"))
        cp.stop(["server-" + j for j in jobs])
        codes = {n: p.returncode for n, p in procs.items()}
        for j in jobs:
            server_path = os.path.join(out, "server-%s.json" % j)
            entry = {"workers": {}, "server": json.load(open(server_path))
                     if os.path.exists(server_path) else None}
            for w in workers:
                path = os.path.join(out, "%s-%s.json" % (j, w))
                entry["workers"][w] = json.load(open(path)) if os.path.exists(path) else None
            result["jobs"][j] = entry
        if any(codes.values()):
            result["error"] = "worker exit codes %s (logs in %s)" % (codes, out)
        result["start_unix"] = start_at
    except Exception as e:  # recorded; the other variants still run
        result["error"] = str(e)
    finally:
        cp.stop_all()  # nicprio removes its qdisc on SIGTERM
        shape_ps_fifo(cluster, args.link_bps)
    return summarise(result, args)


def summarise(result, args):
    jcts, barrier_means, barrier_vars, negative = {}, [], [], False
    issued = applied = dropped = failed = get_failures = server_applied = 0
    for j, entry in result["jobs"].items():
        ends, per_iteration = [], {}
        for w, r in entry["workers"].items():
            if r is None:
                result["error"] = result["error"] or "%s-%s wrote no results" % (j, w)
                continue
            if len(r["iterations"]) != args.iterations:
                result["error"] = result["error"] or "%s-%s finished %d of %d iterations" % (
                    j, w, len(r["iterations"]), args.iterations)
            ends.append(r["end_unix"])
            for rec in r["iterations"]:
                per_iteration.setdefault(rec["iteration"], []).append(rec["barrier_wait_s"])
                if rec["barrier_wait_s"] < 0 or rec["iteration_s"] < 0:
                    negative = True
            p = r["pushes"]
            issued += p["issued"]
            applied += p["applied"]
            dropped += p["dropped"]
            failed += p["failed"]
            get_failures += r["get_failures"]
        server_applied += (entry["server"] or {}).get("applied", 0)
        if ends:
            jcts[j] = max(ends) - result.get("start_unix", min(ends))
        for it, waits in sorted(per_iteration.items()):
            if it < args.warmup or len(waits) < 2:
                continue
            barrier_means.append(pc.mean(waits))
            barrier_vars.append(pc.variance(waits))
    result["summary"] = {
        "jct_s": jcts, "avg_jct_s": pc.mean(list(jcts.values())),
        "max_jct_s": max(jcts.values()) if jcts else float("nan"),
        "barrier_mean_s": pc.mean(barrier_means),
        "barrier_var_mean_s2": pc.mean(barrier_vars),
        "barrier_var_median_s2": pc.percentile(barrier_vars, 0.5),
        "barrier_means": barrier_means, "barrier_vars": barrier_vars,
        "pushes": issued, "applied": applied, "dropped": dropped, "failed": failed,
        "get_failures": get_failures, "server_applied": server_applied,
        "accounted": (issued == applied + dropped + failed and applied == server_applied and
                      failed == 0 and get_failures == 0 and
                      issued == args.jobs * args.workers * args.iterations),
        "negative_times": negative,
    }
    return result


def plot(results, out, img_prefix):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [r["variant"] for r in results]
    label = {"fifo": "FIFO", "one": "TLs-One", "rr": "TLs-RR", "one+in": "TLs-One\n+inbound",
             "rr+in": "TLs-RR\n+inbound"}
    paths = []
    fifo = next((r for r in results if r["variant"] == "fifo"), None)
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for i, r in enumerate(results):
        jct = r["summary"]["jct_s"]
        base = fifo["summary"]["jct_s"] if fifo else None
        vals = [jct[j] / base[j] if base and j in base else jct[j] for j in sorted(jct)]
        ax.bar(i, sum(vals) / len(vals) if vals else 0, color="#9bd", width=0.6)
        ax.scatter([i] * len(vals), vals, color="k", s=14, zorder=3)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([label.get(n, n) for n in names])
    ax.set_ylabel("JCT normalised to FIFO" if fifo else "JCT (s)")
    ax.set_title("Co-located PS jobs: job completion time\n(bar: average; dots: jobs)")
    fig.tight_layout()
    p = os.path.join(out, img_prefix + "jct.png")
    fig.savefig(p, dpi=110)
    paths.append(p)
    plt.close(fig)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for r in results:
        for ax, key in zip(axes, ("barrier_means", "barrier_vars")):
            xs = sorted(r["summary"][key])
            if xs:
                ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))],
                        label=label.get(r["variant"], r["variant"]))
    axes[0].set_xlabel("mean barrier wait per barrier (s)")
    axes[1].set_xlabel("variance of barrier wait per barrier (s^2, log scale)")
    axes[1].set_xscale("symlog", linthresh=1e-5)
    for ax in axes:
        ax.set_ylabel("CDF over barriers")
        ax.legend()
    fig.tight_layout()
    p = os.path.join(out, img_prefix + "barrier.png")
    fig.savefig(p, dpi=110)
    paths.append(p)
    plt.close(fig)
    return paths


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", default="fifo,one,rr")
    parser.add_argument("--jobs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=3, help="worker hosts = workers per job")
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=2,
                        help="barriers left out of the barrier statistics")
    parser.add_argument("--model", default="resnet32")
    parser.add_argument("--byte_scale", type=float, default=4)
    parser.add_argument("--compute_ms", type=float, default=50,
                        help="forward + backward time per iteration (smaller = heavier contention)")
    parser.add_argument("--link_bps", type=float, default=100e6, help="every NIC, both directions")
    parser.add_argument("--sched_link_bps", type=float, default=10e9)
    parser.add_argument("--rr_period_s", type=float, default=5.0)
    parser.add_argument("--nicprio_min_rate_bps", type=float, default=1e6,
                        help="rate every job class is guaranteed (mlfabric-nicprio --min_rate_bps)")
    parser.add_argument("--planner", default="mlfabric", choices=["mlfabric", "fifo"])
    parser.add_argument("--batch_interval_ms", type=float, default=20)
    parser.add_argument("--start_delay_s", type=float, default=3.0)
    parser.add_argument("--prefix", default="mlfm-t-")
    parser.add_argument("--mode", default="auto", choices=["auto", "netns", "loopback"])
    parser.add_argument("--timeout_s", type=float, default=900)
    parser.add_argument("--out", default="/tmp/tls-colocated")
    parser.add_argument("--plots", type=int, default=1)
    parser.add_argument("--img_prefix", default="tls-")
    parser.add_argument("--bin_root", default=pc.bin_root_default())
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    for v in variants:
        if v not in ("fifo", "one", "rr", "one+in", "rr+in"):
            parser.error("--variants: unknown variant %r (fifo, one, rr, one+in, rr+in)" % v)
    if args.jobs < 1 or args.workers < 1 or args.iterations <= args.warmup:
        parser.error("need --jobs >= 1, --workers >= 1 and --iterations > --warmup")
    os.makedirs(args.out, exist_ok=True)
    workers = ["w%d" % i for i in range(1, args.workers + 1)]
    results = []
    with netns_cluster.Cluster(["sch", "ps"] + workers, prefix=args.prefix, mode=args.mode,
                               rate_bps=args.link_bps) as cluster:
        if cluster.mode != "netns":
            print("SKIPPED: shaped links and NIC priorities: %s; running on unshaped loopback "
                  "(structure only; one/rr install no tc classes)" % cluster.fallback_reason,
                  flush=True)
        else:
            cluster.set_rate("sch", up_bps=10e9, down_bps=10e9)
        print("tls-colocated: %s cluster, %d jobs x %d workers, PSes co-located on ps, %s bytes "
              "/ %g, compute %g ms, NICs %.3g Mbit/s, %d iterations per job, TLs-RR period %g s, "
              "variants %s, logs in %s" %
              (cluster.mode, args.jobs, args.workers, args.model, args.byte_scale,
               args.compute_ms, args.link_bps / 1e6, args.iterations, args.rr_period_s,
               ",".join(variants), args.out), flush=True)
        for v in variants:
            r = run_variant(cluster, args, v, os.path.join(args.out, v))
            s = r["summary"]
            print("  %-5s avg JCT %.2f s (max %.2f) | barrier wait mean %.4f s, variance mean "
                  "%.3g s^2 | pushes %d applied %d failed %d | PS host TCP %s%s" %
                  (v, s["avg_jct_s"], s["max_jct_s"], s["barrier_mean_s"],
                   s["barrier_var_mean_s2"], s["pushes"], s["applied"], s["failed"],
                   r.get("ps_tcp", {}),
                   ("  ERROR: " + r["error"]) if r["error"] else ""), flush=True)
            results.append(r)
            with open(os.path.join(args.out, "results.json"), "w") as f:
                json.dump({"config": dict(vars(args), mode=cluster.mode,
                                          fallback_reason=cluster.fallback_reason,
                                          machine={"cpus": os.cpu_count(),
                                                   "uname": " ".join(os.uname())}),
                           "runs": results}, f, indent=1)
    print()
    fifo = next((r for r in results if r["variant"] == "fifo"), None)
    rows = []
    for r in results:
        s = r["summary"]
        gain = ("%.1f%%" % (100 * (1 - s["avg_jct_s"] / fifo["summary"]["avg_jct_s"]))
                if fifo and r is not fifo else "")
        rows.append([r["variant"], "%.2f" % s["avg_jct_s"], gain,
                     " ".join("%.1f" % s["jct_s"][j] for j in sorted(s["jct_s"])),
                     "%.4f" % s["barrier_mean_s"], "%.3g" % s["barrier_var_mean_s2"],
                     "%.3g" % s["barrier_var_median_s2"], "yes" if s["accounted"] else "NO"])
    pc.print_table(["variant", "avg JCT s", "better than FIFO", "per-job JCT s",
                    "barrier mean s", "barrier var mean s^2", "var median s^2", "accounted"],
                   rows)
    if args.plots and results:
        for p in plot(results, args.out, args.img_prefix):
            print("plot:", p)
    ok = all(not r["error"] and r["summary"]["accounted"] and not r["summary"]["negative_times"]
             for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
