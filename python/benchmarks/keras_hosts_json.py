#!/usr/bin/env python3
"""Writes one keras_hosts.sh run into a file in the structure of
docs/results/keras-hosts.json (what tools/docs/results_tables.py renders as
docs/results.md §3.3): the run becomes its model's entry, replacing an
earlier entry of that model; the file is created when missing.

  keras_hosts_json.py FILE --model M --rate_bps R --straggle S
      --command CMD --pairs PAIRS [--env NAME=VALUE]...

PAIRS holds a line per pair, "MPI_STEPS_PER_S MLFABRIC_STEPS_PER_S", the
rates rank 0 printed. Each pair is stored with steps per second to three
decimals and the ratio mlfabric / mpi to two, as keras_hosts.sh prints it
(results_tables.py checks each ratio against the rates beside it). Python 3 standard library only.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys

WHAT = ("Keras steps per second with the mlfabric backend against mpi, two "
        "network-namespace hosts, one rank each, shaped links, a fraction of each "
        "rank's steps slower (docs/results.md §3.3)")
NOTE = ("Written by python/benchmarks/keras_hosts.sh --json: per model the last run, "
        "each pair's rank-0 steps per second with each backend (three decimals) and the "
        "ratio mlfabric / mpi (two decimals), pairs run back "
        "to back, mpi first.")


def read_pairs(path):
    pairs = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            words = line.split()
            if not words:
                continue
            try:
                mpi, fabric = (float(w) for w in words)
            except ValueError:
                raise SystemExit("keras_hosts_json: %s line %d: expected two steps-per-second "
                                 "figures, got %r" % (path, number, line.rstrip("\n")))
            if mpi <= 0 or fabric <= 0:
                raise SystemExit("keras_hosts_json: %s line %d: steps per second must be "
                                 "positive, got %r" % (path, number, line.rstrip("\n")))
            pairs.append({"mpi_steps_per_s": round(mpi, 3),
                          "mlfabric_steps_per_s": round(fabric, 3),
                          "ratio": round(fabric / mpi, 2)})
    if not pairs:
        raise SystemExit("keras_hosts_json: %s holds no pair" % path)
    return pairs


def commit():
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        return subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file")
    parser.add_argument("--model", required=True)
    parser.add_argument("--rate_bps", type=float, required=True)
    parser.add_argument("--straggle", required=True)
    parser.add_argument("--command", required=True)
    parser.add_argument("--pairs", required=True)
    parser.add_argument("--env", action="append", default=[])
    args = parser.parse_args(argv)
    entry = {
        "model": args.model,
        "date": datetime.date.today().isoformat(),
        "commit": commit(),
        "command": args.command,
        "rate_bps": args.rate_bps,
        "straggle": args.straggle,
        "env": args.env,
        "pairs": read_pairs(args.pairs),
    }
    if os.path.exists(args.file):
        with open(args.file) as f:
            data = json.load(f)
        if not isinstance(data.get("models"), list):
            raise SystemExit("keras_hosts_json: %s has no \"models\" list (not a keras-hosts "
                             "file?)" % args.file)
    else:
        data = {"what": WHAT, "date": entry["date"], "commit": entry["commit"],
                "command": "python/benchmarks/keras_hosts.sh --model M --pairs N --json FILE",
                "note": NOTE, "models": []}
    # In place of the model's earlier entry (the table keeps its order), else last.
    models = data["models"]
    index = next((i for i, m in enumerate(models) if m.get("model") == args.model), None)
    if index is None:
        models.append(entry)
    else:
        models[index] = entry
    with open(args.file + ".tmp", "w") as f:
        json.dump(data, f, indent=2, ensure_ascii=False)
        f.write("\n")
    os.replace(args.file + ".tmp", args.file)
    print("# wrote %s (%s, %d pairs)" % (args.file, args.model, len(entry["pairs"])))


if __name__ == "__main__":
    main(sys.argv[1:])
