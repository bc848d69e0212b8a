"""mlfabric-testbed: the emulated-testbed experiment, one command.

Builds an emulated cluster (netns_cluster.Cluster: scheduler host ``sch``,
server host ``s1``, replica host ``r1``, workers ``w1..wN``), then runs each
system in turn on the same shaped links, with the same N-trace replayed from
its start (same seeds) and the same compute stragglers:

  mlfabric-a<tau>  async PS, MLfabric planner, delay bound tau
  vanilla          async PS, FIFO planner (`mlfabric-scheduler --planner=fifo`)
  mlfabric-s       sync SGD, api/allreduce.h backend "mlfabric"
  mlfabric-s-b<b>  the same with b backup workers: each round sums the first
                   N - b gradients; late ones are left out
  mlfabric-ssp<K>  async PS in stale-synchronous mode: a worker more than K
                   pushes ahead of the slowest waits at its get;
                   like mlfabric-a, it may aggregate on the workers' hosts;
                   delay bound: the paper's 30, scaled like mlfabric-a30
  mlfabric-ssp<K>-a<tau>  the same with delay bound tau (scaled the same way)
  rr-sync          sync SGD, Open MPI MPI_Allreduce, ring (tuned algorithm 4)
  tr-sync          sync SGD, Open MPI MPI_Allreduce as tuned reduce + bcast
                   (algorithm 2 "nonoverlapping", binomial reduce and bcast)

The N-trace (mlfabric.md §7: every T s each worker NIC direction draws a rate
from {1, 2.5, 3.3, 5, 10} Gbit/s x scale) is applied twice from the same
formula: to the htb classes (the links really change) and, through each
daemon's --monitor_trace, to what the scheduler is told (the paper's monitor).
The scale keeps the paper's ResNet-50 communication/computation ratio: the
update is --update_bytes instead of 100 MB, so rates are multiplied by
update_bytes / 100 MB while compute stays 100 ms per iteration (README).

Writes <out>/results.json, <out>/<system>/ logs, PNG plots and prints a
summary table. Exit code 0 iff every system ran and every push is accounted
for (applied or dropped with a reason, none failed).
"""

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns_cluster  # noqa: E402
from testbed_results import (  # noqa: E402
    JOB, backup_workers, is_async, iteration_phases, read_push_phases, ssp_system,
    summary_table)
from testbed_traces import NETWORK, TraceDriver, capacity_integral  # noqa: E402

COMPUTE = {"C0": (0, 1), "C1": (0.10, 2), "C2": (0.10, 4), "C3": (0.04, 2)}  # (r, s)
PAPER_UPDATE_BYTES = 100e6  # ResNet-50 (§7.1)
PAPER_NIC_BPS = 10e9
TOKEN = "tb-token-0123456789"  # >= 16 characters off loopback


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def read_events(path):
    events = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    events.append(json.loads(line))
    return events


def wait_until(predicate, timeout_s, what):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise RuntimeError("timed out after %.0f s waiting for %s" % (timeout_s, what))


class Progress:
    """One self-overwriting status line on stderr (plain lines if not a tty)."""

    def __init__(self, label, total_s):
        self.label, self.total_s = label, total_s
        self.tty = sys.stderr.isatty()
        self.last_plain = 0

    def update(self, elapsed_s, text):
        frac = min(1.0, elapsed_s / self.total_s) if self.total_s > 0 else 1.0
        bar = "#" * int(frac * 30) + "-" * (30 - int(frac * 30))
        line = "%-14s [%s] %5.1fs/%-5.0fs %s" % (self.label, bar, elapsed_s, self.total_s, text)
        if self.tty:
            sys.stderr.write("\r" + line[:150].ljust(150))
            sys.stderr.flush()
        elif elapsed_s - self.last_plain >= 5:
            self.last_plain = elapsed_s
            sys.stderr.write(line + "\n")

    def done(self):
        if self.tty:
            sys.stderr.write("\n")


