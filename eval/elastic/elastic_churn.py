"""The elastic-training experiment (eval/elastic/README.md): runs
elastic_train.py under mlfabric-run --host-discovery-script, SIGKILLs
ranks, and prints and writes the figures. Started by elastic_churn.sh,
which finds the built binaries."""
import argparse
import datetime
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import churn_logs

HERE = os.path.dirname(os.path.abspath(__file__))
FAILURES_PER_HOST = 2  # mlfabric-run blacklists a host at its 3rd failure


def progress(text):
    sys.stderr.write("elastic_churn: %s\n" % text)
    sys.stderr.flush()


def host_names():
    """Names of this machine for emulated hosts (one rank and one mlfabricd
    each): localhost for rank 0, then 127.0.0.1, the names /etc/hosts gives
    127.0.0.1, the host name and its first IPv4 address."""
    names = ["localhost", "127.0.0.1"]
    try:
        with open("/etc/hosts") as f:
            for line in f:
                words = line.split("#")[0].split()
                if words and words[0] == "127.0.0.1":
                    names += words[1:]
    except OSError:
        pass
    names.append(socket.gethostname())
    try:
        names.append(socket.gethostbyname(socket.gethostname()))
        names.append(subprocess.run(["hostname", "-I"], capture_output=True, text=True,
                                    check=False).stdout.split()[0])
    except (OSError, IndexError):
        pass
    unique = []
    for n in names:
        if n and ":" not in n and n not in unique:
            unique.append(n)
    return unique


class Job:
    """One mlfabric-run --host-discovery-script job of elastic_train.py;
    the discovery script prints self.hosts (host:1 lines), which the
    driver rewrites to drop or add hosts."""

    def __init__(self, args, label, hosts, want):
        self._args, self.label, self.hosts = args, label, list(hosts)
        self._dir = os.path.join(args.work, label)
        shutil.rmtree(self._dir, ignore_errors=True)
        os.makedirs(self._dir)
        self._hosts_file = os.path.join(self._dir, "hosts")
        self.write_hosts()
        script = os.path.join(self._dir, "discover.sh")
        with open(script, "w") as f:
            f.write("#!/bin/sh\ncat '%s'\n" % self._hosts_file)
        os.chmod(script, 0o755)
        self._launcher_log = os.path.join(self._dir, "mlfabric-run.txt")
        self._command = [args.run, "--host-discovery-script", script, "--discovery_interval_s",
                        "0.2", args.python, os.path.join(HERE, "elastic_train.py"), self._dir,
                        str(args.steps), str(args.seed), str(want), str(args.step_ms),
                        args.model]
        progress("%s: %s" % (label, " ".join(self._command)))
        self._out = open(self._launcher_log, "w")
        self.process = subprocess.Popen(self._command, stdout=self._out, stderr=subprocess.STDOUT)
        self.kills = []

    def write_hosts(self):
        with open(self._hosts_file + ".tmp", "w") as f:
            f.write("".join("%s:1\n" % h for h in self.hosts))
        os.replace(self._hosts_file + ".tmp", self._hosts_file)

    def logs(self):
        return churn_logs.Logs(self._dir)

    def launcher_text(self):
        with open(self._launcher_log) as f:
            return f.read()

    def wait_until(self, what, condition, timeout_s):
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if condition():
                return True
            if self.process.poll() is not None:
                raise RuntimeError("%s: the job ended (code %s) while waiting for %s; see %s" % (
                    self.label, self.process.returncode, what, self._launcher_log))
            time.sleep(0.05)
        raise RuntimeError("%s: no %s after %g s; see %s" % (self.label, what, timeout_s,
                                                             self._launcher_log))

    def live(self):
        """{worker name: pid} of the processes that logged and are alive."""
        found = {}
        for name, pid in self.logs().starts:
            try:
                os.kill(pid, 0)
                found[name] = pid
            except OSError:
                pass
        return found

    def wait_all_stepping(self, size, timeout_s=60):
        """Until `size` live processes have each logged a step at that size."""
        def ready():
            logs, live = self.logs(), self.live()
            stepping = {s.name for s in logs.steps if s.size == size and live.get(s.name) == s.pid
                        and s.t > logs.starts[(s.name, s.pid)]}
            return len(stepping) >= size
        self.wait_until("%d ranks stepping at size %d" % (size, size), ready, timeout_s)

    def wait_step(self, step, timeout_s=120):
        self.wait_until("step %d" % step,
                        lambda: any(s.step >= step for s in self.logs().steps), timeout_s)

    def kill(self, name, hold_back=False):
        """SIGKILLs the process of worker `name`; hold_back: first SIGSTOPs
        it and drops its host from discovery (mlfabric-run stops it and
        starts no replacement), then SIGKILLs it."""
        pid = self.live()[name]
        if hold_back:
            os.kill(pid, signal.SIGSTOP)
            t = time.time()
            number = int(name[len("rank"):])
            self.hosts = self.hosts[:number] + self.hosts[number + 1:]
            self.write_hosts()
            self.wait_until("the launcher stopping rank %d" % number,
                            lambda: "stopping rank %d" % number in self.launcher_text(), 10)
            os.kill(pid, signal.SIGKILL)
        else:
            t = time.time()
            os.kill(pid, signal.SIGKILL)
        self.kills.append({"t": t, "name": name, "pid": pid, "held_back": hold_back})
        progress("%s: killed %s (pid %d)%s" % (self.label, name, pid,
                                               ", replacement held back" if hold_back else ""))

    def move(self, index, host):
        """Lists `host` instead of self.hosts[index]: its rank is stopped
        (SIGTERM) and a new one starts on `host`."""
        progress("%s: moving a rank from host %s to %s" % (self.label, self.hosts[index], host))
        self.hosts[index] = host
        self.write_hosts()

    def finish(self, timeout_s=300):
        try:
            code = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGINT)
            self.process.wait(timeout=60)
            raise RuntimeError("%s: the job did not end within %d s; see %s"
                               % (self.label, timeout_s, self._launcher_log))
        finally:
            self._out.close()
        progress("%s: the job exited with %d" % (self.label, code))
        return code


