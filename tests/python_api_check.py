"""Run in every rank by tests/python_api_test.sh under mlfabric-run (2 ranks,
job "demo" plus a second job "other" on the same scheduler).

  1. a Python parameter server (mlfabric.Server, numpy callbacks) gets
     multi-tensor pushes with per-tensor priorities from the pybind11 binding
     and the TensorFlow op; its model is the exact sum; each Update carries
     worker, version, count, norm, bytes and an increasing commit sequence;
  2. exceptions and wrong return values in server callbacks fail that push
     or get with the Python error text, and the server keeps serving;
  3. bad input, each a clear exception and no hang: shapes and dtypes that
     differ across ranks (mpi and mlfabric AllReduce backends, numpy and TF),
     unsupported dtypes, priorities of the wrong length, unregistered
     servers, a push to another job's server, negative or contradicting
     bounds, a server without callbacks, a replica of no server;
  4. tensor fusion: mtf.grouped_allreduce gives, on both backends, eagerly
     and in a tf.function, the same bits fused (one AllReduce per dtype),
     in small buckets and unfused (one AllReduce per tensor) as allreduce
     of each tensor alone, and every dtype keeps its precision;
  5. a Replica (Python callback) registered before the pushes ends with
     exactly the server's model;
  6. failover: a Python Server on h0 (rank 0) leaves (stop() and close();
     its daemon reports it) and the scheduler promotes its Python Replica on
     h1 (rank 1): the promotion callback runs once with server, old_host,
     reason and model_version, `promoted` turns True, the workers' gets are
     answered by the replica's request callback with its model and versions
     that go on from the old server's, and later pushes are applied to it;
  7. a new Python standby of the promoted server, created with install=,
     installs a snapshot of its model (the exact model, at its version),
     then applies the copies of the later pushes and equals the server.
Prints "python_api_check rank R: OK" on success.
"""
import faulthandler
import os
import sys
import time

faulthandler.dump_traceback_later(240, exit=True)  # never hang the test
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import mlfabric
import numpy as np
import tensorflow as tf

import mlfabric.tensorflow as mtf

failures = []
reducer = mlfabric.init(backend="mpi")
rank, size = mlfabric.rank(), mlfabric.size()
assert size == 2, "run with mlfabric-run -np 2"


def expect(cond, what):
    if not cond:
        failures.append(what)
        print("rank %d: FAILED %s" % (rank, what), file=sys.stderr, flush=True)


def barrier():
    reducer.allreduce(np.zeros(1, np.float32))


def raises(fn, exc, *needles):
    """fn() must raise `exc` whose text contains every needle, within 60 s."""
    start = time.time()
    try:
        fn()
    except exc as e:
        text = str(e)
        missing = [n for n in needles if n not in text]
        expect(not missing, "%s message %r names %s" % (exc.__name__, text, missing))
        expect(time.time() - start < 60, "%s raised promptly" % exc.__name__)
        return text
    except Exception as e:  # the wrong kind
        expect(False, "expected %s(%s), got %s: %s" % (exc.__name__, needles, type(e).__name__, e))
        return None
    expect(False, "expected %s(%s), nothing raised" % (exc.__name__, needles))
    return None


def get_when_up(worker, server):
    for _ in range(200):
        try:
            return worker.get(server)
        except RuntimeError:
            time.sleep(0.05)
    return worker.get(server)


# ---- 1. a Python server: multi-tensor pushes with priorities
layers = [np.arange(3, dtype=np.float32), np.arange(4, dtype=np.float32) * 10,
          np.ones(2, np.float32) * 0.5]
