"""An emulated cluster on one machine: one network namespace per host.

The emulated testbed's cluster. A thin Python face on the project's one
namespace layout, which is implemented in C++ (launch/netns_network.h) and
driven here through its command, ``mlfabric-netns`` (testing/netns_cli.cc;
JSON on stdout). The layout: every emulated host gets its own network
namespace ``<prefix><host>`` with one interface (``veth0`` by default) and an
address in its own /24; the other end of each veth (``p-<host>``) sits in a
switch namespace ``<prefix>sw`` on the bridge ``<prefix>br0``. Each host NIC
is shaped with htb in both directions:

  * uplink   = egress of ``veth0`` inside the host namespace
               (``tc ... dev veth0 root handle 1: htb default 10``, class 1:10,
               rate = ceil = uplink bps); a daemon in the host can read this
               class's ceil (``--monitor_interface=veth0 --monitor_tc_class=1:10``);
  * downlink = egress of the host's port on the switch side, class 1:10 too.

So a transfer from host A to host B is limited by min(A's uplink, B's
downlink), like the paper's congestion-free core (mlfabric.md §7.4).

Where namespaces cannot be created (no root, no ``ip``/``tc``, or the
``mlfabric-netns`` command is not built), ``mode="auto"`` falls back to
loopback: every host is 127.0.0.1, commands run unwrapped, and rates are only
recorded (the caller must give them to the daemons' own pacing,
``--uplink_bps``/``--downlink_bps``); ``fallback_reason`` says why.

Usage::

    from eval.testbed.netns_cluster import Cluster
    with Cluster(["sch", "s1", "w1", "w2"], prefix="mlft-") as cluster:
        print(cluster.mode, cluster.ip("w1"))          # netns 10.x.y.4
        cluster.set_rate("w1", up_bps=50e6, down_bps=200e6)
        proc = cluster.popen("w1", ["iperf3", "-c", cluster.ip("s1")],
                             stdout=log)
        cluster.run("s1", ["ip", "addr"])               # CompletedProcess
        print(cluster.link_bytes())  # {"w1": {"up": tx bytes, "down": rx}}
    # namespaces, veths and the bridge are gone here (also on SIGINT/SIGTERM)

Two clusters coexist when their prefixes differ; each prefix gets its own
subnet (``subnet`` argument, else derived from the prefix). ``python3
netns_cluster.py cleanup --prefix mlft-h2-`` removes what a killed run left
(every namespace whose name starts with the prefix, and what runs in it:
give the full prefix). ``kill_all()`` kills whatever runs in the namespaces
(e.g. Open MPI's daemonized orted); ``destroy()`` calls it.

The command is found through $MLFABRIC_NETNS_CLI, else as
testing/mlfabric-netns under $MLFABRIC_TESTBED_BIN_ROOT, the runfiles tree
this file is in, or the workspace's bazel-bin/.

Thread safety: ``set_rate`` and ``link_bytes`` may be called from a trace
thread while other threads ``popen``; creation/destruction are not
concurrent with anything else.
"""

import atexit
import json
import os
import signal
import subprocess
import sys
import threading

DEFAULT_RATE_BPS = 1e9
_CLI = "testing/mlfabric-netns"


def _sh(argv, check=True, timeout=30):
    """Runs argv; returns CompletedProcess; raises with stderr on failure."""
    result = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise RuntimeError("command failed (exit %d): %s\n%s" %
                           (result.returncode, " ".join(argv), result.stderr.strip()))
    return result