def final_of(job):
    """The job's end: code, final lines agreeing, size, accuracy, loss."""
    logs = job.logs()
    finals = logs.finals
    return {
        "exit_code": job.process.returncode,
        "final_ranks": len(finals),
        "final_sizes": sorted({f.size for f in finals}),
        "final_weights_equal": len({f.wcrc for f in finals}) == 1,
        "final_step": max((f.step for f in finals), default=None),
        "accuracy": finals[0].accuracy if finals else None,
        "loss": finals[0].loss if finals else None,
    }


def unplanned_exits(job):
    """Rank exits the launcher reported that the driver did not cause (not
    0, not a SIGKILL's 137, not a stop)."""
    lines = [l for l in job.launcher_text().splitlines() if " exited with " in l and "rank " in l]
    return [l for l in lines if not any(" exited with %s" % c in l for c in ("0", "137"))
            and "(stopped)" not in l]


def host_of_ranks(job):
    """{worker name: host} from the launcher's "host H: starting rank R" lines."""
    hosts = {}
    for line in job.launcher_text().splitlines():
        words = line.split()
        if "starting" in words and "rank" in words and words[1] == "host":
            hosts["rank" + words[words.index("rank") + 1]] = words[2].rstrip(":")
    return hosts


def churn_run(args, names):
    """See churn_steps; a job left running by an error is stopped (SIGINT)."""
    jobs = []
    try:
        return churn_steps(args, names, jobs)
    except BaseException:
        for job in jobs:
            if job.process.poll() is None:
                job.process.send_signal(signal.SIGINT)
                job.process.wait(timeout=60)
        raise


def churn_steps(args, names, jobs):
    """4 ranks (--slots), --kills SIGKILLs of non-zero ranks (the first of
    rank 0 with --kill_rank0), each after the last replacement stepped
    (+ --spacing_s), then --moves host moves."""
    hosts, failures, moves = names[:args.slots], {}, 0
    job = Job(args, "faults" if args.kills or args.moves else "no-faults", hosts, args.slots)
    jobs.append(job)
    job.wait_all_stepping(args.slots)
    job.wait_step(args.warmup_steps)

    def move(for_kill):
        """Moves a rank to an unlisted host name (for_kill: a worn-out
        host's rank, to a name that can still fail); False if none."""
        nonlocal moves
        worn = [i for i in range(1, len(job.hosts)) if failures.get(job.hosts[i], 0) >= 2]
        spares = [h for h in names if h not in job.hosts
                  and (not for_kill or failures.get(h, 0) < FAILURES_PER_HOST)]
        if not spares or (for_kill and not worn):
            return False
        moved = time.time()
        job.move(worn[0] if worn else 1 + moves % (args.slots - 1), spares[0])
        moves += 1
        job.wait_until("a rank started on %s stepping" % spares[0], lambda: any(
            job.logs().starts[(s.name, s.pid)] > moved for s in job.logs().steps), 60)
        job.wait_all_stepping(args.slots)
        time.sleep(args.spacing_s)
        return True

    def victim(i):
        where = host_of_ranks(job)
        if i == 0 and args.kill_rank0 and "rank0" in job.live():
            return "rank0", where
        names = [n for n in sorted(job.live()) if n != "rank0"
                 and failures.get(where.get(n), 0) < FAILURES_PER_HOST]
        return (names[i % len(names)], where) if names else (None, where)

    for i in range(args.kills):
        chosen, where = victim(i)
        if chosen is None and move(True):
            chosen, where = victim(i)
        if chosen is None:
            progress("no host name left that can fail again without being blacklisted "
                     "after %d kills" % i)
            break
        victim_name = chosen
        job.kill(victim_name)
        failures[where[victim_name]] = failures.get(where[victim_name], 0) + 1
        killed = job.kills[-1]["t"]

        def replaced():
            logs = job.logs()
            return any(logs.starts[(s.name, s.pid)] > killed for s in logs.steps)
        job.wait_until("a replacement of %s stepping" % victim_name, replaced, 60)
        job.wait_all_stepping(args.slots)
        progress("kill %d of %d: %s replaced" % (i + 1, args.kills, victim_name))
        time.sleep(args.spacing_s)
    for _ in range(args.moves):
        if not move(False):
            break
    job.finish(args.timeout_s)
    return job, moves