total = sum(x.size for x in layers)
server = None
seen = []
if rank == 0:
    model = np.zeros(total, np.float32)
    state = {"version": 0}

    def apply(update):
        values = update.array(np.float32)
        if values.size != model.size:
            raise ValueError("update of %d floats for a model of %d" % (values.size, model.size))
        if values[0] < 0:
            raise ValueError("first element %g is negative" % values[0])
        expect(not values.flags.writeable, "update views are read-only")
        raw = update.data
        expect(raw.dtype == np.uint8 and raw.size == update.bytes and
               raw[:4].tobytes() == values[:1].tobytes(), "Update.data is the raw bytes")
        seen.append((update.worker, update.version, update.count, update.norm, update.bytes,
                     update.sequence))
        model[:] += values
        state["version"] += update.count
        return state["version"]

    server = mlfabric.Server("pyps", apply, lambda: (state["version"], model)).start()
    kept = []  # an Update kept past its callback: metadata stays, the data raises
    probe = mlfabric.Server("probe", lambda u: kept.append(u) or len(kept),
                            lambda: (len(kept), b"")).start()
    expect(server.initial_version == 0, "initial version %d" % server.initial_version)
barrier()
# A hot-standby replica of pyps on rank 1's daemon (§5.3), applying the same
# rule as the server: the scheduler sends it a copy of every update the
# server applies.
replica, replica_model, replica_seen = None, np.zeros(total, np.float32), []
if rank == 1:
    def apply_copy(update):
        values = update.array(np.float32)
        if values.size != replica_model.size or values[0] < 0:
            raise ValueError("refused like the server")
        replica_model[:] += values
        replica_seen.append(update.sequence)
        return len(replica_seen)

    replica = mlfabric.Replica("pyps", apply_copy).start()
barrier()
worker = mlfabric.Worker(name="py%d" % rank)
version, data = get_when_up(worker, "pyps")
expect(len(data) == total * 4, "model bytes %d" % len(data))
# A get may name the priority of its reply's packets; both bindings pass it.
v_low, data_low = worker.get("pyps", priority=7)
expect(data_low == data or v_low > version, "a priority-7 get returns the model")
v_tf, model_tf = mtf.get(worker, "pyps", priority=3)
expect(model_tf.shape[0] == total, "a priority-3 TF get returns %d floats" % model_tf.shape[0])
raises(lambda: worker.get("pyps", priority=-1), ValueError, "priority -1 is negative")
mine = [x * (rank + 1) for x in layers]
norm = float(np.sqrt(sum(np.sum(np.square(x, dtype=np.float64)) for x in mine)))
for turn in range(size):  # one rank at a time: deterministic versions and delays
    if turn == rank:
        v0, _ = worker.get("pyps")
        r = worker.push("pyps", mine, v0, priorities=[2, 0, 1])
        expect(r["outcome"] == "applied" and r["applied_version"] == v0 + 1 and r["delay"] == 0,
               "pybind multi-tensor push applied at v%d: %s" % (v0 + 1, r))
        v1, _ = worker.get("pyps")
        outcome, applied, delay = mtf.push(worker, "pyps", [tf.constant(x) for x in mine], v1)
        expect(int(outcome) == 0 and int(applied) == v1 + 1 and int(delay) == 0,
               "TF multi-tensor push applied: %d %d %d" % (int(outcome), int(applied), int(delay)))
    barrier()
version, data = worker.get("pyps")
expected = np.concatenate(layers) * 2 * sum(r + 1 for r in range(size))
expect(version == 2 * size, "version after %d pushes is %d" % (2 * size, version))
expect(np.array_equal(np.frombuffer(data, np.float32), expected),
       "Python server holds the exact sum: %s vs %s" % (np.frombuffer(data, np.float32), expected))
tf_version, tf_model = mtf.get(worker, "pyps")
expect(int(tf_version) == version and np.array_equal(tf_model.numpy(), expected), "TF get")
if rank == 0:
    seqs = [s[5] for s in seen]
    expect(len(seen) == 2 * size and seqs == sorted(seqs) and len(set(seqs)) == len(seqs),
           "commit sequences increase: %s" % seqs)
    expect(all(s[2] == 1 and s[4] == total * 4 for s in seen), "count 1, %d bytes" % (total * 4))
    for w, v, _, n, _, _ in seen:
        r = int(w[2:])
        want = float(np.sqrt(sum(np.sum(np.square(x * (r + 1), dtype=np.float64)) for x in layers)))
        expect(abs(n - want) < 1e-3 * max(1.0, want), "norm from %s: %g vs %g" % (w, n, want))
    expect(sorted(s[0] for s in seen) == sorted(["py0", "py0", "py1", "py1"]),
           "workers named: %s" % [s[0] for s in seen])
