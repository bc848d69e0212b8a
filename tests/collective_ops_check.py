"""Run in every rank by tests/collective_ops_test.sh under mlfabric-run (2 ranks,
a host each): Horovod's dtypes and reduce ops through MLfabric's collectives.

For the mpi and the mlfabric AllReduce backends (the latter under mpirun: sums
through the scheduler's rounds, min/max/product through MPI):
  1. numpy (mlfabric.AllReducer.allreduce(array, op)): int8, uint8, int16 and
     uint16 under sum, min, max and product, exactly the values computed here
     from both ranks' inputs (integers wrap modulo 2^width, as Open MPI's);
  2. TensorFlow, eagerly and in a tf.function: hvd.allreduce with op=Min, Max,
     Product (and Sum, Average) on those dtypes and float32; pre- and
     postscale of int32 in float64 and float16 in float32, as Horovod's;
     grouped_allreduce
     with op=Max over mixed dtypes; broadcast and allgather of bool;
  3. alltoall (even, uneven and zero splits, an empty tensor, bool) and
     reducescatter / grouped_reducescatter (Sum, Average, Min, an uneven
     first dimension, prescale/postscale), eagerly and in a tf.function,
     exactly the values computed here, and their gradients as Horovod's
     tests expect them;
  4. mismatches fail every rank, never hang: a reduce op or a shape that
     differs across ranks raises tf.errors.FailedPreconditionError (numpy:
     ValueError) naming the ranks and values, so do tensors of equal length
     in different shapes ([17, 1311] against [17, 23, 57]), and so does a broadcast
     root_rank that differs across ranks (eagerly and in a tf.function, for
     float32 and bool, and broadcast_object); hvd.Adasum and bool allreduce
     are refused with a clear error.
Prints "collective_ops_check rank R: OK" on success.
"""
import faulthandler
import os
import sys

faulthandler.dump_traceback_later(240, exit=True)  # never hang the test
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import mlfabric
import numpy as np
import tensorflow as tf

import mlfabric.tensorflow as hvd

failures = []
mlfabric.init(backend="mpi")
rank, size = mlfabric.rank(), mlfabric.size()
assert size == 2, "run with mlfabric-run -np 2"

INT_TYPES = (np.int8, np.uint8, np.int16, np.uint16)
OPS = {mlfabric.Sum: lambda a, b: a + b, mlfabric.Min: np.minimum,
       mlfabric.Max: np.maximum, mlfabric.Product: lambda a, b: a * b}


def expect(cond, what):
    if not cond:
        failures.append(what)
        print("rank %d: FAILED %s" % (rank, what), file=sys.stderr, flush=True)


def raises(fn, exc, *texts):
    try:
        fn()
    except exc as e:
        for text in texts:
            expect(text in str(e), "%s names %r: %s" % (exc.__name__, text, e))
        return
    except Exception as e:  # noqa: BLE001 - any other exception is a failure too
        expect(False, "expected %s, got %s: %s" % (exc.__name__, type(e).__name__, e))
        return
    expect(False, "expected %s, nothing raised" % exc.__name__)


def data(r, dtype, n=300):
    """Rank r's input: values in [-450, 450] cast to `dtype` (8-bit ones
    wrap on the way, and every product overflows)."""
    values = (np.arange(n, dtype=np.int64) * (r + 3)) % 901 - 450
    return values.astype(dtype)


def expected(dtype, op):
    with np.errstate(over="ignore"):
        return OPS[op](data(0, dtype), data(1, dtype)).astype(dtype)


