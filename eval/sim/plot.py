#!/usr/bin/env python3
"""PNG plots of the simulator's --json_out files (docs/results.md).

    /opt/mlfabric/venv/bin/python eval/sim/plot.py \
        --results eval/sim/results --out docs/img

Reads, from --results (every file optional; a plot whose input is missing is
skipped with a message on stderr):
  table2-tau<T>-seed<S>.json   `mlfabric-sim --table2 --table2_system=mlfabric-a-<T> --seed=<S>`
  c1n1.json                    `mlfabric-sim --systems=...` (one run of several systems)
  overhead.json                `mlfabric-sim --overhead`
  calibration.json             `mlfabric-sim --calibration`
  sim-1000.json                `mlfabric-sim --workers=1000 ...`
  testbed-config-seed<S>.json  the simulator on the testbed's configuration
  testbed-run-seed<S>.json     results.json of `mlfabric-testbed --seed=<S>`
and writes docs/img/sim-table2.png, sim-tta.png, sim-delay.png,
sim-overhead.png, sim-calibration.png, sim-1000.png, sim-vs-testbed.png. It also prints the
Table 2 speedups averaged over the seeds found (the figures quoted in
docs/results.md).
"""

import argparse
import glob
import json
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# Paper Table 2 (§7.1): speedup of MLfabric-A-30 over RR-Sync.
PAPER_TABLE2 = {
    "C1-N1": 1.74, "C1-N2": 1.23, "C1-N3": 1.42,
    "C2-N1": 2.96, "C2-N2": 2.00, "C2-N3": 2.32,
    "C3-N1": 1.90, "C3-N2": 1.33, "C3-N3": 1.42,
}
# Paper §7.4: scheduler ms per batch of |U| updates.
PAPER_OVERHEAD = {100: 30, 500: 440, 1000: 1460}


def load(path):
    if not os.path.exists(path):
        print(f"plot.py: {path} missing, plot skipped", file=sys.stderr)
        return None
    with open(path) as f:
        return json.load(f)


def table2(results, out):
    """Grouped bars: paper vs simulator (mean over seeds, min-max whiskers)."""
    speedups = {}  # tau -> cell -> [speedup per seed]
    implied = {}   # tau -> cell -> [RR-Sync round s the paper's speedup implies]
    for path in sorted(glob.glob(os.path.join(results, "table2-tau*-seed*.json"))):
        m = re.search(r"table2-tau(\d+)-seed(\d+)\.json$", path)
        if not m:
            continue
        tau = int(m.group(1))
        data = load(path)
        workers = data["config"]["workers"]
        for cell in data["table2"]:
            key = f'{cell["compute"]}-{cell["network"]}'
            speedups.setdefault(tau, {}).setdefault(key, []).append(cell["speedup"])
            mlf = cell["mlfabric"]
            if mlf["reached_target"] and mlf["applied"] > 0:
                # Same gradients to the target at the paper's speedup S: RR-Sync
                # would have to take S * N / (MLfabric applied gradients per s).
                rate = mlf["applied"] / mlf["time_to_target_s"]
                implied.setdefault(tau, {}).setdefault(key, []).append(
                    PAPER_TABLE2[key] * workers / rate)
    if not speedups:
        print("plot.py: no table2-*.json, sim-table2.png skipped", file=sys.stderr)
        return
    cells = list(PAPER_TABLE2)
    taus = sorted(speedups)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / (1 + len(taus))
    xs = range(len(cells))
    ax.bar([x - 0.4 + width / 2 for x in xs], [PAPER_TABLE2[c] for c in cells], width,
           label="paper Table 2 (MLfabric-A-30)", color="#999999")
    print("Table 2 speedup of MLfabric-A over RR-Sync, simulator, mean [min, max] over seeds:")
    for i, tau in enumerate(taus):
        means, lo, hi = [], [], []
        for c in cells:
            v = speedups[tau].get(c, [0])
            mean = sum(v) / len(v)
            means.append(mean)
            lo.append(mean - min(v))
            hi.append(max(v) - mean)
        seeds = len(next(iter(speedups[tau].values())))
        ax.bar([x - 0.4 + width * (i + 1.5) for x in xs], means, width, yerr=[lo, hi],
               capsize=2, label=f"simulator MLfabric-A-{tau} ({seeds} seeds)")
        print(f"  tau {tau}: " + "  ".join(
            f"{c} {m:.2f}" for c, m in zip(cells, means)))
        if tau in implied:
            print(f"  tau {tau}: RR-Sync round (s) the paper's speedup would need, "
                  "given the simulated MLfabric-A rate: " + "  ".join(
                      f"{c} {sum(implied[tau][c]) / len(implied[tau][c]):.2f}"
                      for c in cells if c in implied[tau]))
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(cells)
    ax.set_ylabel("speedup over RR-Sync (time to accuracy)")
    ax.set_title("Table 2: MLfabric-A vs RR-Sync, 30 workers (above 1: MLfabric-A faster)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "sim-table2.png"), dpi=110)
    plt.close(fig)


def tta(data, out, name, title):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    target = data["config"]["target_accuracy"]
    for run in data["runs"]:
        curve = run["accuracy_curve"]
        label = run["system"]
        if run["reached_target"]:
            label += f' ({run["time_to_target_s"]:.1f} s)'
        ax.plot([p[0] for p in curve], [p[1] for p in curve], label=label)
    ax.axhline(target, color="black", linewidth=0.8, linestyle="--")
    ax.set_xlabel("simulated seconds")
    ax.set_ylabel("test accuracy of the server model")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, name), dpi=110)
    plt.close(fig)