if rank == 0:
    r = worker.push("probe", np.arange(4, dtype=np.int64), 0)
    expect(r["outcome"] == "applied" and len(kept) == 1, "probe push applied: %s" % r)
    if kept:
        expect(kept[0].worker == "py0" and kept[0].bytes == 32 and kept[0].count == 1,
               "kept Update metadata: %r" % kept[0])
        raises(lambda: kept[0].array(np.int64), RuntimeError, "after its callback returned")
    probe.stop()
    probe.close()
barrier()
print("rank %d: part 1 (Python server, multi-tensor pushes) done" % rank, flush=True)

# ---- 2. callback errors fail the push, the server keeps serving
for turn in range(size):
    if turn == rank:
        v, _ = worker.get("pyps")
        raises(lambda: worker.push("pyps", [-1 - x for x in layers], v),
               mlfabric.PushFailedError, "ValueError", "first element -1 is negative")
        r = worker.push("pyps", [np.zeros(total, np.float32)], v, raise_on_failure=False)
        expect(r["outcome"] == "applied", "the server still applies after a callback error: %s" % r)
        raises(lambda: worker.push("pyps", np.zeros(5, np.float32), v), mlfabric.PushFailedError,
               "update of 5 floats for a model of %d" % total)
        raises(lambda: mtf.push(worker, "pyps", [tf.fill([total], -1.0)], v),
               tf.errors.UnavailableError, "ValueError")
    barrier()
if rank == 0:
    bad = mlfabric.Server("badps", lambda u: "v1", lambda: (_ for _ in ()).throw(
        KeyError("no model yet"))).start()
barrier()
if rank == 1:
    time.sleep(0.2)
    raises(lambda: get_when_up(worker, "badps"), RuntimeError, "KeyError", "no model yet")
    raises(lambda: worker.push("badps", np.ones(2, np.float32), 0), mlfabric.PushFailedError,
           "must return the new model version (an int)")
barrier()
if rank == 0:
    bad.stop()
    bad.close()
    empty = mlfabric.Server("emptyps")
    raises(empty.serve, RuntimeError, "register an update callback")
    empty.close()
barrier()
print("rank %d: part 2 (callback errors) done" % rank, flush=True)

# ---- 3. bad input
mlf = mlfabric.AllReducer(backend="mlfabric")
for red in (reducer, mlf):
    name = red.backend
    raises(lambda: red.allreduce(np.ones(rank + 2, np.float32)), ValueError, "differ across ranks")
    raises(lambda: red.allreduce(np.ones(3, np.float64 if rank else np.float32)), ValueError,
           "float64", "float32")
    raises(lambda: red.allreduce(np.ones(2, np.complex64)), TypeError, "complex64", "float16")
    half = red.allreduce(np.full(3, rank + 0.5, np.float16))  # the fp16 AllReduce
    expect(half.dtype == np.float16 and np.array_equal(half, np.full(3, 2.0, np.float16)),
           "%s float16 allreduce: %r" % (name, half))
    out = red.allreduce(np.full(3, rank + 1, np.int64))  # still in step after the errors
    expect(np.array_equal(out, np.full(3, 3, np.int64)), "%s allreduce after errors" % name)
raises(lambda: mtf.allreduce(tf.ones([rank + 1, 2]), reducer=mlf), tf.errors.FailedPreconditionError,
       "differ across ranks")
