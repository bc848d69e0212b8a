"""Shared plumbing of the Mercury ablation and the TensorLights experiment.

Both run MLfabric's real processes on an emulated cluster
(eval/testbed/netns_cluster.py: one network namespace per host, htb-shaped
NICs) with the tensor-profile applications of eval/testbed/apps
(profile_worker, profile_server):

    with netns_cluster.Cluster(hosts, prefix="mlfm-", mode="auto") as cluster:
        run = ControlPlane(cluster, bin_root, out_dir)
        run.start_scheduler("sch", jobs=[{"name": "j0", "token": "j0-token-0123456789"}])
        sock = run.start_daemon("w1", host="w1", uplink_bps=1e10)
        ... run.app("w1", "w1-worker", [run.binary("eval/testbed/apps/profile_worker"), ...])
        run.stop_all()

In loopback mode (no namespaces) every daemon gets a free port instead of a
fixed one and nothing is shaped; callers print "SKIPPED: ..." for the
shaped part.

Thread safety: none; drive from one thread.
"""

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_until(predicate, timeout_s, what):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise RuntimeError("timed out after %.0f s waiting for %s" % (timeout_s, what))


def bin_root_default():
    """The runfiles root (bazel run) or the workspace's bazel-bin."""
    root = os.environ.get("MLFABRIC_TESTBED_BIN_ROOT")
    if root:
        return root
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.abspath(os.path.join(here, "..", "..", ".."))


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def variance(xs):
    if len(xs) < 2:
        return 0.0
    m = mean(xs)
    return sum((x - m) ** 2 for x in xs) / len(xs)


def percentile(xs, q):
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def print_table(header, rows):
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(header)]
    line = "  ".join(str(h).ljust(w) for h, w in zip(header, widths))
    print(line)
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))


