"""PNG plots of one mlfabric-testbed run (results.json as mlfabric_testbed.py writes it).

write_all(results, out_dir) -> list of paths:
  testbed-tta.png         test accuracy vs time per system (time-to-accuracy curves)
  testbed-iteration.png   iteration-time distribution per system (box plot)
  testbed-drops.png       applied/dropped counts and the applied updates' delay histogram
  testbed-links.png       per-link utilisation (bytes moved / capacity offered by the trace)

Usage: python3 plots.py <out_dir>   (re-plots <out_dir>/results.json)
"""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def write_all(results, out_dir, prefix="testbed-"):
    systems = results["systems"]
    cfg = results["config"]
    title = "%s-%s, %d workers (%s)" % (cfg["compute"], cfg["network"], cfg["workers"], cfg["mode"])
    paths = []

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for name, r in systems.items():
        if r.get("curve"):
            t, acc = zip(*r["curve"])
            ax.plot(t, acc, label=name, linewidth=1.2)
    ax.axhline(cfg["target_accuracy"], color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("time since the workers started (s)")
    ax.set_ylabel("test accuracy")
    ax.set_title("Time to accuracy, " + title, fontsize=10)
    ax.legend(fontsize=8)
    paths.append(_save(fig, os.path.join(out_dir, prefix + "tta.png")))

    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    names = [n for n, r in systems.items() if r.get("iteration_s")]
    if names:
        ax.boxplot([[1e3 * x for x in systems[n]["iteration_s"]] for n in names],
                   tick_labels=names, showfliers=False)
    ax.set_ylabel("iteration time per worker (ms)")
    ax.set_title("Iteration time, " + title, fontsize=10)
    ax.tick_params(axis="x", labelsize=8)
    paths.append(_save(fig, os.path.join(out_dir, prefix + "iteration.png")))

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8, 3.2))
    names = list(systems)
    applied = [systems[n].get("applied", 0) for n in names]
    dropped = [systems[n].get("dropped", 0) for n in names]
    ax1.bar(names, applied, label="applied")
    ax1.bar(names, dropped, bottom=applied, label="dropped")
    ax1.set_ylabel("updates")
    ax1.tick_params(axis="x", labelsize=7, rotation=30)
    ax1.legend(fontsize=8)
    ax1.set_title("Updates applied / dropped", fontsize=10)
    for n in names:
        delays = systems[n].get("delays") or []
        if delays:
            ax2.hist(delays, bins=range(0, max(delays) + 2), histtype="step", label=n)
    ax2.set_xlabel("delay (updates applied since v(g))")
    ax2.set_ylabel("applied updates")
    ax2.set_title("Delay of applied updates", fontsize=10)
    if ax2.has_data():
        ax2.legend(fontsize=8)
    paths.append(_save(fig, os.path.join(out_dir, prefix + "drops.png")))

    fig, ax = plt.subplots(figsize=(8, 3.2))
    names = [n for n, r in systems.items() if r.get("links")]
    if names:
        hosts = list(systems[names[0]]["links"])
        width = 0.8 / len(names)
        for i, n in enumerate(names):
            links = systems[n]["links"]
            ax.bar([j + i * width for j in range(len(hosts))],
                   [max(links[h]["up_util"] or 0, links[h]["down_util"] or 0) for h in hosts],
                   width=width, label=n)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(hosts))])
        ax.set_xticklabels(hosts)
        ax.legend(fontsize=7, ncol=3)
    ax.set_ylabel("busier direction: bytes / capacity")
    ax.set_title("Per-link utilisation, " + title, fontsize=10)
    paths.append(_save(fig, os.path.join(out_dir, prefix + "links.png")))
    return paths


if __name__ == "__main__":
    d = sys.argv[1]
    with open(os.path.join(d, "results.json")) as f:
        for p in write_all(json.load(f), d):
            print(p)