def cli_path():
    """Path of the mlfabric-netns command, or None when it is not built."""
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.environ.get("MLFABRIC_NETNS_CLI", "")]
    for var in ("MLFABRIC_TESTBED_BIN_ROOT",):
        if os.environ.get(var):
            candidates.append(os.path.join(os.environ[var], _CLI))
    for var in ("RUNFILES_DIR", "TEST_SRCDIR"):
        if os.environ.get(var):
            candidates.append(os.path.join(os.environ[var], "mlfabric", _CLI))
    root = os.path.dirname(os.path.dirname(here))  # runfiles root or source tree
    candidates += [os.path.join(root, _CLI), os.path.join(root, "bazel-bin", _CLI)]
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _cli(args, timeout=120):
    """Runs mlfabric-netns with args; returns its JSON; raises RuntimeError."""
    path = cli_path()
    if path is None:
        raise RuntimeError("the mlfabric-netns command is not built "
                           "(bazel build //testing:mlfabric-netns)")
    result = _sh([path] + list(args), check=False, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(result.stderr.strip() or "mlfabric-netns %s failed (exit %d)"
                           % (args[0], result.returncode))
    return json.loads(result.stdout)


def list_namespaces(prefix):
    """Names of the existing network namespaces that start with prefix."""
    if cli_path() is None:
        return []
    return _cli(["list", "--prefix=" + prefix])["namespaces"]


def cleanup_prefix(prefix):
    """Kills what runs in, and deletes, every namespace named prefix*
    (veths and bridge go with them). Returns the names removed."""
    return _cli(["cleanup", "--prefix=" + prefix])["removed"]


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
        if mode not in ("auto", "netns", "loopback"):
            raise ValueError("Cluster: mode must be auto, netns or loopback, got %r" % mode)
        self.hosts = list(hosts)
        self.prefix = prefix
        self.ifname = ifname
        self.requested_mode = mode
        self.mode = None  # "netns" or "loopback" once created
        self.fallback_reason = ""
        self._layout_args = ["--prefix=" + prefix, "--hosts=" + ",".join(self.hosts),
                             "--ifname=" + ifname] + (["--subnet=" + subnet] if subnet else [])
        # Names and addresses come from the C++ layout; it also validates.
        self._layout = None
        if cli_path() is not None:
            try:
                self._layout = _cli(["layout"] + self._layout_args)
            except RuntimeError as e:
                raise ValueError("Cluster: %s" % e)
        elif len(set(self.hosts)) != len(self.hosts):
            raise ValueError("Cluster: duplicate host names in %r" % (hosts,))
        self.subnet = self._layout["subnet"] if self._layout else subnet
        self._initial_rate_bps = max(8000.0, float(rate_bps))
        self._rates = {h: [float(rate_bps), float(rate_bps)] for h in hosts}
        self._lock = threading.Lock()
        self._created = False
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
        atexit.register(self.destroy)
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._prev_handlers[sig] = signal.signal(sig, self._on_signal)
            except ValueError:  # not the main thread
                pass
        try:
            # The command refuses a prefix whose namespaces exist already and
            # cleans up after itself when it fails.
            self._layout = _cli(["create", "--rate_bps=%r" % self._initial_rate_bps] +
                                self._layout_args)
        except RuntimeError as e:
            self.destroy()
            raise RuntimeError("Cluster: %s" % e)
        self._created = True
        self.mode = "netns"
        return self

    def _netns_unavailable(self):
        if cli_path() is None:
            return ("the mlfabric-netns command is not built "
                    "(bazel build //testing:mlfabric-netns)")
        probe = _cli(["probe", "--prefix=" + self.prefix])
        return "" if probe["available"] else probe["reason"]

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
        if self._created:
            self._created = False
            try:
                _cli(["destroy"] + self._layout_args)  # kills what is left, deletes
            except RuntimeError as e:
                print("Cluster: %s" % e, file=sys.stderr)
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
        if self.mode != "netns" or not self._created:
            return 0
        return _cli(["kill-all", "--signal=%d" % int(sig)] + self._layout_args)["signalled"]

    # ----- addressing and commands ----------------------------------------
    def _host(self, host):
        self._check(host)
        if self._layout is None:
            raise RuntimeError("Cluster: no namespace layout (the mlfabric-netns command "
                               "is not built)")
        return self._layout["hosts"][host]

    def ns(self, host):
        """Namespace name of host."""
        return self._host(host)["namespace"]

    def ns_of_switch(self):
        if self._layout is None:
            raise RuntimeError("Cluster: no namespace layout")
        return self._layout["switch_namespace"]

    def ip(self, host):
        """The host's address: its veth IP (netns) or 127.0.0.1 (loopback)."""
        self._check(host)
        if self.mode == "loopback":
            return "127.0.0.1"
        return self._host(host)["address"]

    def wrap(self, host, argv):
        """argv that runs `argv` inside host's namespace."""
        self._check(host)
        if self.mode == "netns":
            return list(self._host(host)["wrap"]) + list(argv)
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
        if self.mode != "netns" or (up_bps is None and down_bps is None):
            return
        args = ["set-rate", "--host=" + host] + self._layout_args
        if up_bps is not None:
            args.append("--up_bps=%r" % max(8000.0, float(up_bps)))
        if down_bps is not None:
            args.append("--down_bps=%r" % max(8000.0, float(down_bps)))
        _cli(args)

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
        return _cli(["link-bytes"] + self._layout_args)

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
