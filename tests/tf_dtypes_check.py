"""Run in every rank by tests/tf_dtypes_test.sh under mlfabric-run, at any
number of ranks (the test runs 4 ranks with a host each, 2 hosts of 2
ranks, and one host of 4): every collective of mlfabric.tensorflow, for every dtype it takes
and every reduce op, eagerly and in a tf.function, through the mlfabric
backend, compared exactly with
  - the values computed here from every rank's input (integer-valued, so
    that every order of reduction gives the same bits), and
  - the same call through the mpi backend (Open MPI's result).
Then each differentiable collective's registered gradient (Horovod's
definition) against numerical gradients of the ranks' summed losses.
With MLFABRIC_ALLREDUCE_MPI_BELOW=0 (the test sets it) every call between
hosts takes the mlfabric backend's own path: sums through the scheduler's
rounds, min/max/product, allgather, broadcast and alltoall as blocks pushed
to the ranks' exchange servers.
Prints "tf_dtypes_check rank R: OK" on success.
"""
import faulthandler
import os
import sys

faulthandler.dump_traceback_later(500, exit=True)  # never hang the test
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf

import mlfabric
import mlfabric.tensorflow as hvd

failures = []
mlfabric.init(backend="mpi")
rank, size = mlfabric.rank(), mlfabric.size()

# Every dtype of Horovod's reductions; bool only moves (allgather,
# broadcast, alltoall).
REDUCED = (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.int64, np.float16, np.float32,
           np.float64)
MOVED = REDUCED + (np.bool_,)
OPS = {"sum": (hvd.Sum, lambda a, b: a + b), "min": (hvd.Min, np.minimum),
       "max": (hvd.Max, np.maximum), "product": (hvd.Product, lambda a, b: a * b)}


def expect(cond, what):
    if not cond:
        failures.append(what)
        print("rank %d: FAILED %s" % (rank, what), file=sys.stderr, flush=True)


def data(r, dtype, rows, cols=3, op=None):
    """Rank r's input, `rows` x `cols`: small integers, distinct per rank and
    place, in [-3, 3] for a product (4 ranks' product of float16 stays exact),
    in [-40, 40] otherwise; bool: a pattern per rank."""
    i = np.arange(rows * cols, dtype=np.int64).reshape(rows, cols)
    if dtype == np.bool_:
        return ((i + r) % 3 == 0)
    spread = 7 if op == "product" else 81
    values = (i * (r + 2) + 5 * r) % spread - spread // 2
    return values.astype(dtype)


def reduced(dtype, op, rows):
    """Every rank's input reduced in rank order (integers wrap, as C and
    Open MPI do)."""
    combine = OPS[op][1]
    with np.errstate(over="ignore"):
        out = data(0, dtype, rows, op=op)
        for r in range(1, size):
            out = combine(out, data(r, dtype, rows, op=op)).astype(dtype)
    return out


def same(got, want):
    got = np.asarray(got)
    return got.dtype == np.asarray(want).dtype and got.shape == np.shape(want) and \
        np.array_equal(got, want)


fabric = mlfabric.AllReducer(backend="mlfabric")
mpi = mlfabric.AllReducer(backend="mpi")
checked = 0


def both(name, call, want):
    """`call(reducer, mode)` eagerly and in a tf.function, on the mlfabric
    and the mpi backends: each result equals `want` and the two backends'."""
    global checked
    for mode in ("eager", "function"):
        results = {}
        for backend, red in (("mlfabric", fabric), ("mpi", mpi)):
            if mode == "eager":
                got = call(red)
            else:
                got = tf.function(lambda: call(red))()
            got = [np.asarray(g) for g in got] if isinstance(got, (list, tuple)) else \
                np.asarray(got)
            results[backend] = got
            ok = all(same(g, w) for g, w in zip(got, want)) if isinstance(want, list) else \
                same(got, want)
            expect(ok, "%s %s %s: got %r, want %r" % (backend, mode, name, got, want))
            checked += 1


# ---- allreduce and reducescatter: every dtype under every op.
rows = 2 * size + 1  # reducescatter: uneven, rank 0 gets one extra row
split = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
begin = sum(split[:rank])
for dtype in REDUCED:
    for op, (hvd_op, _) in OPS.items():
        mine = tf.constant(data(rank, dtype, rows, op=op))
        want = reduced(dtype, op, rows)
        both("allreduce %s %s" % (np.dtype(dtype).name, op),
             lambda red: hvd.allreduce(mine, op=hvd_op, reducer=red), want)
        both("reducescatter %s %s" % (np.dtype(dtype).name, op),
             lambda red: hvd.reducescatter(mine, op=hvd_op, reducer=red),
             want[begin:begin + split[rank]])

