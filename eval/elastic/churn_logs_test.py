#!/usr/bin/env python3
"""churn_logs on hand-written logs: each disagreement it looks for is
found, a clean churn (a kill, a shrunk round, a replacement) passes, and
the times after a kill are read right."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import churn_logs  # noqa: E402


def logs_of(files):
    """files: {"rank1-11": "lines"} -> Logs of a directory holding them."""
    d = tempfile.mkdtemp()
    for name, text in files.items():
        with open(os.path.join(d, "log-" + name), "w") as f:
            f.write(text)
    return churn_logs.Logs(d)


def rank(name, pid, start, gen_steps, final=None):
    """Lines of one process: gen_steps = [(t, gen, size, rank, step, sum, mask, w)]."""
    lines = ["start %f" % start]
    for gen in sorted({g[1] for g in gen_steps}):
        lines.append("enter %f %d 0 0" % (start, gen))
    for t, gen, size, r, step, s, mask, w in gen_steps:
        lines.append("step %f %d %d %d %d %s %d 128 %s" % (t, gen, size, r, step, s, mask, w))
    if final:
        lines.append(final)
    return {"%s-%d" % (name, pid): "\n".join(lines) + "\n"}


def clean():
    # rank0 and rank1 (bits 1, 2) at gen 5; rank1 killed at t=10.5 (pid 11);
    # step 2's round completes without it; gen 6 has rank0 alone, gen 7
    # rank0 and the replacement (pid 12).
    files = {}
    files.update(rank("rank0", 10, 0, [(10, 5, 2, 0, 1, "s1", 3, "w1"), (11, 5, 2, 0, 2, "s2", 1,
                                                                         "w2"),
                                       (11.5, 6, 1, 0, 3, "s3", 1, "w3"),
                                       (13, 7, 2, 0, 4, "s4", 3, "w4")]))
    files.update(rank("rank1", 11, 0, [(10, 5, 2, 1, 1, "s1", 3, "w1")]))
    files.update(rank("rank1", 12, 12, [(13, 7, 2, 1, 4, "s4", 3, "w4")]))
    return files


def counts(files):
    return churn_logs.consistency(logs_of(files))[0]


def main():
    c = counts(clean())
    assert c["rounds"] == 4 and c.get("shrunk_rounds") == 1, c
    for bad in ("weights_differ", "sums_differ", "mixed_outcome", "mixed_generation"):
        assert c.get(bad, 0) == 0, (bad, c)
    logs = logs_of(clean())
    survivors, joined = churn_logs.after_kill(logs, {"t": 10.5, "name": "rank1", "pid": 11})
    assert abs(survivors - 0.5) < 1e-6 and abs(joined - 2.5) < 1e-6, (survivors, joined)

    files = clean()
    files["rank1-12"] = files["rank1-12"].replace("w4", "wX")
    assert counts(files).get("weights_differ") == 1
    files = clean()
    files["rank1-12"] = files["rank1-12"].replace("s4", "sX")
    assert counts(files).get("sums_differ") == 1
    files = clean()
    files["rank1-12"] += "fail 13.1 7 2 1 3 round 9 failed\n"  # step 4's round, failed here
    assert counts(files).get("mixed_outcome") == 1
    files = clean()
    # rank0 in gen 6 alone, but its sum holds rank1 too.
    files["rank0-10"] = files["rank0-10"].replace("6 1 0 3 s3 1", "6 1 0 3 s3 3")
    assert counts(files).get("mixed_generation") == 1
    print("churn_logs_test: OK")


if __name__ == "__main__":
    main()
