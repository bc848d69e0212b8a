"""Reads the per-process logs elastic_train.py writes and computes the
figures of the elastic-training experiment (eval/elastic/README.md). Pure
functions of the log lines: elastic_churn.py runs the jobs and calls them."""
import collections
import glob
import os

Step = collections.namedtuple("Step", "t name pid gen size rank step sumcrc mask count wcrc")
Fail = collections.namedtuple("Fail", "t name pid gen size rank step reason")
Final = collections.namedtuple("Final", "t name pid gen size rank step wcrc accuracy loss")


class Logs:
    """Every process's lines: .starts {(name, pid): t}, .enters, .steps, .fails, .finals."""

    def __init__(self, directory):
        self.starts, self.steps, self.fails, self.finals = {}, [], [], []
        self.enters = set()  # (generation, worker name) from "enter" lines
        for path in sorted(glob.glob(os.path.join(directory, "log-*"))):
            _, name, pid = os.path.basename(path).split("-")
            with open(path) as f:
                for line in f:
                    self._add(name, int(pid), line.split())

    def _add(self, name, pid, w):
        if len(w) < 2:
            return  # a line cut by SIGKILL
        t = float(w[1])
        if w[0] == "start":
            self.starts[(name, pid)] = t
        elif w[0] == "enter" and len(w) == 5:
            self.enters.add((int(w[2]), name))
        elif w[0] == "step" and len(w) == 10:
            self.steps.append(Step(t, name, pid, int(w[2]), int(w[3]), int(w[4]), int(w[5]),
                                   w[6], int(w[7]), int(w[8]), w[9]))
        elif w[0] == "fail" and len(w) >= 7:
            self.fails.append(Fail(t, name, pid, int(w[2]), int(w[3]), int(w[4]), int(w[5]),
                                   " ".join(w[6:])))
        elif w[0] == "final" and len(w) == 9:
            self.finals.append(Final(t, name, pid, int(w[2]), int(w[3]), int(w[4]), int(w[5]),
                                     w[6], float(w[7]), float(w[8])))


def worker_bit(name):
    return 1 << int(name[len("rank"):])


def after_kill(logs, kill, until=float("inf")):
    """Seconds from a kill (dict: t, name, pid) to (a) the last survivor's
    first step after it whose sum does not hold the killed worker, and (b)
    the first step of a process started after it (and before `until`, the
    next kill): the replacement, which takes the lowest free rank number,
    not always the killed one's. None where there is none."""
    t, name, pid = kill["t"], kill["name"], kill["pid"]
    survivors = {(n, p) for (n, p), start in logs.starts.items() if start < t and p != pid}
    firsts = {}
    for s in sorted(logs.steps):
        key = (s.name, s.pid)
        if key in survivors and key not in firsts and s.t > t and not s.mask & worker_bit(name):
            firsts[key] = s.t
    # Survivors that step after the kill (one killed later may never).
    survivors_next = max(firsts.values()) - t if firsts else None
    joiner = [s.t for s in logs.steps if t < logs.starts[(s.name, s.pid)] < until]
    return survivors_next, (min(joiner) - t if joiner else None)


def consistency(logs):
    """Checks every (generation, step) over all processes: the weights' CRC
    the same everywhere; a round completed on all that logged it (the same
    sum) or failed on all; the workers in a sum all in that generation."""
    by_round = collections.defaultdict(lambda: {"steps": [], "fails": []})
    for s in logs.steps:
        by_round[(s.gen, s.step)]["steps"].append(s)
    for f in logs.fails:
        by_round[(f.gen, f.step + 1)]["fails"].append(f)
    members = collections.defaultdict(set)  # generation -> workers that trained in it
    for gen, name in logs.enters:
        members[gen].add(name)
    out = collections.Counter()
    reasons = collections.Counter()
    for (gen, step), r in by_round.items():
        steps, fails = r["steps"], r["fails"]
        out["rounds"] += 1
        if steps and fails:
            out["mixed_outcome"] += 1
        if len({s.wcrc for s in steps}) > 1:
            out["weights_differ"] += 1
        if len({s.sumcrc for s in steps}) > 1:
            out["sums_differ"] += 1
        if fails:
            out["failed_rounds"] += 1
            reasons.update({f.reason for f in fails})
            if len({f.reason for f in fails}) > 1:
                out["fail_reasons_differ"] += 1
        for s in steps:
            # Workers outside the generation in the sum, or more than its size.
            inside = sum(worker_bit(n) for n in members[gen])
            if s.mask & ~inside or bin(s.mask).count("1") > s.size:
                out["mixed_generation"] += 1
        if steps and bin(steps[0].mask).count("1") < steps[0].size:
            out["shrunk_rounds"] += 1  # completed without a member that died in it
    return dict(out), dict(reasons)


def steps_per_second(logs, name, size, first_step, last_step):
    """Steps per second of worker `name` over its steps first..last done at `size`."""
    t = sorted(s.t for s in logs.steps
               if s.name == name and s.size == size and first_step <= s.step <= last_step)
    return (len(t) - 1) / (t[-1] - t[0]) if len(t) > 2 and t[-1] > t[0] else None