raises(lambda: mtf.allreduce(tf.ones([2], tf.bfloat16)), TypeError, "bfloat16")
raises(lambda: worker.push("pyps", [np.ones(2, np.float16)], 0), TypeError, "float16")
raises(lambda: worker.push("pyps", [np.ones(2, np.float32)] * 2, 0, priorities=[0]), ValueError,
       "priorities has 1 entries for 2 tensors")
raises(lambda: mtf.push(worker, "pyps", [tf.ones([2])] * 2, 0, priorities=[0, 1, 2]), ValueError,
       "priorities has 3 entries for 2 tensors")
raises(lambda: mtf.push(worker, "pyps", [tf.ones([2], tf.float16)], 0), TypeError, "float16")
raises(lambda: worker.push("pyps", [], 0), ValueError, "no tensors")
raises(lambda: worker.push("pyps", np.ones(2, np.float32), -1), ValueError, "version -1")
raises(lambda: worker.get("no-such-server"), RuntimeError, "no-such-server")
raises(lambda: mtf.get(worker, "no-such-server"), tf.errors.OpError, "no-such-server")
raises(lambda: worker.push("no-such-server", np.ones(2, np.float32), 0), mlfabric.PushFailedError,
       "no-such-server", "not registered")
raises(lambda: mlfabric.Worker(delay_bound=-3), ValueError, "delay_bound -3 is negative")
raises(lambda: mlfabric.Worker(divergence_bound=-2.0), ValueError, "divergence_bound")
raises(lambda: mlfabric.Server("neg", delay_bound=-1), ValueError, "delay_bound -1")
raises(lambda: mlfabric.Worker(delay_bound=5), RuntimeError, "delay_bound 5 differs", "tau_max 30")
# mlfabric-run --divergence_bound 1000 reached the job and every rank.
expect(os.environ.get("MLFABRIC_DIVERGENCE_BOUND") == "1000", "MLFABRIC_DIVERGENCE_BOUND exported")
raises(lambda: mlfabric.Worker(divergence_bound=5.0), RuntimeError, "divergence_bound 5 differs")
mlfabric.Worker(name="same-bounds%d" % rank, delay_bound=30, divergence_bound=1000.0).close()
raises(lambda: mlfabric.Server(""), ValueError, "needs a name")
raises(lambda: mlfabric.Replica(""), ValueError, "server name is empty")
raises(lambda: mlfabric.Worker(token="wrong-token", name="intruder"), RuntimeError, "token")
# A worker of job "other" may not push to job "demo"'s server.
other = mlfabric.Worker(job="other", token="other-token", name="other%d" % rank)
raises(lambda: other.push("pyps", np.ones(total, np.float32), 0), mlfabric.PushFailedError,
       "belongs to job 'demo'", "not to job 'other'")
other.close()
barrier()
print("rank %d: part 3 (bad input) done" % rank, flush=True)

# ---- 4. tensor fusion (2 ranks: every sum is a + b, whatever the order)


def fusion_inputs(r):
    rng = np.random.default_rng(100 + r)
    return [rng.standard_normal((5, 3)).astype(np.float32),
            1.0 + 1e-12 * rng.integers(1, 1000, 7).astype(np.float64),  # lost in float32
            rng.integers(-50, 50, 4).astype(np.int32),
            None,
            rng.standard_normal((2, 2, 2)).astype(np.float32),
            rng.integers(-50, 50, 3).astype(np.float16),
            rng.standard_normal(40).astype(np.float32)]