for backend in ("mpi", "mlfabric"):
    red = mlfabric.AllReducer(backend=backend)
    # ---- 1. numpy
    for dtype in INT_TYPES:
        for op in OPS:
            out = red.allreduce(data(rank, dtype), op)
            expect(out.dtype == dtype and np.array_equal(out, expected(dtype, op)),
                   "%s numpy %s %s" % (backend, np.dtype(dtype).name, op))

    # ---- 2. TensorFlow, eager and in a tf.function
    @tf.function
    def reduce_in_graph(t, op):
        return hvd.allreduce(t, op=op, reducer=red)

    for dtype in INT_TYPES:
        mine = tf.constant(data(rank, dtype))
        for op, name in ((hvd.Min, "min"), (hvd.Max, "max"), (hvd.Product, "product"),
                         (hvd.Sum, "sum")):
            want = expected(dtype, name)
            eager = hvd.allreduce(mine, op=op, reducer=red)
            expect(eager.dtype == mine.dtype and np.array_equal(eager.numpy(), want),
                   "%s tf eager %s %s" % (backend, np.dtype(dtype).name, name))
            graph = reduce_in_graph(mine, op)
            expect(np.array_equal(graph.numpy(), want),
                   "%s tf.function %s %s" % (backend, np.dtype(dtype).name, name))
    x = tf.constant([1.5, -2.0, 3.0], tf.float32) * float(rank + 1)
    got = {op: hvd.allreduce(x, op=op, reducer=red).numpy()
           for op in (hvd.Min, hvd.Max, hvd.Product, hvd.Average)}
    expect(np.array_equal(got[hvd.Min], [1.5, -4.0, 3.0]), "%s float32 min %s" % (backend, got))
    expect(np.array_equal(got[hvd.Max], [3.0, -2.0, 6.0]), "%s float32 max %s" % (backend, got))
    expect(np.array_equal(got[hvd.Product], [4.5, 8.0, 18.0]), "%s product %s" % (backend, got))
    expect(np.array_equal(got[hvd.Average], [2.25, -3.0, 4.5]), "%s average %s" % (backend, got))
    # prescale/postscale around Max: max(2 * x_r) * 0.5.
    scaled = hvd.allreduce(x, op=hvd.Max, prescale_factor=2.0, postscale_factor=0.5, reducer=red)
    expect(np.array_equal(scaled.numpy(), [3.0, -2.0, 6.0]), "%s scaled max" % backend)
    # Horovod scales integers in float64 and float16 in float32, truncating
    # back: int32 prescale 0.19 of [10, -7, 3] is [1, -1, 0] on each rank.
    ints = tf.constant([10, -7, 3], tf.int32)
    pre = hvd.allreduce(ints, op=hvd.Sum, prescale_factor=0.19, reducer=red)
    expect(np.array_equal(pre.numpy(), [2, -2, 0]), "%s int32 prescale %s" % (backend, pre))
    post = hvd.allreduce(ints, op=hvd.Sum, postscale_factor=0.19, reducer=red)
    expect(np.array_equal(post.numpy(), [3, -2, 1]), "%s int32 postscale %s" % (backend, post))
    halves = tf.constant([1.5, 2.5], tf.float16)
    half_pre = hvd.allreduce(halves, op=hvd.Sum, prescale_factor=0.3, reducer=red)
    want = (np.float32([1.5, 2.5]) * np.float32(0.3)).astype(np.float16) * np.float16(2)
    expect(np.array_equal(half_pre.numpy(), want), "%s float16 prescale %s" % (backend, half_pre))
    grouped = hvd.grouped_allreduce(
        [tf.constant(data(rank, np.int8)), x, tf.constant(data(rank, np.uint16))], op=hvd.Max,
        reducer=red)
    expect(np.array_equal(grouped[0].numpy(), expected(np.int8, "max")) and
           np.array_equal(grouped[1].numpy(), [3.0, -2.0, 6.0]) and
           np.array_equal(grouped[2].numpy(), expected(np.uint16, "max")),
           "%s grouped_allreduce op=Max" % backend)
    flags = tf.constant([True, False, rank == 0])
    expect(np.array_equal(hvd.broadcast(flags, 1, reducer=red).numpy(), [True, False, False]),
           "%s broadcast bool" % backend)
    gathered = hvd.allgather(tf.constant([rank == 1] * (rank + 1)), reducer=red)
    expect(gathered.dtype == tf.bool and
           np.array_equal(gathered.numpy(), [False, True, True]), "%s allgather bool" % backend)
    expect(np.array_equal(red.broadcast(np.array([rank == 0, True]), 0), [True, True]),
           "%s numpy broadcast bool" % backend)

    # ---- 3. alltoall and reducescatter
    def rows_of(r, n, cols=2):
        return (100 * r + np.arange(n * cols)).reshape(n, cols).astype(np.int32)

    def a2a_want(inputs, splits):
        """What this rank receives: from each rank s, in rank order, the rows
        s sends it (its splits[s][rank] rows after those for lower ranks)."""
        parts = []
        for s_rank, (x, sp) in enumerate(zip(inputs, splits)):
            begin = sum(sp[:rank])
            parts.append(x[begin:begin + sp[rank]])
        return np.concatenate(parts), [sp[rank] for sp in splits]

    @tf.function
    def a2a_in_graph(t, splits):
        return hvd.alltoall(t, splits=splits, reducer=red)

    cases = {"even": ([4, 4], [[2, 2], [2, 2]]), "uneven": ([4, 2], [[1, 3], [2, 0]]),
             "zero": ([0, 3], [[0, 0], [0, 3]])}
    for case, (lengths, splits) in cases.items():
        inputs = [rows_of(r, lengths[r]) for r in range(size)]
        want, want_splits = a2a_want(inputs, splits)
        for mode, fn in (("eager", lambda t, sp: hvd.alltoall(t, splits=sp, reducer=red)),
                         ("tf.function", a2a_in_graph)):
            out, received = fn(tf.constant(inputs[rank]), tf.constant(splits[rank]))
            expect(out.dtype == tf.int32 and out.shape == want.shape and
                   np.array_equal(out.numpy(), want) and
                   np.array_equal(received.numpy(), want_splits),
                   "%s alltoall %s %s: %s %s" % (backend, case, mode, out.numpy().tolist(),
                                                 received.numpy().tolist()))
    even = hvd.alltoall(tf.constant(rows_of(rank, 4)), reducer=red)  # no splits: tensor only
    expect(isinstance(even, tf.Tensor) and
           np.array_equal(even.numpy(), a2a_want([rows_of(0, 4), rows_of(1, 4)],
                                                 [[2, 2], [2, 2]])[0]),
           "%s alltoall without splits" % backend)
    flags = hvd.alltoall(tf.constant([rank == 0, True, False]), splits=[1, 2], reducer=red)[0]
    expect(np.array_equal(flags.numpy(), [True, False] if rank == 0
                          else [True, False, True, False]), "%s alltoall bool %s" % (backend, flags))
    # Gradient: d(sum(out**2)/2)/dx = alltoall(out, received splits) = x.
    x = tf.constant(rows_of(rank, 4 if rank == 0 else 2).astype(np.float32))
    with tf.GradientTape() as tape:
        tape.watch(x)
        out, _ = hvd.alltoall(x, splits=[[1, 3], [2, 0]][rank], reducer=red)
        loss = tf.reduce_sum(out * out) / 2
    grad = tape.gradient(loss, x)
    expect(grad is not None and np.array_equal(grad.numpy(), x.numpy()),
           "%s alltoall gradient %s" % (backend, None if grad is None else grad.numpy()))

    def rs_input(r, dtype=np.int32):
        return ((r + 1) * np.arange(10).reshape(5, 2) + r).astype(dtype)

    mine_rows = slice(0, 3) if rank == 0 else slice(3, 5)  # 5 rows: 3 + 2

    @tf.function
    def rs_in_graph(t, op):
        return hvd.reducescatter(t, op=op, reducer=red)

    for op, fold in ((hvd.Sum, lambda a, b: a + b), (hvd.Min, np.minimum),
                     (hvd.Max, np.maximum)):
        want = fold(rs_input(0), rs_input(1))[mine_rows]
        for mode, fn in (("eager", lambda t, o: hvd.reducescatter(t, op=o, reducer=red)),
                         ("tf.function", rs_in_graph)):
            out = fn(tf.constant(rs_input(rank)), op)
            expect(out.dtype == tf.int32 and np.array_equal(out.numpy(), want),
                   "%s reducescatter %s %s: %s" % (backend, op, mode, out.numpy().tolist()))
    avg_want = ((rs_input(0, np.float32) + rs_input(1, np.float32)) / 2)[mine_rows]
    avg = hvd.reducescatter(tf.constant(rs_input(rank, np.float32)), reducer=red)  # Average
    expect(np.array_equal(avg.numpy(), avg_want), "%s reducescatter average %s" % (backend, avg))
    scaled = hvd.reducescatter(tf.constant(rs_input(rank, np.float32)), op=hvd.Sum,
                               prescale_factor=2.0, postscale_factor=0.25, reducer=red)
    expect(np.array_equal(scaled.numpy(), avg_want), "%s reducescatter scaled" % backend)
    grouped = hvd.grouped_reducescatter(
        [tf.constant(rs_input(rank)), tf.constant(rs_input(rank, np.float32)[:, :1])],
        op=hvd.Sum, reducer=red)
    expect(np.array_equal(grouped[0].numpy(), (rs_input(0) + rs_input(1))[mine_rows]) and
           np.array_equal(grouped[1].numpy(),
                          (rs_input(0, np.float32) + rs_input(1, np.float32))[mine_rows, :1]),
           "%s grouped_reducescatter" % backend)
    # Gradients as Horovod's tests expect: ones * size for Sum, ones for Average.
    for op, factor in ((hvd.Sum, size), (hvd.Average, 1)):
        x = tf.constant(rs_input(rank, np.float32))
        with tf.GradientTape() as tape:
            tape.watch(x)
            out = hvd.reducescatter(x, op=op, reducer=red)
        grad = tape.gradient(out, x)
        expect(grad is not None and np.array_equal(grad.numpy(), np.full((5, 2), factor)),
               "%s reducescatter %s gradient %s" % (backend, op,
                                                    None if grad is None else grad.numpy()))
    raises(lambda: hvd.reducescatter(tf.ones([4, 2], tf.float32 if rank == 0 else tf.float64),
                                     op=hvd.Sum, reducer=red),
           tf.errors.FailedPreconditionError, "Mismatched ReduceScatter dtype",
           "rank 0 passed float32 while rank 1 passed float64")
    raises(lambda: hvd.reducescatter(tf.ones([4, 2]), op=hvd.Min if rank == 0 else hvd.Max,
                                     reducer=red),
           tf.errors.FailedPreconditionError, "Mismatched ReduceScatter reduce op")
    raises(lambda: hvd.reducescatter(tf.ones([3 + rank, 2]), op=hvd.Sum, reducer=red),
           tf.errors.FailedPreconditionError, "Mismatched ReduceScatter length")
    raises(lambda: hvd.alltoall(tf.ones([2, 3 + rank]), splits=[1, 1], reducer=red),
           tf.errors.FailedPreconditionError, "Mismatched Alltoall row length",
           "rank 0 passed 3 elements per row while rank 1 passed 4 elements per row")
    raises(lambda: hvd.alltoall(tf.ones([2, 2], tf.int32 if rank == 0 else tf.int64),
                                splits=[1, 1], reducer=red),
           tf.errors.FailedPreconditionError, "Mismatched Alltoall dtype")
    raises(lambda: hvd.alltoall(tf.ones([3]), splits=[1, 1, 1], reducer=red), ValueError,
           "3 splits for 2 ranks")
    raises(lambda: hvd.alltoall(tf.ones([3]), reducer=red), tf.errors.InvalidArgumentError,
           "must divide")

    # ---- 4. mismatches and refusals
    raises(lambda: hvd.allreduce(tf.ones([4], tf.int8), op=hvd.Min if rank == 0 else hvd.Max,
                                 reducer=red),
           tf.errors.FailedPreconditionError, "Mismatched AllReduce reduce op",
           "rank 0 passed min while rank 1 passed max")
    raises(lambda: hvd.allreduce(tf.ones([rank + 2], tf.uint16), op=hvd.Sum, reducer=red),
           tf.errors.FailedPreconditionError, "Mismatched AllReduce length",
           "rank 0 passed 2 elements while rank 1 passed 3 elements")
    # Equal element counts in different shapes fail every rank, as Horovod's
    # "Mismatched allreduce tensor shapes", eagerly and in a tf.function;
    # then the ranks are still in step.
    for how, reduce in (("eager", hvd.allreduce),
                        ("tf.function", tf.function(hvd.allreduce, autograph=False))):
        raises(lambda: reduce(tf.ones([17, 23 * 57] if rank == 0 else [17, 23, 57]), op=hvd.Sum,
                              reducer=red),
               tf.errors.FailedPreconditionError, "Mismatched AllReduce tensor shapes",
               "rank 0 passed shape [17, 1311] while rank 1 passed shape [17, 23, 57]")
        raises(lambda: reduce(tf.ones([] if rank == 0 else [1], tf.int32), op=hvd.Max,
                              reducer=red),
               tf.errors.FailedPreconditionError,
               "rank 0 passed shape [] while rank 1 passed shape [1]")
        out = reduce(tf.ones([2, 3]), op=hvd.Sum, reducer=red)
        expect(np.array_equal(np.asarray(out), np.full([2, 3], 2.0)),
               "%s %s allreduce after the shape errors" % (backend, how))
    raises(lambda: red.allreduce(np.ones(3, np.int16), "max" if rank else "min"), ValueError,
           "reduce op")
    # A broadcast root that differs across ranks fails every rank naming
    # the ranks and their roots (it would otherwise sum both tensors), eagerly
    # and in a tf.function; so does a root that is a rank on one rank only;
    # a root that is no rank anywhere fails every rank (eagerly ValueError, in
    # a graph InvalidArgumentError).
    for how, bcast in (("eager", hvd.broadcast),
                       ("tf.function", tf.function(hvd.broadcast, autograph=False))):
        for dtype in (tf.float32, tf.bool):
            raises(lambda: bcast(tf.ones([3], dtype), root_rank=rank, reducer=red),
                   tf.errors.FailedPreconditionError, "Mismatched Broadcast root rank",
                   "rank 0 passed root 0 while rank 1 passed root 1")
        raises(lambda: bcast(tf.ones([2]), root_rank=0 if rank == 0 else 7, reducer=red),
               tf.errors.FailedPreconditionError, "rank 0 passed root 0 while rank 1 passed "
               "root 7")
        if how == "eager":
            raises(lambda: bcast(tf.ones([2]), root_rank=5, reducer=red), ValueError,
                   "root_rank 5 is not a rank (size 2)")
        else:
            raises(lambda: bcast(tf.ones([2]), root_rank=5, reducer=red),
                   tf.errors.InvalidArgumentError, "broadcast root 5 is not a rank")
        out = bcast(tf.fill([2], float(rank + 1)), root_rank=1, reducer=red)
        expect(np.array_equal(np.asarray(out), [2.0, 2.0]),
               "%s %s broadcast after the root errors" % (backend, how))
    raises(lambda: hvd.broadcast_object(("o", rank), root_rank=rank),
           tf.errors.FailedPreconditionError, "Mismatched Broadcast root rank")
    raises(lambda: hvd.allreduce(tf.ones([2]), op=hvd.Adasum, reducer=red), ValueError,
           "Adasum is not supported")
    raises(lambda: hvd.allreduce(tf.ones([2], tf.bool), reducer=red), TypeError, "bool")
    raises(lambda: red.allreduce(np.ones(2, bool)), TypeError, "broadcast also bool")
    raises(lambda: red.allreduce(np.ones(2, np.int8), "median"), ValueError, "unknown reduce op")
    # Still in step after the errors.
    out = red.allreduce(np.full(3, rank + 1, np.int8), mlfabric.Product)
    expect(np.array_equal(out, np.full(3, 2, np.int8)), "%s product after errors" % backend)
    red.close()

failed = len(failures)
total = mlfabric.allreduce(np.array([failed], np.int64))
if total[0] == 0:
    print("collective_ops_check rank %d: OK" % rank, flush=True)
mlfabric.shutdown()
sys.exit(0 if total[0] == 0 else 1)