def delay(data, out):
    fig, ax = plt.subplots(figsize=(7, 4))
    for run in data["runs"]:
        hist = {int(k): v for k, v in run["delay_histogram"].items()}
        if not hist or max(hist) == 0:
            continue  # synchronous systems: every delay is 0
        total = sum(hist.values())
        ks = list(range(0, max(hist) + 1))
        ax.step(ks, [hist.get(k, 0) / total for k in ks], where="mid",
                label=f'{run["system"]} (mean {run["mean_delay"]:.1f}, max {run["max_delay"]})')
    ax.set_xlabel("delay of an applied update (model versions)")
    ax.set_ylabel("fraction of applied updates")
    ax.set_title("Delay distribution, C1-N1, 30 workers")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "sim-delay.png"), dpi=110)
    plt.close(fig)


def overhead(data, out):
    rows = data["overhead"]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.loglog([r["updates"] for r in rows], [r["ms_mean"] for r in rows], "o-",
              label="core planner, this machine (mean)")
    if all("ms_min" in r for r in rows):
        ax.loglog([r["updates"] for r in rows], [r["ms_min"] for r in rows], "v:",
                  label="core planner, this machine (min)")
    ax.loglog(list(PAPER_OVERHEAD), list(PAPER_OVERHEAD.values()), "s--", color="#777777",
              label="paper §7.4")
    ax.set_xlabel("updates per batch |U| (|U|/2 hosts)")
    ax.set_ylabel("ms per batch")
    ax.set_title("Scheduler overhead (§7.4)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "sim-overhead.png"), dpi=110)
    plt.close(fig)


def calibration(data, out):
    rows = data["calibration"]
    fig, ax = plt.subplots(figsize=(10, 3.5))
    labels = [f'{r["section"]} {r["quantity"]}' for r in rows]
    ratios = [r["sim"] / r["paper"] if r["paper"] else 0 for r in rows]
    ax.barh(range(len(rows)), ratios, color="#4477aa")
    ax.axvline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    for i, (r, q) in enumerate(zip(rows, ratios)):
        ax.text(q, i, f' {r["sim"]:.1f} vs {r["paper"]:.0f} {r["unit"]}', va="center", fontsize=7)
    ax.set_xlabel("simulator / paper")
    ax.set_xlim(0, max(ratios) * 1.3)
    ax.set_title("Simulator against the paper's stated figures")
    fig.subplots_adjust(left=0.42, right=0.98, bottom=0.15)
    fig.savefig(os.path.join(out, "sim-calibration.png"), dpi=110)
    plt.close(fig)


# Testbed system names (eval/testbed) -> simulator names.
TESTBED_NAMES = {"mlfabric-a8": "mlfabric-a-8", "mlfabric-a16": "mlfabric-a-16",
                 "mlfabric-s": "mlfabric-s", "vanilla": "async", "rr-sync": "rr-sync",
                 "tr-sync": "tr-sync"}


def testbed(results, out):
    """Time to accuracy, simulator vs testbed, per seed both were run with."""
    pairs = []
    for path in sorted(glob.glob(os.path.join(results, "testbed-run-seed*.json"))):
        seed = re.search(r"seed(\d+)\.json$", path).group(1)
        sim = load(os.path.join(results, f"testbed-config-seed{seed}.json"))
        if sim:
            pairs.append((seed, load(path), sim))
    if not pairs:
        print("plot.py: no testbed-run-seed*.json, sim-vs-testbed.png skipped", file=sys.stderr)
        return
    systems = list(TESTBED_NAMES)
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / (2 * len(pairs))
    for i, (seed, tb, sim) in enumerate(pairs):
        sim_tta = {r["system"]: r["time_to_target_s"] if r["reached_target"] else 0
                   for r in sim["runs"]}
        tb_tta = [(tb["systems"].get(name) or {}).get("tta_s") or 0 for name in systems]
        xs = [x - 0.4 + width * (2 * i + 0.5) for x in range(len(systems))]
        ax.bar(xs, tb_tta, width, label=f"testbed seed {seed}", color=f"C{2 * i}")
        ax.bar([x + width for x in xs], [sim_tta.get(TESTBED_NAMES[n], 0) for n in systems],
               width, label=f"simulator seed {seed}", color=f"C{2 * i + 1}")
    ax.set_xticks(range(len(systems)))
    ax.set_xticklabels(systems)
    ax.set_ylabel("seconds to 0.70 test accuracy (0: failed)")
    ax.set_title("Same configuration: 8 workers, C1-N1, emulated testbed vs simulator")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.2)
    ax.legend(fontsize=8, ncol=2 * len(pairs), loc="upper center")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "sim-vs-testbed.png"), dpi=110)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="eval/sim/results")
    parser.add_argument("--out", default="docs/img")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    table2(args.results, args.out)
    c1n1 = load(os.path.join(args.results, "c1n1.json"))
    if c1n1:
        tta(c1n1, args.out, "sim-tta.png", "Time to accuracy, C1-N1, 30 workers")
        delay(c1n1, args.out)
    data = load(os.path.join(args.results, "overhead.json"))
    if data:
        overhead(data, args.out)
    data = load(os.path.join(args.results, "calibration.json"))
    if data:
        calibration(data, args.out)
    data = load(os.path.join(args.results, "sim-1000.json"))
    if data:
        tta(data, args.out, "sim-1000.png",
            f'{data["config"]["workers"]} workers, C1-N1 (accuracy over time)')
    testbed(args.results, args.out)
    print(f"wrote plots to {args.out}")


if __name__ == "__main__":
    main()