class ControlPlane:
    """Starts and stops a scheduler, daemons and applications on a cluster."""

    def __init__(self, cluster, bin_root, out_dir):
        self.cluster = cluster
        self.bin_root = bin_root
        self.out = out_dir
        self.started = []  # (name, Popen)
        self.scheduler_address = None
        os.makedirs(out_dir, exist_ok=True)
        # Unix socket paths are limited to 107 bytes; test and output
        # directories can be deeper than that.
        self.sock_dir = tempfile.mkdtemp(prefix="mlfm-", dir="/tmp")

    def binary(self, rel):
        path = os.path.join(self.bin_root, rel)
        if not os.path.exists(path):
            raise RuntimeError("binary %s not found under %s (build it, or set "
                               "MLFABRIC_TESTBED_BIN_ROOT)" % (rel, self.bin_root))
        return path

    def log(self, name):
        return open(os.path.join(self.out, name + ".log"), "w")

    def popen(self, host, name, argv):
        proc = self.cluster.popen(host, argv, stdout=self.log(name), stderr=subprocess.STDOUT)
        self.started.append((name, proc))
        return proc

    def start_scheduler(self, host, jobs, planner="mlfabric", batch_interval_ms=100,
                        default_link_bps=1e10, extra=None):
        port = 50051 if self.cluster.mode == "netns" else free_port()
        config = {"listen_address": "0.0.0.0" if self.cluster.mode == "netns" else "127.0.0.1",
                  "grpc_port": port, "port_file": os.path.join(self.out, "scheduler.port"),
                  "planner": planner, "log_level": "warning", "transfer_slack_s": 120,
                  "batch_interval_ms": batch_interval_ms,
                  "default_link_bps": default_link_bps, "jobs": jobs}
        # Hosts authenticate with a cluster secret made for this run (a
        # scheduler off loopback refuses to start without one).
        self.secret_file = os.path.join(self.out, "cluster.secret")
        with open(os.open(self.secret_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
                  "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        config["cluster_secret_file"] = self.secret_file
        config.update(extra or {})
        path = os.path.join(self.out, "scheduler.json")
        with open(path, "w") as f:
            json.dump(config, f, indent=1)
        self.popen(host, "scheduler", [self.binary("scheduler/mlfabric-scheduler"),
                                       "--config", path])
        wait_until(lambda: os.path.exists(config["port_file"]) and
                   open(config["port_file"]).read().strip(), 30, "the scheduler's port file")
        self.scheduler_address = "%s:%d" % (self.cluster.ip(host), port)
        return self.scheduler_address

    def start_daemon(self, name, host, data_port=0, uplink_bps=1e10, downlink_bps=1e10,
                     extra=()):
        """Starts mlfabricd `name` in `host`; returns (socket path, data port)."""
        if self.cluster.mode != "netns" and data_port:
            data_port = free_port()  # loopback: every daemon shares one port space
        sock = os.path.join(self.sock_dir, name + ".sock")
        argv = [self.binary("daemon/mlfabricd"), "--host=" + name,
                "--scheduler=" + self.scheduler_address,
                "--listen_address=" + self.cluster.ip(host), "--data_port=%d" % data_port,
                "--local_socket=" + sock, "--log_level=warning",
                "--uplink_bps=%d" % uplink_bps, "--downlink_bps=%d" % downlink_bps,
                "--cluster_secret_file=" + self.secret_file] + list(extra)
        self.popen(host, "daemon-" + name, argv)
        return sock, data_port

    def wait_sockets(self, sockets):
        wait_until(lambda: all(os.path.exists(s) for s in sockets), 30,
                   "the daemons' local sockets")

    def check_alive(self):
        for name, proc in self.started:
            if (name.startswith("daemon") or name == "scheduler") and proc.poll() is not None:
                raise RuntimeError("%s exited early (code %s); see %s/%s.log" %
                                   (name, proc.returncode, self.out, name))

    def stop(self, names):
        """SIGTERM to the named processes, then wait (SIGKILL after 10 s)."""
        procs = [(n, p) for n, p in self.started if n in names]
        for _, p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for _, p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    def stop_all(self):
        """Applications first, then daemons, then the scheduler."""
        order = ([n for n, _ in self.started if not n.startswith("daemon") and n != "scheduler"] +
                 [n for n, _ in self.started if n.startswith("daemon")] + ["scheduler"])
        for n in order:
            self.stop([n])
        shutil.rmtree(self.sock_dir, ignore_errors=True)


def set_sysctl(cluster, host, key, value):
    """Sets a per-namespace sysctl in host (netns mode only)."""
    if cluster.mode == "netns":
        cluster.run(host, ["sysctl", "-q", "-w", "%s=%s" % (key, value)])


def tcp_counters(cluster, host):
    """{"retrans_segs", "timeouts"} of host's namespace (TCP's own counters;
    {} in loopback mode, where they would count the whole machine)."""
    if cluster.mode != "netns":
        return {}
    out = {}
    for path, wanted in (("/proc/net/snmp", {"Tcp:RetransSegs": "retrans_segs"}),
                         ("/proc/net/netstat", {"TcpExt:TCPTimeouts": "timeouts"})):
        lines = cluster.run(host, ["cat", path]).stdout.splitlines()
        for names, values in zip(lines[::2], lines[1::2]):
            prefix = names.split(":")[0]
            for n, v in zip(names.split()[1:], values.split()[1:]):
                key = "%s:%s" % (prefix, n)
                if key in wanted:
                    out[wanted[key]] = int(v)
    return out


def counter_delta(before, after):
    return {k: after[k] - before.get(k, 0) for k in after}


class Progress:
    """Progress lines on stderr for long runs."""

    def __init__(self, label):
        self.label = label
        self.t0 = time.time()
        self.last = -1e9

    def update(self, text, every_s=5):
        now = time.time()
        if now - self.last >= every_s:
            self.last = now
            sys.stderr.write("[%6.1fs] %s: %s\n" % (now - self.t0, self.label, text))
            sys.stderr.flush()