class Testbed:
    def __init__(self, args):
        self.args = args
        self.bin_root = args.bin_root
        self.workers = ["w%d" % i for i in range(1, args.workers + 1)]
        self.hosts = ["sch", "s1", "r1"] + self.workers
        # Bandwidth scale: the update is update_bytes instead of ResNet-50's
        # 100 MB; scaling every NIC rate by the same factor keeps the time of
        # one update transfer at a given trace rate, hence the paper's
        # communication/computation ratio at the same 100 ms compute time.
        self.scale = args.update_bytes / PAPER_UPDATE_BYTES
        self.server_bps = PAPER_NIC_BPS * self.scale  # dedicated 10 Gbit/s server (§7)
        self.seeds = {h: args.seed * 1000 + i for i, h in enumerate(self.workers, 1)}
        self.cluster = None
        self.socket_dirs = []

    def binary(self, rel):
        path = os.path.join(self.bin_root, rel)
        if not os.path.exists(path):
            raise RuntimeError("binary %s not found under %s (build it, or pass --bin_root)"
                               % (rel, self.bin_root))
        return path

    # ------------------------------------------------------------------ run
    def run(self):
        a = self.args
        os.makedirs(a.out, exist_ok=True)
        self.cluster = netns_cluster.Cluster(self.hosts, prefix=a.prefix, subnet=a.subnet,
                                             mode=a.mode, rate_bps=self.server_bps)
        self.cluster.create()
        try:
            if self.cluster.mode != "netns":
                print("SKIPPED: network namespaces: %s; falling back to loopback: links are "
                      "not shaped by tc; MLfabric systems are paced by their daemons to the "
                      "scheduler's plan of the same N-trace, Open MPI runs unshaped"
                      % self.cluster.fallback_reason, flush=True)
            print("mlfabric-testbed: %s cluster (%s), %d workers, %s-%s, T=%gs, update %d bytes, "
                  "bandwidth scale %.5g (10 Gbit/s -> %.3g Mbit/s), compute %g ms, target "
                  "accuracy %.2f, up to %gs per system, logs in %s" %
                  (self.cluster.mode, a.prefix, a.workers, a.compute, a.network, a.period_s,
                   a.update_bytes, self.scale, self.server_bps / 1e6, a.compute_s * 1e3,
                   a.target_accuracy, a.duration_s, a.out), flush=True)
            results = {"config": self.config_json(), "systems": {}}
            for system in a.systems:
                results["systems"][system] = self.run_system(system)
                with open(os.path.join(a.out, "results.json"), "w") as f:
                    json.dump(results, f, indent=1)
        finally:
            self.cluster.destroy()
            for sock_dir in self.socket_dirs:
                shutil.rmtree(sock_dir, ignore_errors=True)
        return results

    def config_json(self):
        a = self.args
        return {"workers": a.workers, "compute": a.compute, "compute_rs": COMPUTE[a.compute],
                "network": a.network, "network_p": NETWORK[a.network], "period_s": a.period_s,
                "update_bytes": a.update_bytes, "bandwidth_scale": self.scale,
                "server_bps": self.server_bps, "compute_s": a.compute_s,
                "target_accuracy": a.target_accuracy, "duration_s": a.duration_s,
                "seed": a.seed, "mode": self.cluster.mode, "window": a.window,
                "allreduce_pieces": a.allreduce_pieces,
                "fallback_reason": self.cluster.fallback_reason, "prefix": a.prefix,
                "systems": a.systems, "machine": {"cpus": os.cpu_count(),
                                                  "uname": " ".join(os.uname())}}

    def app_flags(self):
        a = self.args
        return ["--seed=%d" % a.seed, "--compute=%s" % a.compute, "--compute_s=%g" % a.compute_s,
                "--workers=%d" % a.workers, "--update_bytes=%d" % a.update_bytes,
                "--duration_s=%g" % a.duration_s, "--target_accuracy=%g" % a.target_accuracy,
                "--job=" + JOB, "--job_token=" + TOKEN]

    def run_system(self, system):
        a = self.args
        d = os.path.join(a.out, system)
        if os.path.exists(d):
            shutil.rmtree(d)
        os.makedirs(d)
        started = []
        driver = TraceDriver(self.cluster, self.workers, a.network, self.seeds, a.period_s,
                             self.scale)
        for h in self.hosts:  # every system starts from the same link state
            self.cluster.set_rate(h, self.server_bps, self.server_bps)
        counters_before = self.cluster.link_bytes()
        t_begin = time.time()
        error = ""
        try:
            mpi = system in ("rr-sync", "tr-sync")
            if not mpi:
                self.start_control_plane(system, d, started)
            driver.start()
            if is_async(system):
                self.run_async(system, d, started)
            elif system.startswith("mlfabric-s"):
                self.run_sync_mlfabric(d, started, backup_workers(system))
            else:
                self.run_mpi(system, d, started)
        except Exception as e:  # recorded; the other systems still run
            error = str(e)
            print("\n%s: ERROR: %s" % (system, error), flush=True)
        finally:
            driver.stop()
            self.stop_all(started)
        t_end = time.time()
        counters_after = self.cluster.link_bytes()
        result = self.collect(system, d, t_begin, t_end, driver, counters_before,
                              counters_after)
        if driver.error:
            error = error or "trace driver: " + driver.error
        result["error"] = error
        result["mpi_launch_retries"] = getattr(self, "mpi_launch_retries", 0)
        self.mpi_launch_retries = 0
        return result

    # ------------------------------------------------------ control plane
    def start_control_plane(self, system, d, started):
        a = self.args
        planner = "fifo" if system == "vanilla" else "mlfabric"
        ssp = system.startswith("mlfabric-ssp")
        mode = "ssp" if ssp else "sync" if system.startswith("mlfabric-s") else "async"
        # ssp: K bounds iterations; versions are bounded by tau_max as for
        # MLfabric-A at this scale (30 scaled by workers / 30).
        # mlfabric-ssp<K>-a<tau> names the bound (already scaled, as
        # mlfabric-a<tau> is by parse_args).
        ssp_tau = ssp_system(system)[1] if ssp else None
        tau = (int(system[len("mlfabric-a"):]) if system.startswith("mlfabric-a") else
               ssp_tau if ssp_tau is not None else
               (max(1, round(30 * a.workers / 30)) if a.scale_tau else 30) if ssp else 1000000)
        port = 50051 if self.cluster.mode == "netns" else free_port()
        config = {"listen_address": "0.0.0.0", "grpc_port": port,
                  "port_file": os.path.join(d, "scheduler.port"), "planner": planner,
                  "log_level": "warning", "transfer_slack_s": 30,
                  # The admin endpoint, on the scheduler's host only: where
                  # each applied push's time went (fetch_push_phases).
                  "admin_port": 0, "admin_port_file": os.path.join(d, "admin.port"),
                  "default_link_bps": self.server_bps,
                  "jobs": [{"name": JOB, "token": TOKEN, "mode": mode, "tau_max": tau}]}
        # Hosts authenticate with a cluster secret made for this run (a
        # scheduler off loopback refuses to start without one).
        secret_file = os.path.join(d, "cluster.secret")
        with open(os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        config["cluster_secret_file"] = secret_file
        for item in a.scheduler_set:
            key, _, value = item.partition("=")
            config[key] = json.loads(value)
        if ssp:
            config["jobs"][0]["staleness_k"] = ssp_system(system)[0]
        if (system.startswith("mlfabric-a") or ssp) and a.aggregators:
            # §7: aggregators co-hosted with the workers (the simulator's
            # default k = every worker machine). SSP's workers are
            # MLfabric-A's with iteration clocks: the same network help.
            config["jobs"][0]["aggregators"] = list(self.workers)
        with open(os.path.join(d, "scheduler.json"), "w") as f:
            json.dump(config, f, indent=1)
        started.append(("scheduler", self.cluster.popen(
            "sch", [self.binary("scheduler/mlfabric-scheduler"), "--config",
                    os.path.join(d, "scheduler.json")],
            stdout=open(os.path.join(d, "scheduler.log"), "w"), stderr=subprocess.STDOUT)))
        wait_until(lambda: os.path.exists(config["port_file"]) and
                   open(config["port_file"]).read().strip(), 30, "the scheduler's port file")
        scheduler = "%s:%d" % (self.cluster.ip("sch"), port)
        self.sockets = {}
        # Unix socket paths are limited to 107 bytes; the results directory
        # (e.g. a Bazel test's TEST_TMPDIR) can be longer.
        sock_dir = tempfile.mkdtemp(prefix="mlft-sock-")
        self.socket_dirs.append(sock_dir)
        for h in ["s1"] + self.workers:
            sock = os.path.join(sock_dir, h + ".sock")
            self.sockets[h] = sock
            argv = [self.binary("daemon/mlfabricd"), "--host=" + h, "--scheduler=" + scheduler,
                    "--listen_address=" + self.cluster.ip(h), "--data_port=0",
                    "--local_socket=" + sock, "--log_level=warning",
                    "--cluster_secret_file=" + secret_file,
                    "--uplink_bps=%d" % self.server_bps, "--downlink_bps=%d" % self.server_bps]
            argv += a.daemon_arg
            if h in self.seeds:
                argv.append("--monitor_trace=%s,seed=%d,period_s=%g,scale=%g" % (
                    a.network.lower(), self.seeds[h], a.period_s, self.scale)
                    if a.network != "N0" else "--monitor_period_s=0.1")
                argv.append("--report_lag_s=%g" % a.report_lag_s)
            started.append(("daemon " + h, self.cluster.popen(
                h, argv, stdout=open(os.path.join(d, h + ".log"), "w"),
                stderr=subprocess.STDOUT)))
        def daemons_up():
            for name, proc in started:
                if name.startswith("daemon") and proc.poll() is not None:
                    log = os.path.join(d, name.split()[1] + ".log")
                    first = open(log).readline().strip() if os.path.exists(log) else ""
                    raise RuntimeError("%s exited with code %s: %s" % (name, proc.poll(), first))
            return all(os.path.exists(s) for s in self.sockets.values())
        wait_until(daemons_up, 30, "the daemons' local sockets")

    def app(self, host, name, argv, d, env=None):
        return self.cluster.popen(host, argv, stdout=open(os.path.join(d, name + ".log"), "w"),
                                  stderr=subprocess.STDOUT, env=env)

    def stop_all(self, started):
        for name, proc in reversed(started):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for name, proc in reversed(started):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        # Open MPI's orted daemonizes out of mpirun's process group: nothing
        # of this system may survive into the next one.
        self.cluster.kill_all()

    def watch(self, system, procs, accuracy_file, started, budget_s):
        """Waits for procs, showing progress; returns their exit codes."""
        progress = Progress(system, self.args.duration_s)
        t0 = time.time()
        while any(p.poll() is None for p in procs):
            if time.time() - t0 > budget_s:
                raise RuntimeError("%s did not finish within %.0f s" % (system, budget_s))
            for name, p in started:
                if name.startswith(("daemon", "scheduler")) and p.poll() is not None:
                    raise RuntimeError("%s exited early (code %s); see its log" % (name, p.poll()))
            events = read_events(accuracy_file)
            acc = [e["accuracy"] for e in events if "accuracy" in e]
            progress.update(time.time() - t0, "accuracy %.3f | %d evals" %
                            (acc[-1] if acc else 0.0, len(acc)))
            time.sleep(0.5)
        progress.done()
        return [p.returncode for p in procs]

    # -------------------------------------------------------------- systems
    def run_async(self, system, d, started):
        stop_file = os.path.join(d, "stop")
        server = self.app("s1", "server", [self.binary("eval/testbed/testbed_app"),
                                           "--role=server", "--name=ps0",
                                           "--socket=" + self.sockets["s1"],
                                           "--out=" + os.path.join(d, "server.jsonl"),
                                           "--stop_file=" + stop_file] + self.app_flags(), d)
        started.append(("server", server))
        workers = []
        for i, h in enumerate(self.workers):
            p = self.app(h, h, [self.binary("eval/testbed/testbed_app"), "--role=worker",
                                "--name=" + h, "--server=ps0", "--worker_index=%d" % i,
                                "--window=%d" % self.args.window,
                                "--socket=" + self.sockets[h],
                                "--out=" + os.path.join(d, h + ".jsonl"),
                                "--stop_file=" + stop_file] + self.app_flags(), d)
            started.append((h, p))
            workers.append(p)
        codes = self.watch(system, workers, os.path.join(d, "server.jsonl"), started,
                           self.args.duration_s + self.args.grace_s)
        open(stop_file + ".done", "w").close()
        server.wait(timeout=60)
        self.fetch_push_phases(d)
        if any(codes) or server.returncode:
            raise RuntimeError("exit codes: workers %s, server %s (logs in %s)" %
                               (codes, server.returncode, d))

    def fetch_push_phases(self, d):
        """Saves the scheduler's /api/v1/delays (its push phases) as <d>/delays.json.

        Best effort: a run without them still counts; collect() reports None.
        """
        try:
            port = open(os.path.join(d, "admin.port")).read().strip()
            out = self.cluster.run("sch", [sys.executable, "-c",
                                           "import urllib.request,sys; sys.stdout.write("
                                           "urllib.request.urlopen('http://127.0.0.1:%s"
                                           "/api/v1/delays', timeout=10).read().decode())" % port],
                                   timeout=30)
            with open(os.path.join(d, "delays.json"), "w") as f:
                f.write(out.stdout)
        except Exception as e:  # noqa: BLE001 (a figure, not the run)
            print("%s: no push phases from the admin endpoint: %s" % (d, e), flush=True)

    def run_sync_mlfabric(self, d, started, backup=0):
        ranks = []
        for i, h in enumerate(self.workers):
            env = dict(os.environ, MLFABRIC_RANK=str(i), MLFABRIC_SIZE=str(len(self.workers)))
            p = self.app(h, h, [self.binary("eval/testbed/testbed_app"), "--role=sync",
                                "--backend=mlfabric", "--name=" + h,
                                "--backup_workers=%d" % backup,
                                "--allreduce_pieces=%d" % self.args.allreduce_pieces,
                                "--socket=" + self.sockets[h],
                                "--out=" + os.path.join(d, h + ".jsonl")] + self.app_flags(),
                         d, env=env)
            started.append((h, p))
            ranks.append(p)
        codes = self.watch("mlfabric-s", ranks, os.path.join(d, "w1.jsonl"), started,
                           self.args.duration_s + self.args.grace_s)
        if any(codes):
            raise RuntimeError("rank exit codes %s (logs in %s)" % (codes, d))

    def run_mpi(self, system, d, started):
        a = self.args
        agent = os.path.join(d, "netns-rsh")
        with open(agent, "w") as f:
            # mpirun calls `agent <host> <command line>` like ssh; run the
            # command line with a shell inside the host's namespace.
            if self.cluster.mode == "netns":
                f.write('#!/bin/sh\nhost="$1"; shift\nexec ip netns exec "%s$host" /bin/sh -c "$*"\n'
                        % a.prefix)
            else:
                f.write('#!/bin/sh\nshift\nexec /bin/sh -c "$*"\n')
        os.chmod(agent, 0o755)
        hostfile = os.path.join(d, "hostfile")
        with open(hostfile, "w") as f:
            for h in self.workers:
                f.write("%s slots=1\n" % h)
        algorithm = (["--mca", "coll_tuned_allreduce_algorithm", "4"] if system == "rr-sync" else
                     ["--mca", "coll_tuned_allreduce_algorithm", "2",
                      "--mca", "coll_tuned_reduce_algorithm", "5",
                      "--mca", "coll_tuned_bcast_algorithm", "6"])
        argv = ["mpirun", "--allow-run-as-root", "-np", str(len(self.workers)),
                "--mca", "btl", "tcp,self", "--mca", "coll_tuned_use_dynamic_rules", "1"]
        argv += algorithm
        if self.cluster.mode == "netns":
            argv += ["--hostfile", hostfile, "--mca", "plm_rsh_agent", agent,
                     "--mca", "btl_tcp_if_include", self.cluster.ifname,
                     "--mca", "oob_tcp_if_include", self.cluster.ifname,
                     "--mca", "plm_rsh_no_tree_spawn", "1", "--mca", "orte_keep_fqdn_hostnames", "1"]
        else:
            argv += ["--oversubscribe", "--mca", "btl_tcp_if_include", "lo"]
        # One rank per emulated host, but all on this machine's few cores:
        # Open MPI's default busy-polling would let waiting ranks steal the
        # CPU from computing ones (measured: C1-N1 RR-Sync TTA 28.8 s
        # polling, 17.8 s yielding), which a machine per rank never sees.
        if not any(kv.startswith("mpi_yield_when_idle=") for kv in a.mpi_mca):
            argv += ["--mca", "mpi_yield_when_idle", "1"]
        for kv in a.mpi_mca:
            key, _, value = kv.partition("=")
            argv += ["--mca", key, value]
        # Each rank's own log file: the shell expands the rank at run time.
        app = self.binary("eval/testbed/testbed_app")
        argv += ["/bin/sh", "-c", 'exec "$0" "$@" --out=%s/w$((OMPI_COMM_WORLD_RANK+1)).jsonl' % d,
                 app, "--role=sync", "--backend=mpi"] + self.app_flags()
        with open(os.path.join(d, "mpirun.cmd"), "w") as f:
            f.write(" ".join(argv) + "\n")
        env = dict(os.environ)
        for k in list(env):
            if k.startswith(("OMPI_", "PMIX_")):
                del env[k]
        # Under heavy load we saw Open MPI 4.1's launch stall now and then:
        # every orted connected to mpirun, no rank ever started. A launch
        # with no rank output after launch_timeout_s is killed and retried
        # (counted in the results as mpi_launch_retries).
        first_rank = os.path.join(d, "w1.jsonl")
        for attempt in range(3):
            p = self.app("sch", "mpirun", argv, d, env=env)
            started.append(("mpirun", p))
            launched = False
            deadline = time.time() + a.launch_timeout_s
            while time.time() < deadline and p.poll() is None:
                if any(os.path.exists(os.path.join(d, "w%d.jsonl" % (i + 1)))
                       for i in range(len(self.workers))):
                    launched = True
                    break
                time.sleep(0.2)
            if launched or p.poll() is not None:
                break
            print("\n%s: mpirun launched no rank in %.0f s; killing it and retrying"
                  % (system, a.launch_timeout_s), flush=True)
            self.mpi_launch_retries = getattr(self, "mpi_launch_retries", 0) + 1
            self.stop_all([("mpirun", p)])
        codes = self.watch(system, [p], first_rank, started, a.duration_s + a.grace_s)
        if any(codes):
            raise RuntimeError("mpirun exit code %s (log %s/mpirun.log)" % (codes[0], d))

    # -------------------------------------------------------------- results
    def collect(self, system, d, t_begin, t_end, driver, before, after):
        a = self.args
        r = {"system": system, "dir": d}
        logs = {h: read_events(os.path.join(d, h + ".jsonl")) for h in self.workers}
        summaries = {h: next((e for e in ev if e["event"] == "summary"), None)
                     for h, ev in logs.items()}
        r["workers_finished"] = sum(1 for s in summaries.values() if s)
        starts = [s["start"] for s in summaries.values() if s]
        t0 = min(starts) if starts else t_begin
        r["t0"] = t0
        iter_s = [e["iter_s"] for ev in logs.values() for e in ev
                  if e["event"] == "iter" and e["iter"] > 0]
        r["iteration_s"] = sorted(iter_s)
        r["mean_iteration_s"] = sum(iter_s) / len(iter_s) if iter_s else None
        if is_async(system):
            server = read_events(os.path.join(d, "server.jsonl"))
            # The server evaluates from its own start, before the workers
            # have connected: those points (the initial model) collapse
            # into one at time zero.
            evals = [(e["t"] - t0, e["accuracy"]) for e in server if e["event"] == "eval"]
            early = [p for p in evals if p[0] < 0]
            curve = ([(0.0, early[-1][1])] if early else []) + [p for p in evals if p[0] >= 0]
            ssum = next((e for e in server if e["event"] == "summary"), {})
            pushes = [e for ev in logs.values() for e in ev if e["event"] == "push"]
            r["pushes"] = sum(s["pushes"] for s in summaries.values() if s)
            r["applied"] = sum(s["applied"] for s in summaries.values() if s)
            r["dropped"] = sum(s["dropped"] for s in summaries.values() if s)
            r["failed"] = sum(s["failed"] for s in summaries.values() if s)
            r["server_applied"] = ssum.get("applied")
            r["deliveries_by_count"] = ssum.get("deliveries_by_count")
            r["delays"] = sorted(e["delay"] for e in pushes if "delay" in e)
            reasons = {}
            for s in summaries.values():
                for k, v in (s or {}).get("drop_reasons", {}).items():
                    reasons[k] = reasons.get(k, 0) + v
            r["drop_reasons"] = reasons
            fails = {}
            for s in summaries.values():
                for k, v in (s or {}).get("fail_reasons", {}).items():
                    fails[k] = fails.get(k, 0) + v
            r["fail_reasons"] = fails
            r["get_errors"] = [s["get_error"] for s in summaries.values()
                               if s and s.get("get_error")]
            # Every push ended exactly once, and the server applied exactly
            # the updates the workers were told were applied.
            r["accounted"] = (r["pushes"] == r["applied"] + r["dropped"] + r["failed"] and
                              r["server_applied"] == r["applied"] and not r["get_errors"] and
                              r["workers_finished"] == len(self.workers))
            r["iterations"] = r["pushes"]
            r.update(iteration_phases(logs, a.window))
            r["scheduler_push_phases"] = read_push_phases(d)
        else:
            curve = [(e["t"] - t0, e["accuracy"]) for e in logs.get("w1", [])
                     if e["event"] == "iter" and "accuracy" in e]
            iters = [s["iterations"] for s in summaries.values() if s]
            r["iterations"] = sum(iters)
            r["rounds"] = min(iters) if iters else 0
            errors = [s["first_error"] for s in summaries.values() if s and s["first_error"]]
            r["accounted"] = (r["workers_finished"] == len(self.workers) and
                              len(set(iters)) == 1 and not errors)
            r["backend"] = next((s.get("backend") for s in summaries.values() if s), None)
            # Contributions left out as late (backup workers): "dropped".
            r["left_out"] = sum(s.get("left_out", 0) for s in summaries.values() if s)
            r["pushes"] = r["iterations"]
            r["applied"] = r["iterations"] - r["left_out"]
            r["dropped"] = r["left_out"]
            r["failed"] = 0
            r["delays"] = []
            r["drop_errors"] = errors
        r["curve"] = curve
        r["final_accuracy"] = curve[-1][1] if curve else None
        reached = [t for t, acc in curve if acc >= a.target_accuracy]
        r["tta_s"] = reached[0] if reached else None
        r["wall_s"] = t_end - t_begin
        util = {}
        for h in ["s1"] + self.workers:
            if h in before and h in after:
                up = after[h]["up"] - before[h]["up"]
                down = after[h]["down"] - before[h]["down"]
                if h in self.seeds:
                    cap_up = capacity_integral(driver.history, h, t_begin, t_end, 0)
                    cap_down = capacity_integral(driver.history, h, t_begin, t_end, 1)
                else:
                    cap_up = cap_down = self.server_bps * (t_end - t_begin)
                util[h] = {"up_bytes": up, "down_bytes": down,
                           "up_util": 8 * up / cap_up if cap_up else None,
                           "down_util": 8 * down / cap_down if cap_down else None}
        r["links"] = util
        r["trace"] = [(t - t_begin, h, up, down) for t, h, up, down in driver.history]
        return r



def parse_args(argv):
    p = argparse.ArgumentParser(prog="mlfabric-testbed", description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--compute", default="C1", choices=sorted(COMPUTE))
    p.add_argument("--network", default="N1", choices=sorted(NETWORK))
    p.add_argument("--systems", default="mlfabric-a30,mlfabric-a60,mlfabric-s,vanilla,rr-sync,tr-sync",
                   help="comma list; mlfabric-a<tau> for any delay bound tau (paper: 30, 60 with "
                        "30 workers; --scale_tau rescales them to --workers)")
    p.add_argument("--scale_tau", type=int, default=1,
                   help="1: delay bounds of mlfabric-a<tau> are the paper's for 30 workers and "
                        "are scaled by workers/30 (at least 1); 0: use tau as given")
    p.add_argument("--update_bytes", type=int, default=1 << 20,
                   help="bytes per update (ResNet-50: 100 MB); NIC rates scale with it")
    p.add_argument("--compute_s", type=float, default=0.1, help="compute per iteration (§7: 100 ms)")
    p.add_argument("--window", type=int, default=1,
                   help="pushes an asynchronous worker may have outstanding (MLfabric-A, vanilla). "
                        "1 (default): push, wait for its outcome, then get, as a parameter-server "
                        "worker whose pull follows its push; 2 pipelines one push with the next "
                        "compute (the default before 2026-11-26; docs/results.md compares them)")
    p.add_argument("--allreduce_pieces", type=int, default=1,
                   help="mlfabric-s*: AllReduceOptions::pieces, the root servers each sum is cut "
                        "over (rank k runs piece k's); 0 = one per rank, 1 (default) = one root "
                        "on w1")
    p.add_argument("--period_s", type=float, default=5.0, help="T of the N-trace (§7: 5 s)")
    p.add_argument("--report_lag_s", type=float, default=0.2, help="monitor lag t_lag (§7: 0.2 s)")
    p.add_argument("--target_accuracy", type=float, default=0.70)
    p.add_argument("--duration_s", type=float, default=60, help="cap per system")
    p.add_argument("--aggregators", type=int, default=1,
                   help="1: MLfabric-A and SSP may aggregate on every worker host (§5.2, §7); "
                        "0: none")
    p.add_argument("--mpi_mca", action="append", default=[], metavar="KEY=VALUE",
                   help="extra Open MPI --mca setting for rr-sync/tr-sync (repeatable), "
                        "e.g. mpi_yield_when_idle=0 (default 1, see README)")
    p.add_argument("--scheduler_set", action="append", default=[], metavar="KEY=JSON",
                   help="set a scheduler config key for every system, e.g. get_trees=false "
                        "or get_deadline_slack=2 (repeatable)")
    p.add_argument("--daemon_arg", action="append", default=[], metavar="--FLAG=VALUE",
                   help="an extra flag for every mlfabricd, e.g. --round_tree_fanout=0 "
                        "(repeatable)")
    p.add_argument("--launch_timeout_s", type=float, default=30,
                   help="retry an mpirun that started no rank within this time (twice at most)")
    p.add_argument("--grace_s", type=float, default=120,
                   help="a system still running duration_s + grace_s after its start fails")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--prefix", default="mlft-")
    p.add_argument("--subnet", default=None, help="A.B.C of the /24 (default: from --prefix)")
    p.add_argument("--mode", default="auto", choices=["auto", "netns", "loopback"])
    p.add_argument("--out", default=None, help="results directory (default /tmp/mlfabric-testbed-<time>)")
    p.add_argument("--plots", type=int, default=1)
    p.add_argument("--bin_root", default=None, help="bazel-bin (default: this script's runfiles)")
    args = p.parse_args(argv)
    if args.workers < 2:
        p.error("--workers must be at least 2")
    if not 0 <= args.allreduce_pieces <= 1024:
        p.error("--allreduce_pieces %d: expected 0 (one per rank) to 1024" % args.allreduce_pieces)
    for flag in args.daemon_arg:
        if not flag.startswith("--") or "=" not in flag:
            p.error("--daemon_arg %r: expected --FLAG=VALUE" % flag)
    for item in args.scheduler_set:
        key, eq, value = item.partition("=")
        try:
            if not key or not eq:
                raise ValueError("expected KEY=JSON")
            json.loads(value)
        except ValueError as e:
            p.error("--scheduler_set %r: %s" % (item, e))
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    resolved = []
    for s in systems:
        if s.startswith("mlfabric-a"):
            try:
                tau = int(s[len("mlfabric-a"):])
            except ValueError:
                p.error("system %r: expected mlfabric-a<integer delay bound>" % s)
            if args.scale_tau:
                tau = max(1, round(tau * args.workers / 30))
            s = "mlfabric-a%d" % tau
        elif s.startswith("mlfabric-ssp"):
            parsed = ssp_system(s)
            if parsed is None:
                p.error("system %r: expected mlfabric-ssp<K> or mlfabric-ssp<K>-a<delay bound>" % s)
            k, tau = parsed
            if tau is not None:
                if args.scale_tau:
                    tau = max(1, round(tau * args.workers / 30))
                s = "mlfabric-ssp%d-a%d" % (k, tau)
        elif s.startswith("mlfabric-s-b"):
            digits = s[len("mlfabric-s-b"):]
            if not digits.isdigit():
                p.error("system %r: expected mlfabric-s-b<backup workers>" % s)
            if int(digits) >= args.workers:
                p.error("system %r: backup workers must be fewer than --workers (%d)"
                        % (s, args.workers))
        elif s not in ("mlfabric-s", "vanilla", "rr-sync", "tr-sync"):
            p.error("unknown system %r (known: mlfabric-a<tau>, mlfabric-s, mlfabric-s-b<b>, "
                    "mlfabric-ssp<K>[-a<tau>], vanilla, rr-sync, tr-sync)" % s)
        if s in resolved:
            p.error("system %r listed twice (after delay-bound scaling)" % s)
        resolved.append(s)
    args.systems = resolved
    if args.out is None:
        args.out = "/tmp/mlfabric-testbed-%s" % time.strftime("%Y%m%d-%H%M%S")
    elif not os.path.isabs(args.out) and os.environ.get("BUILD_WORKING_DIRECTORY"):
        args.out = os.path.join(os.environ["BUILD_WORKING_DIRECTORY"], args.out)
    if args.bin_root is None:
        args.bin_root = os.environ.get("MLFABRIC_TESTBED_BIN_ROOT") or os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "..", "..")
    return args


def main(argv):
    args = parse_args(argv)
    results = Testbed(args).run()
    table = summary_table(results, args.target_accuracy)
    print(table, flush=True)
    with open(os.path.join(args.out, "summary.txt"), "w") as f:
        f.write(table + "\n")
    if args.plots:
        try:
            import plots
            for path in plots.write_all(results, args.out):
                print("plot:", path)
        except ImportError as e:
            print("plots skipped: %s (pip install matplotlib; tools/deps/eval.pip)" % e)
    print("results: %s" % os.path.join(args.out, "results.json"))
    for n, r in results["systems"].items():
        for reason, count in (r.get("fail_reasons") or {}).items():
            print("%s: %d pushes failed: %s" % (n, count, reason))
    bad = [n for n, r in results["systems"].items() if r.get("error") or not r.get("accounted")]
    if bad:
        print("mlfabric-testbed: FAILED systems: %s" % ", ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
