"""An emulated cluster on one machine: one network namespace per host.

Issue #7 (emulated testbed). Every emulated host gets its own network
namespace ``<prefix><host>`` with one interface (``veth0`` by default) and an
address in its own /24; the other end of each veth sits in a switch namespace
``<prefix>sw`` on the bridge ``<prefix>br0``. Each host NIC is shaped with htb
in both directions:

  * uplink   = egress of ``veth0`` inside the host namespace
               (``tc ... dev veth0 root handle 1: htb default 10``, class 1:10,
               rate = ceil = uplink bps); a daemon in the host can read this
               class's ceil (``--monitor_interface=veth0 --monitor_tc_class=1:10``);
  * downlink = egress of the host's port on the switch side, class 1:10 too.

So a transfer from host A to host B is limited by min(A's uplink, B's
downlink), like the paper's congestion-free core (mlfabric.md §7.4).

Where namespaces cannot be created (no root, no ``ip``), ``mode="auto"``
falls back to loopback: every host is 127.0.0.1, commands run unwrapped, and
rates are only recorded (the caller must give them to the daemons' own pacing,
``--uplink_bps``/``--downlink_bps``); ``fallback_reason`` says why.

Usage::

    from eval.testbed.netns_cluster import Cluster
    with Cluster(["sch", "s1", "w1", "w2"], prefix="mlft-") as cluster:
        print(cluster.mode, cluster.ip("w1"))          # netns 10.x.y.3
        cluster.set_rate("w1", up_bps=50e6, down_bps=200e6)
        proc = cluster.popen("w1", ["iperf3", "-c", cluster.ip("s1")],
                             stdout=log)
        cluster.run("s1", ["ip", "addr"])               # CompletedProcess
        print(cluster.link_bytes())  # {"w1": {"up": tx bytes, "down": rx}}
    # namespaces, veths and the bridge are gone here (also on SIGINT/SIGTERM)

Two clusters coexist when their prefixes differ; each prefix gets its own
subnet (``subnet`` argument, else derived from the prefix). ``python3
netns_cluster.py cleanup --prefix mlft-h2-`` removes what a killed run left
(every namespace whose name starts with the prefix: give the full one).
``kill_all()`` kills whatever runs in the namespaces (e.g. Open MPI's
daemonized orted); ``destroy()`` calls it.

Thread safety: ``set_rate`` and ``link_bytes`` may be called from a trace
thread while other threads ``popen``; creation/destruction are not
concurrent with anything else.
"""

import atexit
import json
import os
import signal
import shutil
import subprocess
import sys
import threading
import zlib

DEFAULT_RATE_BPS = 1e9
_SW = "sw"


def _sh(argv, check=True, timeout=30):
    """Runs argv; returns CompletedProcess; raises with stderr on failure."""
    result = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise RuntimeError("command failed (exit %d): %s\n%s" %
                           (result.returncode, " ".join(argv), result.stderr.strip()))
    return result


def list_namespaces(prefix):
    """Names of the existing network namespaces that start with prefix."""
    if not shutil.which("ip"):
        return []
    out = _sh(["ip", "netns", "list"], check=False).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [n for n in names if n.startswith(prefix)]


def cleanup_prefix(prefix):
    """Deletes every namespace named prefix* (veths and bridge go with them).

    Processes still running inside are not killed: stop them first."""
    removed = []
    for ns in list_namespaces(prefix):
        if _sh(["ip", "netns", "del", ns], check=False).returncode == 0:
            removed.append(ns)
    return removed