mine = [None if a is None else tf.constant(a) for a in fusion_inputs(rank)]
theirs = fusion_inputs(1 - rank)
expected = [None if a is None else a + b for a, b in zip(fusion_inputs(rank), theirs)]
for red in (reducer, mlf):
    name = red.backend
    for op in (mtf.Sum, mtf.Average):
        results = {
            "fused": mtf.grouped_allreduce(mine, op=op, reducer=red),
            "64-byte buckets": mtf.grouped_allreduce(mine, op=op, reducer=red,
                                                     fusion_threshold_bytes=64),
            "unfused": mtf.grouped_allreduce(mine, op=op, reducer=red, fusion_threshold_bytes=0),
            "tf.function, 64-byte buckets": tf.function(lambda: mtf.grouped_allreduce(
                mine, op=op, reducer=red, fusion_threshold_bytes=64))(),
        }
        if op == mtf.Sum:
            results["one allreduce per tensor"] = [
                None if t is None else mtf.allreduce(t, op=op, reducer=red) for t in mine]
        reference = results["unfused"]
        for how, got in results.items():
            for i, (g, ref, t) in enumerate(zip(got, reference, mine)):
                if t is None:
                    expect(g is None, "%s %s %s: None entry %d became %r" % (name, op, how, i, g))
                    continue
                g, ref = np.asarray(g), np.asarray(ref)
                expect(g.dtype == t.dtype.as_numpy_dtype and g.shape == tuple(t.shape) and
                       g.tobytes() == ref.tobytes(),
                       "%s %s %s: tensor %d (%s %s) differs from unfused: %r vs %r"
                       % (name, op, how, i, t.dtype.name, t.shape, g, ref))
            if op == mtf.Sum:
                for i, (g, e) in enumerate(zip(got, expected)):
                    if e is not None:
                        expect(np.asarray(g).tobytes() == e.tobytes(),
                               "%s %s: tensor %d is not the exact sum %r: %r"
                               % (name, how, i, e, np.asarray(g)))
# bfloat16 (no AllReduce of its own) travels as float32 and comes back bfloat16.
for red in (reducer, mlf):
    bf, f = mtf.grouped_allreduce([tf.constant([1.5, -2.0], tf.bfloat16), tf.constant([2.0])],
                                  op=mtf.Sum, reducer=red)
    expect(bf.dtype == tf.bfloat16 and np.array_equal(np.asarray(tf.cast(bf, tf.float32)),
                                                      [3.0, -4.0]) and float(f[0]) == 4.0,
           "%s bfloat16 in a fused list: %r, %r" % (red.backend, bf, f))
os.environ["MLFABRIC_FUSION_THRESHOLD"] = "0"
expect(mtf.fusion_threshold() == 0, "MLFABRIC_FUSION_THRESHOLD=0 read")
os.environ["MLFABRIC_FUSION_THRESHOLD"] = "lots"
raises(mtf.fusion_threshold, ValueError, "MLFABRIC_FUSION_THRESHOLD", "lots")
del os.environ["MLFABRIC_FUSION_THRESHOLD"]
raises(lambda: mtf.grouped_allreduce(mine, fusion_threshold_bytes=-1), ValueError, ">= 0")
mlf.close()
barrier()
print("rank %d: part 4 (tensor fusion) done" % rank, flush=True)

# ---- 5. the replica of pyps holds the server's model
version, data = worker.get("pyps")
if rank == 1:
    deadline = time.time() + 30  # copies may be punted to a later batch
    while len(replica_seen) < version and time.time() < deadline and replica.error is None:
        time.sleep(0.05)
    replica.stop()
    replica.close()
    print("rank 1: the replica applied %d of the server's %d updates" % (len(replica_seen), version),
          flush=True)
    expect(len(replica_seen) == version, "replica applied %d updates, the server %d"
           % (len(replica_seen), version))
    expect(np.array_equal(replica_model, np.frombuffer(data, np.float32)),
           "the replica's model equals the server's")
barrier()
print("rank %d: part 5 (replica) done" % rank, flush=True)

# ---- 6. failover: the server leaves, its replica (all three callbacks) takes over
fo_size = 4
fo_server = fo_replica = None
if rank == 0:
    fo_model, fo_state = np.zeros(fo_size, np.float32), {"version": 0}

    def fo_apply(update):
        fo_model[:] += update.array(np.float32)
        fo_state["version"] += update.count
        return fo_state["version"]

    fo_server = mlfabric.Server("pyfo", fo_apply,
                                lambda: (fo_state["version"], fo_model)).start()
standby = {"model": np.zeros(fo_size, np.float32), "version": 0, "applied": 0,
           "requests": 0, "promotions": []}