def churn_figures(job, moves):
    logs = job.logs()
    figures = final_of(job)
    kills = []
    for i, k in enumerate(job.kills):
        until = job.kills[i + 1]["t"] if i + 1 < len(job.kills) else float("inf")
        survivors, joined = churn_logs.after_kill(logs, k, until)
        kills.append({"worker": k["name"], "survivors_next_step_s": survivors,
                      "replacement_first_step_s": joined})
    checks, reasons = churn_logs.consistency(logs)
    gens = sorted({g for g, _ in logs.enters})
    figures.update({
        "kills": kills, "host_moves": moves,
        "membership_changes": gens[-1] - gens[0] if gens else 0,
        "rounds": checks, "failure_reasons": reasons,
        "unplanned_exits": unplanned_exits(job),
    })
    return figures


def shrink_run(args, names):
    """Steps per second of the survivors after a held-back kill, and of a
    fresh job of that many ranks, over the same steps."""
    n = args.slots - 1
    at = max(args.warmup_steps, args.steps // 3)
    job = Job(args, "shrink", names[:args.slots], n)
    job.wait_all_stepping(args.slots)
    job.wait_step(at)
    job.kill("rank%d" % n, hold_back=True)
    job.finish(args.timeout_s)
    fresh = Job(args, "fresh", names[:n], n)
    fresh.finish(args.timeout_s)
    logs = job.logs()
    shrunk = [s.step for s in logs.steps if s.name == "rank0" and s.size == n]
    first = min(shrunk) + 5 if shrunk else args.steps
    after = churn_logs.steps_per_second(logs, "rank0", n, first, args.steps)
    base = churn_logs.steps_per_second(fresh.logs(), "rank0", n, first, args.steps)
    return {"ranks": n, "steps": [first, args.steps], "after_shrink_steps_per_s": after,
            "fresh_steps_per_s": base, "ratio": after / base if after and base else None,
            "exit_codes": [job.process.returncode, fresh.process.returncode]}


def targets(figures):
    """(target, measured, met) rows of the summary."""
    rows = []
    churn = figures["churn"]
    kills = churn["kills"]
    if kills:
        nexts = [k["survivors_next_step_s"] for k in kills]
        joins = [k["replacement_first_step_s"] for k in kills]
        worst = max(nexts) if None not in nexts else None
        rows.append(("survivors' next step after a SIGKILL <= 5 s (worst of %d)" % len(kills),
                     "n/a" if worst is None else "%.2f s" % worst,
                     worst is not None and worst <= 5))
        worst = max(joins) if None not in joins else None
        rows.append(("replacement's first step <= 10 s after the kill (worst)",
                     "none" if worst is None else "%.2f s" % worst,
                     worst is not None and worst <= 10))
    rounds = churn["rounds"]
    rows.append(("identical weights at every commit ((generation, step)s that differ)",
                 "%d of %d" % (rounds.get("weights_differ", 0), rounds.get("rounds", 0)),
                 rounds.get("weights_differ", 0) == 0))
    want = figures["slots"]
    ok_end = churn["exit_code"] == 0 and churn["final_sizes"] == [want] and \
        churn["final_ranks"] == want and churn["final_weights_equal"]
    rows.append(("the job ends with %d ranks, same final weights, exit 0" % want,
                 "%d final, sizes %s, exit %s" % (churn["final_ranks"], churn["final_sizes"],
                                                  churn["exit_code"]), ok_end))
    if figures.get("no_faults"):
        a, b = churn["accuracy"], figures["no_faults"]["accuracy"]
        rows.append(("final accuracy within 1 point of the run without faults",
                     "%.2f%% vs %.2f%%" % (100 * a, 100 * b), abs(a - b) <= 0.01))
    bad = sum(rounds.get(k, 0) for k in ("mixed_outcome", "sums_differ", "mixed_generation"))
    rows.append(("%d membership changes (target 20): no hang, no mixed round, one outcome"
                 % churn["membership_changes"],
                 "%d bad rounds, %d unplanned exits" % (bad, len(churn["unplanned_exits"])),
                 bad == 0 and not churn["unplanned_exits"] and churn["membership_changes"] >= 20))
    shrink = figures.get("shrink")
    if shrink:
        r = shrink["ratio"]
        rows.append(("steps/s of %d survivors >= 0.9x a fresh %d-rank job" % (
            shrink["ranks"], shrink["ranks"]), "n/a" if r is None else "%.2fx (%.1f vs %.1f)" % (
                r, shrink["after_shrink_steps_per_s"], shrink["fresh_steps_per_s"]),
            r is not None and r >= 0.9))
    return rows


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--run", required=True, help="the built mlfabric-run")
    p.add_argument("--python", required=True, help="a Python with numpy and sklearn")
    p.add_argument("--kills", type=int, default=1, help="SIGKILLs of non-zero ranks (default 1)")
    p.add_argument("--kill_rank0", action="store_true",
                   help="the first kill takes rank 0, whose process serves the AllReducer's root")
    p.add_argument("--moves", type=int, default=0,
                   help="after the kills, ranks moved to another host name (2 changes each)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--step_ms", type=float, default=20.0, help="sleep per step (default 20)")
    p.add_argument("--model", choices=("softmax", "keras"), default="softmax",
                   help="the ranks' model: numpy softmax regression (default) or a Keras MLP "
                        "in a KerasState (needs TensorFlow; slower to start)")
    p.add_argument("--warmup_steps", type=int, default=20, help="steps before the first kill")
    p.add_argument("--spacing_s", type=float, default=1.0,
                   help="after a replacement steps, wait this long before the next kill")
    p.add_argument("--skip", default="", help="comma list of runs to leave out: "
                   "no_faults (the accuracy reference), shrink (the throughput runs)")
    p.add_argument("--timeout_s", type=float, default=600)
    p.add_argument("--work", default="", help="where the runs' logs go (default: a temp dir)")
    p.add_argument("--json", default="", help="write the figures here")
    args = p.parse_args(argv)
    for name in ("kills", "moves", "steps", "slots"):
        if getattr(args, name) < (2 if name == "slots" else 1 if name == "steps" else 0):
            p.error("--%s %d is too small" % (name, getattr(args, name)))
    args.skip = set(filter(None, args.skip.split(",")))
    if args.skip - {"no_faults", "shrink"}:
        p.error("--skip: unknown run(s) %s (no_faults, shrink)" % ", ".join(args.skip - {
            "no_faults", "shrink"}))
    return args


def main(argv):
    args = parse_args(argv)
    args.work = args.work or tempfile.mkdtemp(prefix="elastic-churn-")
    names = host_names()
    if len(names) < args.slots:
        sys.exit("elastic_churn: --slots %d needs %d names of this machine, found %s"
                 % (args.slots, args.slots, ", ".join(names)))
    progress("logs in %s; host names %s" % (args.work, ", ".join(names)))
    figures = {"slots": args.slots, "steps": args.steps, "seed": args.seed,
               "step_ms": args.step_ms, "model": args.model, "hosts": names}
    job, moves = churn_run(args, names)  # stops its job if it raises
    figures["churn"] = churn_figures(job, moves)
    progress("churn: %s" % json.dumps(figures["churn"]))
    if "no_faults" not in args.skip and (args.kills or args.moves):
        reference = Job(args, "no-faults", names[:args.slots], args.slots)
        reference.finish(args.timeout_s)
        figures["no_faults"] = final_of(reference)
    if "shrink" not in args.skip:
        figures["shrink"] = shrink_run(args, names)
    rows = targets(figures)
    print("%-72s %-34s %s" % ("target", "measured", "met"))
    for target, measured, met in rows:
        print("%-72s %-34s %s" % (target, measured, "met" if met else "NOT MET"))
    if args.json:
        record = {"what": "elastic training under churn (eval/elastic/README.md)",
                  "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                  "commit": os.environ.get("MLFABRIC_COMMIT", "unknown"),
                  "command": os.environ.get("MLFABRIC_COMMAND", " ".join(sys.argv)),
                  "figures": figures,
                  "targets": [{"target": t, "measured": m, "met": bool(ok)} for t, m, ok in rows]}
        with open(args.json, "w") as f:
            json.dump(record, f, indent=2)
        progress("wrote %s" % args.json)


if __name__ == "__main__":
    main(sys.argv[1:])