def _subnet_for(prefix):
    # 10.(120..219).(0..255): distinct prefixes almost never collide; pass
    # subnet= explicitly to be sure.
    h = zlib.crc32(prefix.encode())
    return "10.%d.%d" % (120 + h % 100, (h // 100) % 256)


def _tc_rate(bps):
    return "%dbit" % max(8000, int(bps))


class Cluster:
    """One emulated host per namespace, a bridge, htb on every NIC direction.

    hosts: host names (short: they become interface names, <= 12 chars).
    prefix: namespace prefix (``mlft-``); bridge ``<prefix>br0``.
    subnet: "A.B.C" of the /24 (default derived from prefix).
    mode: "auto" (netns, else loopback), "netns" (fail if impossible) or
          "loopback".
    rate_bps: initial uplink and downlink rate of every host.
    """

    def __init__(self, hosts, prefix="mlft-", subnet=None, mode="auto",
                 rate_bps=DEFAULT_RATE_BPS, ifname="veth0"):
        if len(set(hosts)) != len(hosts):
            raise ValueError("Cluster: duplicate host names in %r" % (hosts,))
        if len(hosts) > 250:
            raise ValueError("Cluster: at most 250 hosts per /24, got %d" % len(hosts))
        for h in hosts:
            if not h or len(h) > 12 or not h.replace("-", "").replace("_", "").isalnum():
                raise ValueError("Cluster: host name %r must be 1-12 characters [A-Za-z0-9_-]" % h)
        if mode not in ("auto", "netns", "loopback"):
            raise ValueError("Cluster: mode must be auto, netns or loopback, got %r" % mode)
        if len(prefix + "br0") > 15:
            raise ValueError("Cluster: prefix %r too long for interface names" % prefix)
        self.hosts = list(hosts)
        self.prefix = prefix
        self.subnet = subnet or _subnet_for(prefix)
        self.ifname = ifname
        self.requested_mode = mode
        self.mode = None  # "netns" or "loopback" once created
        self.fallback_reason = ""
        self._rates = {h: [float(rate_bps), float(rate_bps)] for h in hosts}
        self._lock = threading.Lock()
        self._created = []
        self._procs = []
        self._prev_handlers = {}

    # ----- lifecycle -------------------------------------------------------
    def __enter__(self):
        return self.create()

    def __exit__(self, *exc):
        self.destroy()

    def create(self):
        """Builds the cluster; returns self. Installs exit/signal cleanup."""
        if self.requested_mode == "loopback":
            self.mode = "loopback"
            self.fallback_reason = "loopback requested"
            return self
        reason = self._netns_unavailable()
        if reason:
            if self.requested_mode == "netns":
                raise RuntimeError("Cluster: network namespaces unavailable: " + reason)
            self.mode = "loopback"
            self.fallback_reason = reason
            return self
        # Only the exact names this cluster needs: prefix "mlft-" must not
        # trip over another cluster's "mlft-h3-...".
        mine = {self.prefix + h for h in self.hosts} | {self.ns_of_switch()}
        stale = [ns for ns in list_namespaces(self.prefix) if ns in mine]
        if stale:
            raise RuntimeError(
                "Cluster: namespaces with prefix %r already exist (%s); another run is "
                "using this prefix, or a killed one left them: python3 netns_cluster.py "
                "cleanup --prefix %s" % (self.prefix, " ".join(stale), self.prefix))
        atexit.register(self.destroy)
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._prev_handlers[sig] = signal.signal(sig, self._on_signal)
            except ValueError:  # not the main thread
                pass
        try:
            self._build()
        except Exception:
            self.destroy()
            raise
        self.mode = "netns"
        return self

    def _netns_unavailable(self):
        if not shutil.which("ip") or not shutil.which("tc"):
            return "the ip and tc tools are not installed"
        probe = "%sprobe%d" % (self.prefix, os.getpid())
        r = _sh(["ip", "netns", "add", probe], check=False)
        if r.returncode != 0:
            return "cannot create a network namespace (%s)" % r.stderr.strip()
        try:
            r = _sh(["ip", "-n", probe, "link", "add", "p0", "type", "veth", "peer",
                     "name", "p1"], check=False)
            if r.returncode != 0:
                return "cannot create a veth pair (%s)" % r.stderr.strip()
            r = _sh(["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "p0",
                     "root", "handle", "1:", "htb", "default", "10"], check=False)
            if r.returncode != 0:
                return "cannot install an htb qdisc (%s)" % r.stderr.strip()
        finally:
            _sh(["ip", "netns", "del", probe], check=False)
        return ""

    def _build(self):
        sw = self.ns_of_switch()
        _sh(["ip", "netns", "add", sw])
        self._created.append(sw)
        _sh(["ip", "-n", sw, "link", "set", "lo", "up"])
        br = self.prefix + "br0"
        _sh(["ip", "-n", sw, "link", "add", br, "type", "bridge"])
        _sh(["ip", "-n", sw, "link", "set", br, "up"])
        for i, host in enumerate(self.hosts):
            ns = self.ns(host)
            _sh(["ip", "netns", "add", ns])
            self._created.append(ns)
            _sh(["ip", "-n", ns, "link", "set", "lo", "up"])
            port = "p-" + host
            _sh(["ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name",
                 self.ifname, "netns", ns])
            _sh(["ip", "-n", sw, "link", "set", port, "master", br])
            _sh(["ip", "-n", sw, "link", "set", port, "up"])
            _sh(["ip", "-n", ns, "addr", "add", "%s/24" % self.ip(host), "dev", self.ifname])
            _sh(["ip", "-n", ns, "link", "set", self.ifname, "up"])
            up, down = self._rates[host]
            for n, dev, bps in ((ns, self.ifname, up), (sw, port, down)):
                _sh(["ip", "netns", "exec", n, "tc", "qdisc", "add", "dev", dev, "root",
                     "handle", "1:", "htb", "default", "10"])
                _sh(["ip", "netns", "exec", n, "tc", "class", "add", "dev", dev, "parent",
                     "1:", "classid", "1:10", "htb", "rate", _tc_rate(bps), "ceil",
                     _tc_rate(bps)])

    def _on_signal(self, signum, frame):
        self.destroy()
        prev = self._prev_handlers.get(signum)
        if callable(prev):
            prev(signum, frame)
        else:
            sys.exit(128 + signum)

    def destroy(self):
        """Kills processes started with popen and any left in the namespaces,
        deletes the namespaces. Idempotent."""
        with self._lock:
            procs, self._procs = self._procs, []
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    pass
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        self.kill_all()
        for ns in reversed(self._created):
            _sh(["ip", "netns", "del", ns], check=False)
        self._created = []
        for sig, prev in self._prev_handlers.items():
            try:
                signal.signal(sig, prev)
            except (ValueError, TypeError):
                pass
        self._prev_handlers = {}

    def kill_all(self, sig=signal.SIGKILL):
        """Signals every process inside this cluster's namespaces (netns mode).

        For what escapes popen()'s process groups, e.g. Open MPI's orted,
        which daemonizes. Returns the number of processes signalled."""
        if self.mode != "netns":
            return 0
        count = 0
        for ns in list(self._created):
            out = _sh(["ip", "netns", "pids", ns], check=False).stdout
            for pid in out.split():
                try:
                    os.kill(int(pid), sig)
                    count += 1
                except (ProcessLookupError, ValueError):
                    pass
        return count

    # ----- addressing and commands ----------------------------------------
    def ns(self, host):
        """Namespace name of host."""
        self._check(host)
        return self.prefix + host

    def ns_of_switch(self):
        return self.prefix + _SW

    def ip(self, host):
        """The host's address: its veth IP (netns) or 127.0.0.1 (loopback)."""
        self._check(host)
        if self.mode == "loopback":
            return "127.0.0.1"
        return "%s.%d" % (self.subnet, 2 + self.hosts.index(host))

    def wrap(self, host, argv):
        """argv that runs `argv` inside host's namespace."""
        self._check(host)
        if self.mode == "netns":
            return ["ip", "netns", "exec", self.ns(host)] + list(argv)
        return list(argv)

    def popen(self, host, argv, **kwargs):
        """Starts argv in host (own process group); destroy() stops it."""
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        proc = subprocess.Popen(self.wrap(host, argv), start_new_session=True, **kwargs)
        with self._lock:
            self._procs.append(proc)
        return proc

    def run(self, host, argv, check=True, timeout=60):
        """Runs argv in host to completion; CompletedProcess with text output."""
        return _sh(self.wrap(host, argv), check=check, timeout=timeout)

    # ----- shaping and counters -------------------------------------------
    def set_rate(self, host, up_bps=None, down_bps=None):
        """Changes host's uplink and/or downlink htb rate (ceil = rate).

        In loopback mode only records the rates (see rates())."""
        self._check(host)
        with self._lock:
            if up_bps is not None:
                self._rates[host][0] = float(up_bps)
            if down_bps is not None:
                self._rates[host][1] = float(down_bps)
        if self.mode != "netns":
            return
        for ns, dev, bps in ((self.ns(host), self.ifname, up_bps),
                             (self.ns_of_switch(), "p-" + host, down_bps)):
            if bps is None:
                continue
            _sh(["ip", "netns", "exec", ns, "tc", "class", "change", "dev", dev, "parent",
                 "1:", "classid", "1:10", "htb", "rate", _tc_rate(bps), "ceil",
                 _tc_rate(bps)])

    def rates(self):
        """{host: {"up_bps", "down_bps"}} as last set."""
        with self._lock:
            return {h: {"up_bps": r[0], "down_bps": r[1]} for h, r in self._rates.items()}

    def link_bytes(self):
        """{host: {"up": bytes sent by host, "down": bytes delivered to it}}.

        Interface counters since creation (netns mode); {} in loopback mode,
        where all hosts share lo and no per-host figure exists."""
        if self.mode != "netns":
            return {}
        out = _sh(["ip", "-j", "-s", "-n", self.ns_of_switch(), "link", "show"]).stdout
        counters = {}
        for link in json.loads(out):
            name = link.get("ifname", "")
            if not name.startswith("p-"):
                continue
            stats = link.get("stats64") or link.get("stats") or {}
            host = name[2:]
            if host in self._rates:
                # switch port rx = what the host sent; port tx = what it received.
                counters[host] = {"up": int(stats.get("rx", {}).get("bytes", 0)),
                                  "down": int(stats.get("tx", {}).get("bytes", 0))}
        return counters

    def _check(self, host):
        if host not in self._rates:
            raise KeyError("Cluster: unknown host %r (hosts: %s)" % (host, ", ".join(self.hosts)))


def _main(argv):
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("cleanup", help="delete namespaces left by a killed run")
    c.add_argument("--prefix", default="mlft-")
    s = sub.add_parser("selftest", help="build a 3-host cluster, ping, shape, tear down")
    s.add_argument("--prefix", default="mlft-st-")
    args = parser.parse_args(argv)
    if args.cmd == "cleanup":
        print("removed:", " ".join(cleanup_prefix(args.prefix)) or "nothing")
        return 0
    with Cluster(["a", "b", "c"], prefix=args.prefix, rate_bps=20e6) as cluster:
        print("mode:", cluster.mode, cluster.fallback_reason)
        if cluster.mode == "netns":
            cluster.set_rate("c", down_bps=8e6)
            # 1 MB from a to c through c's 8 Mbit/s downlink: about 1 s.
            server = ("import socket,sys;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,"
                      "socket.SO_REUSEADDR,1);s.bind(('0.0.0.0',7071));s.listen();"
                      "c,_=s.accept();n=0\nwhile True:\n d=c.recv(65536)\n if not d: break\n"
                      " n+=len(d)\nprint(n)")
            sink = cluster.popen("c", [sys.executable, "-c", server], stdout=subprocess.PIPE,
                                 text=True)
            client = ("import socket,time,sys\nfor _ in range(100):\n try:\n"
                      "  s=socket.create_connection((sys.argv[1],7071));break\n"
                      " except OSError: time.sleep(0.05)\nt=time.time();"
                      "s.sendall(b'x'*1000000);s.shutdown(1);s.recv(1);"
                      "print('%.2f' % (time.time()-t))")
            import time
            t0 = time.time()
            cluster.run("a", [sys.executable, "-c", client, cluster.ip("c")])
            got = sink.communicate(timeout=30)[0].strip()
            print("received %s bytes in %.2f s (8 Mbit/s downlink: ~1.0 s expected)"
                  % (got, time.time() - t0))
            print(cluster.run("b", ["tc", "class", "show", "dev", cluster.ifname]).stdout.strip())
            print(cluster.link_bytes())
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