# ---- allgather, broadcast and alltoall: every dtype and bool.
root = size - 1
for dtype in MOVED:
    name = np.dtype(dtype).name
    mine = tf.constant(data(rank, dtype, rank + 1))  # uneven: rank r has r + 1 rows
    both("allgather %s" % name, lambda red: hvd.allgather(mine, reducer=red),
         np.concatenate([data(r, dtype, r + 1) for r in range(size)]))
    block = tf.constant(data(rank, dtype, 5))
    both("broadcast %s from rank %d" % (name, root),
         lambda red: hvd.broadcast(block, root, reducer=red), data(root, dtype, 5))
    # Rank s sends (s + d) % 3 rows to rank d (zero rows too).
    sends = [(rank + d) % 3 for d in range(size)]
    table = tf.constant(data(rank, dtype, sum(sends)))
    received = []
    for s in range(size):
        theirs = data(s, dtype, sum((s + d) % 3 for d in range(size)))
        start = sum((s + d) % 3 for d in range(rank))
        received.append(theirs[start:start + (s + rank) % 3])
    both("alltoall %s" % name,
         lambda red: hvd.alltoall(table, splits=sends, reducer=red),
         [np.concatenate(received), np.array([(s + rank) % 3 for s in range(size)],
                                             dtype=np.int32)])

# ---- a larger call of each between hosts (above the default 64 KiB MPI
# threshold, so the same path runs under the default settings).
big = np.arange(50000, dtype=np.float32) % 997 - 498 + rank
both("allreduce float32 max x 50000", lambda red: hvd.allreduce(tf.constant(big), op=hvd.Max,
                                                                 reducer=red),
     np.arange(50000, dtype=np.float32) % 997 - 498 + (size - 1))
both("allreduce float32 min x 50000", lambda red: hvd.allreduce(tf.constant(big), op=hvd.Min,
                                                                 reducer=red),
     np.arange(50000, dtype=np.float32) % 997 - 498)

# ---- gradients against numerical gradients, for each differentiable
# collective. Every rank's loss is L_r = sum(w_r * y_r), y_r the collective's
# output on rank r, w_r this rank's integer weights; the registered gradient
# (Horovod's definition) must equal the derivative of G = scale * sum_r L_r
# with respect to this rank's input, found by changing one element of one
# rank's input at a time (every rank recomputes, G summed by MPI). The
# collectives are linear, so a step of 1 gives the derivative exactly. Scale
# is Horovod's convention: 1 for allreduce and alltoall (the sum of the
# ranks' losses), 1/size for allgather and broadcast (their mean), size for
# reducescatter (Horovod scales its gradient so).
def numerical_gradient(name, collective, shape_of, scale):
    global checked
    rng = np.random.default_rng(100 + rank)
    x0 = (np.arange(np.prod(shape_of(rank)), dtype=np.float64).reshape(shape_of(rank)) % 5 - 2
          + rank)
    y0 = collective(tf.constant(x0)).numpy()
    w = rng.integers(-3, 4, size=y0.shape).astype(np.float64)
    x = tf.constant(x0)
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(w * collective(x))
    analytic = tape.gradient(loss, x).numpy()

    def total(xr):
        local = float(np.sum(w * collective(tf.constant(xr)).numpy()))
        return scale * float(mpi.allreduce(np.array([local]), "sum")[0])

    base = total(x0)
    numeric = np.zeros_like(x0)
    for s in range(size):
        for i in range(int(np.prod(shape_of(s)))):
            xr = x0.copy()
            if s == rank:
                xr.reshape(-1)[i] += 1.0
            change = total(xr) - base
            if s == rank:
                numeric.reshape(-1)[i] = change
    expect(np.allclose(analytic, numeric, rtol=0, atol=1e-9),
           "gradient of %s: registered %r, numerical %r" % (name, analytic.tolist(),
                                                           numeric.tolist()))
    checked += 1


numerical_gradient("allreduce sum",
                   lambda t: hvd.allreduce(t, op=hvd.Sum, reducer=fabric), lambda r: [2, 3], 1.0)
numerical_gradient("allreduce average, prescale 2, postscale 0.5",
                   lambda t: hvd.allreduce(t, op=hvd.Average, prescale_factor=2.0,
                                           postscale_factor=0.5, reducer=fabric),
                   lambda r: [2, 3], 1.0)
numerical_gradient("allgather", lambda t: hvd.allgather(t, reducer=fabric),
                   lambda r: [r + 1, 2], 1.0 / size)
numerical_gradient("broadcast from the last rank",
                   lambda t: hvd.broadcast(t, size - 1, reducer=fabric), lambda r: [3], 1.0 / size)
numerical_gradient("alltoall", lambda t: hvd.alltoall(
    t, splits=[(rank + d) % 3 for d in range(size)], reducer=fabric)[0],
    lambda r: [sum((r + d) % 3 for d in range(size)), 2], 1.0)
for op, op_name in ((hvd.Sum, "sum"), (hvd.Average, "average")):
    numerical_gradient("reducescatter %s" % op_name,
                       lambda t: hvd.reducescatter(t, op=op, reducer=fabric),
                       lambda r: [2 * size + 1, 2], float(size))

print("rank %d: %d results compared, %d failures" % (rank, checked, len(failures)), flush=True)
if failures:
    sys.exit(1)
print("tf_dtypes_check rank %d: OK" % rank, flush=True)