if rank == 1:
    def standby_apply(update):
        standby["model"] += update.array(np.float32)
        standby["applied"] += update.count
        standby["version"] += update.count
        return standby["version"]

    def standby_request():
        standby["requests"] += 1
        return standby["version"], standby["model"]

    def standby_promote(p):
        standby["promotions"].append(p)
        standby["promoted_in_callback"] = fo_replica.promoted
        # Versions go on from the old server's, never back.
        standby["version"] = max(standby["version"], p.model_version)

    fo_replica = mlfabric.Replica("pyfo", standby_apply, standby_request,
                                  standby_promote).start()
    expect(not fo_replica.promoted, "a replica is not promoted before its server leaves")
barrier()
get_when_up(worker, "pyfo")
# Integer-valued updates: the sums are exact whatever the order.
for turn in range(size):
    if turn == rank:
        v, _ = worker.get("pyfo")
        r = worker.push("pyfo", np.full(fo_size, rank + 1, np.float32), v)
        expect(r["outcome"] == "applied" and r["applied_version"] == v + 1,
               "push to pyfo before the failover applied: %s" % r)
    barrier()
before_version, _ = worker.get("pyfo")
expect(before_version == size, "pyfo at v%d before the failover" % before_version)
if rank == 1:
    deadline = time.time() + 30  # copies may be punted to a later batch
    while standby["applied"] < size and time.time() < deadline and fo_replica.error is None:
        time.sleep(0.05)
    expect(standby["applied"] == size, "the replica applied %d of %d updates before the failover"
           % (standby["applied"], size))
barrier()
if rank == 0:
    fo_server.stop()  # the application leaves; its daemon tells the scheduler
    fo_server.close()
    print("rank 0: the server pyfo left", flush=True)
if rank == 1:
    deadline = time.time() + 30
    while not standby["promotions"] and time.time() < deadline and fo_replica.error is None:
        time.sleep(0.05)
    expect(fo_replica.error is None, "the replica serves on: %r" % fo_replica.error)
    expect(len(standby["promotions"]) == 1, "the promotion callback ran once: %s"
           % standby["promotions"])
    expect(fo_replica.promoted, "the replica is promoted")
    expect(standby.get("promoted_in_callback") is True, "promoted is True inside the callback")
    if standby["promotions"]:
        p = standby["promotions"][0]
        print("rank 1: %r" % p, flush=True)
        expect(isinstance(p, mlfabric.Promotion), "the callback gets a Promotion: %r" % p)
        expect(p.server == "pyfo" and p.old_host == "h0",
               "promotion of pyfo from h0: %s from %s" % (p.server, p.old_host))
        expect(p.reason != "", "the promotion says why")
        expect(p.model_version == before_version,
               "promotion at the old server's v%d: v%d" % (before_version, p.model_version))
barrier()
# The workers change nothing: their gets and pushes now reach the replica.
after_version, after_data = worker.get("pyfo")
expect(after_version == before_version, "get after the failover at v%d (was v%d)"
       % (after_version, before_version))
expect(np.array_equal(np.frombuffer(after_data, np.float32),
                      np.full(fo_size, sum(r + 1 for r in range(size)), np.float32)),
       "get after the failover returns the replica's model: %s"
       % np.frombuffer(after_data, np.float32))
for turn in range(size):
    if turn == rank:
        v, _ = worker.get("pyfo")
        r = worker.push("pyfo", np.full(fo_size, 10 * (rank + 1), np.float32), v)
        expect(r["outcome"] == "applied" and r["applied_version"] == v + 1,
               "push to pyfo after the failover applied at v%d: %s" % (v + 1, r))
    barrier()
final_version, final_data = worker.get("pyfo")
want = np.full(fo_size, sum(11 * (r + 1) for r in range(size)), np.float32)
expect(final_version == 2 * size, "pyfo at v%d after the failover's pushes" % final_version)
expect(np.array_equal(np.frombuffer(final_data, np.float32), want),
       "the promoted replica applied the pushes: %s" % np.frombuffer(final_data, np.float32))
