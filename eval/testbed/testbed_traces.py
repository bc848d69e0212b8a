"""The testbed's network settings N0-N3 as bandwidth traces (mlfabric §7).

Each worker host's link rates are drawn every period from the setting's
distribution over RATES_BPS, with exactly the generator of
monitor/trace.cc, so the testbed, the simulator and the daemons' monitor
replay the same trace for the same seed. TraceDriver applies the trace to a
namespace cluster's shaped links and keeps what it applied, for the
capacity the links offered (capacity_integral).
"""
import threading
import time

RATES_BPS = [1e9, 2.5e9, 3.3e9, 5e9, 10e9]  # mlfabric.md §7, monitor/trace.h
NETWORK = {  # eval/sim/sim_config.cc, monitor/trace.cc
    "N0": [0, 0, 0, 0, 1],
    "N1": [0, 0, 0, 0.1, 0.9],
    "N2": [0, 0.1, 0.1, 0.1, 0.7],
    "N3": [0.5, 0, 0, 0, 0.5],
}
MASK = (1 << 64) - 1


def _mix(x):
    """SplitMix64, exactly monitor/trace.cc's Mix."""
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def trace_rate(setting, seed, step, direction, scale):
    """BandwidthTrace::Draw of monitor/trace.cc (direction 0 up, 1 down)."""
    bits = _mix(_mix(seed) ^ _mix((step * 2 + direction) & MASK))
    u = (bits >> 11) * 2.0 ** -53
    cumulative = 0.0
    for p, rate in zip(NETWORK[setting], RATES_BPS):
        cumulative += p
        if u < cumulative:
            return rate * scale
    return RATES_BPS[-1] * scale


class TraceDriver(threading.Thread):
    """Every period_s sets each worker host's htb rates to the N-trace."""

    def __init__(self, cluster, hosts, setting, seeds, period_s, scale):
        super().__init__(daemon=True)
        self.cluster, self.hosts, self.setting = cluster, hosts, setting
        self.seeds, self.period_s, self.scale = seeds, period_s, scale
        self.stop_event = threading.Event()
        self.history = []  # (t, host, up_bps, down_bps)
        self.error = None

    def rates_at_step(self, step):
        return {h: (trace_rate(self.setting, self.seeds[h], step, 0, self.scale),
                    trace_rate(self.setting, self.seeds[h], step, 1, self.scale))
                for h in self.hosts}

    def apply(self, step):
        now = time.time()
        for h, (up, down) in self.rates_at_step(step).items():
            self.cluster.set_rate(h, up_bps=up, down_bps=down)
            self.history.append((now, h, up, down))

    def run(self):
        start = time.time()
        step = 0
        try:
            while not self.stop_event.is_set():
                self.apply(step)
                step += 1
                self.stop_event.wait(max(0.0, start + step * self.period_s - time.time()))
        except Exception as e:  # reported by the caller
            self.error = str(e)

    def stop(self):
        self.stop_event.set()
        if self.ident is not None:  # started
            self.join(timeout=10)


def capacity_integral(history, host, t0, t1, direction):
    """Bits the host's link could carry in [t0, t1] under the applied trace."""
    points = [(t, up if direction == 0 else down) for t, h, up, down in history if h == host]
    total = 0.0
    for i, (t, rate) in enumerate(points):
        end = points[i + 1][0] if i + 1 < len(points) else t1
        lo, hi = max(t, t0), min(end, t1)
        if hi > lo:
            total += rate * (hi - lo)
    return total