if rank == 1:
    expect(np.array_equal(standby["model"], want) and standby["applied"] == 2 * size,
           "the replica's own model: %s, %d applied" % (standby["model"], standby["applied"]))
    # Concurrent gets may share one snapshot (§10.3): at least one request.
    expect(standby["requests"] > 0, "gets answered by the request callback: %d"
           % standby["requests"])
barrier()
print("rank %d: part 6 (failover) done" % rank, flush=True)
barrier()

# ---- 7. a new standby of pyfo on h0 starts from a snapshot of the promoted
# replica's model (install callback), then follows the updates after it
fresh = {"model": np.full(fo_size, -1, np.float32), "version": -1, "installs": [],
         "applied": 0}
fresh_replica = None
if rank == 1 and replica is not None:  # pyps's replica, made without install=
    raises(lambda: replica.register_install_callback(lambda v, data: None),
           RuntimeError, "not created with snapshot=True")
if rank == 0:
    def fresh_install(v, data):
        expect(isinstance(data, bytes), "install gets bytes: %r" % type(data))
        fresh["installs"].append((v, np.frombuffer(data, np.float32).copy()))
        fresh["model"][:] = np.frombuffer(data, np.float32)
        fresh["version"] = v

    def fresh_apply(update):
        fresh["model"] += update.array(np.float32)
        fresh["applied"] += update.count
        fresh["version"] += update.count
        return fresh["version"]

    fresh_replica = mlfabric.Replica("pyfo", fresh_apply, install=fresh_install).start()
    deadline = time.time() + 30
    while not fresh["installs"] and time.time() < deadline and fresh_replica.error is None:
        time.sleep(0.05)
    expect(fresh_replica.error is None, "the new standby serves: %r" % fresh_replica.error)
    expect(len(fresh["installs"]) == 1, "one snapshot installed: %d" % len(fresh["installs"]))
    if fresh["installs"]:
        v, model = fresh["installs"][0]
        expect(v == final_version and np.array_equal(model, want),
               "the snapshot is the promoted replica's model at v%d: v%d %s"
               % (final_version, v, model))
barrier()
for turn in range(size):
    if turn == rank:
        v, _ = worker.get("pyfo")
        r = worker.push("pyfo", np.full(fo_size, 100 * (rank + 1), np.float32), v)
        expect(r["outcome"] == "applied", "push to pyfo after the snapshot applied: %s" % r)
    barrier()
want7 = want + np.full(fo_size, sum(100 * (r + 1) for r in range(size)), np.float32)
last_version, last_data = worker.get("pyfo")
expect(np.array_equal(np.frombuffer(last_data, np.float32), want7),
       "pyfo after the snapshot's pushes: %s" % np.frombuffer(last_data, np.float32))
if rank == 0:
    deadline = time.time() + 30  # copies may be punted to a later batch
    while fresh["applied"] < size and time.time() < deadline and fresh_replica.error is None:
        time.sleep(0.05)
    expect(fresh["applied"] == size and np.array_equal(fresh["model"], want7)
           and fresh["version"] == last_version,
           "the new standby equals the server: %s v%d (%d applied), want %s v%d"
           % (fresh["model"], fresh["version"], fresh["applied"], want7, last_version))
    fresh_replica.stop()
    fresh_replica.close()
barrier()
if fo_replica is not None:
    fo_replica.stop()
    fo_replica.close()
    expect(fo_replica.promoted, "promoted is kept after close()")
print("rank %d: part 7 (replica from a snapshot) done" % rank, flush=True)
barrier()
if server is not None:
    server.stop()
    server.close()
worker.close()
mlfabric.shutdown()
if failures:
    print("python_api_check rank %d: %d FAILED: %s" % (rank, len(failures), failures), flush=True)
    sys.exit(1)
print("python_api_check rank %d: OK" % rank, flush=True)
