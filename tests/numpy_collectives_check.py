"""Run in every rank by tests/numpy_collectives_test.sh under mlfabric-run (2 or
3 ranks, a host each, the mpi or the mlfabric backend): the numpy API's
mlfabric.alltoall and mlfabric.reducescatter, exactly.

  1. alltoall with uneven splits (every rank sends a different number of
     rows to each rank, zero to one of them), without splits (equal
     parts), an empty array, and the dtypes int64, float16, float32 and
     bool: every received row is the one its sender computed for this
     rank (values encode sender, receiver and row), and received_splits
     are the senders' counts;
  2. reducescatter of an uneven first dimension (7 rows; 2 rows over 3
     ranks, a rank receiving none) by Sum, Min, Max, Product on int32 and
     by Average on float64: this rank's rows of the reduction computed
     here from every rank's input, rows split as Horovod's;
  3. bad arguments: splits of the wrong length, a negative split, splits
     not adding up to the rows, float splits, a scalar, an unknown op:
     ValueError naming the bad argument on the rank that passed it, and
     ValueError naming that rank on the others, never a hang; a row length
     that differs across ranks fails every rank naming it, and so does an
     allreduce of arrays whose shapes differ at equal length; the ranks
     stay in step afterwards.
Prints "numpy_collectives_check rank R: OK" on success.
"""
import faulthandler
import sys

faulthandler.dump_traceback_later(200, exit=True)  # never hang the test
import mlfabric
import numpy as np

failures = []
mlfabric.init()
rank, size = mlfabric.rank(), mlfabric.size()
backend = mlfabric.reducer().backend


def expect(cond, what):
    if not cond:
        failures.append(what)
        print("rank %d: FAILED %s (%s, %d ranks)" % (rank, what, backend, size),
              file=sys.stderr, flush=True)


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
    expect(False, "expected %s naming %r, nothing raised" % (exc.__name__, texts))


def splits_of(src):
    """Rows rank `src` sends each rank: uneven, and none to rank (src+1) % size."""
    return [0 if d == (src + 1) % size else 1 + (src + 2 * d) % 3 for d in range(size)]


def rows_for(src, dst, n, dtype):
    """The n rows (of 2) rank `src` sends rank `dst`: sender, receiver, row."""
    base = np.arange(n, dtype=np.int64)[:, None] * 10 + np.arange(2)[None, :]
    return (src * 10000 + dst * 1000 + base).astype(dtype)


# ---- 1. alltoall
for dtype in (np.int64, np.float32):
    send = np.concatenate([rows_for(rank, d, n, dtype) for d, n in enumerate(splits_of(rank))])
    out, received = mlfabric.alltoall(send, splits=splits_of(rank))
    want = np.concatenate([rows_for(s, rank, splits_of(s)[rank], dtype) for s in range(size)])
    expect(out.dtype == dtype and np.array_equal(out, want),
           "alltoall %s uneven splits: %s" % (np.dtype(dtype).name, out.tolist()))
    expect(received.dtype == np.int32 and
           received.tolist() == [splits_of(s)[rank] for s in range(size)],
           "alltoall received_splits %s" % received.tolist())

equal = np.arange(size * 2 * 3, dtype=np.float16).reshape(size * 2, 3) + 100 * rank
out = mlfabric.alltoall(equal)  # no splits: 2 rows to each rank, only the array back
want = np.concatenate([np.arange(size * 6, dtype=np.float16).reshape(size * 2, 3)[2 * rank:
                       2 * rank + 2] + 100 * s for s in range(size)])
expect(isinstance(out, np.ndarray) and np.array_equal(out, want), "alltoall float16, no splits")

flags = np.array([(rank + d) % 2 == 0 for d in range(size)])
out, received = mlfabric.alltoall(flags, [1] * size)
expect(out.dtype == bool and out.tolist() == [(s + rank) % 2 == 0 for s in range(size)],
       "alltoall bool: %s" % out.tolist())

out, received = mlfabric.alltoall(np.zeros((0, 4), np.int32), np.zeros(size, np.int64))
expect(out.shape == (0, 4) and received.tolist() == [0] * size, "alltoall of an empty array")


# ---- 2. reducescatter
def inputs(r, rows, dtype):
    return ((np.arange(rows * 3).reshape(rows, 3) % 7 + 1) * (r + 1) - 3 * r).astype(dtype)


def my_rows(rows):
    counts = [rows // size + (r < rows % size) for r in range(size)]
    begin = sum(counts[:rank])
    return slice(begin, begin + counts[rank])


REDUCE = {mlfabric.Sum: np.sum, mlfabric.Min: np.min, mlfabric.Max: np.max,
          mlfabric.Product: np.prod}
for rows in (7, 2):
    every = np.stack([inputs(r, rows, np.int32) for r in range(size)])
    for op, fn in REDUCE.items():
        out = mlfabric.reducescatter(inputs(rank, rows, np.int32), op=op)
        want = fn(every, axis=0).astype(np.int32)[my_rows(rows)]
        expect(out.dtype == np.int32 and np.array_equal(out, want),
               "reducescatter %s of %d rows: %s vs %s" % (op, rows, out.tolist(), want.tolist()))
    out = mlfabric.reducescatter(inputs(rank, rows, np.float64))  # Average, the default
    want = every.astype(np.float64).sum(axis=0)[my_rows(rows)] / size
    expect(np.allclose(out, want, rtol=0, atol=1e-12), "reducescatter Average of %d rows" % rows)

# ---- 3. bad arguments: the rank that passed them names them; the others name it.
bad = size - 1
ok_send = np.arange(size * 2, dtype=np.int32)
cases = [([1] * (size + 1), "expected %d row counts" % size),
         ([-1] + [1] * (size - 2) + [size * 2 - (size - 2) + 1], "is negative"),
         ([size * 2] * size, "add up to"),
         ([2.0] * size, "integer row counts")]
for splits, text in cases:
    if rank == bad:
        raises(lambda: mlfabric.alltoall(ok_send, splits), ValueError, "splits", text)
    else:
        raises(lambda: mlfabric.alltoall(ok_send, [2] * size), ValueError,
               "rank %d passed invalid arguments" % bad)
if rank == bad:
    raises(lambda: mlfabric.alltoall(np.int32(3), [1] * size), ValueError, "array", "scalar")
    raises(lambda: mlfabric.reducescatter(ok_send, op="median"), ValueError, "unknown op",
           "'median'")
    raises(lambda: mlfabric.reducescatter(np.float32(1.0)), ValueError, "scalar")
else:
    raises(lambda: mlfabric.alltoall(ok_send, [2] * size), ValueError,
           "rank %d passed invalid arguments" % bad)
    for _ in range(2):
        raises(lambda: mlfabric.reducescatter(ok_send), ValueError,
               "rank %d passed invalid arguments" % bad)
wide = np.zeros((size, 3 if rank == bad else 2), np.float32)
raises(lambda: mlfabric.alltoall(wide, [1] * size), ValueError, "row length")
raises(lambda: mlfabric.reducescatter(np.ones(4, np.int32), op=mlfabric.Max if rank else
                                      mlfabric.Min), ValueError, "reduce op")
# An allreduce whose arrays differ in shape at equal length fails on every
# rank naming both shapes (the array's shape goes with it).
twisted = np.ones((2, 6) if rank == bad else (12,), np.float32)
raises(lambda: mlfabric.allreduce(twisted), ValueError, "shape", "[2, 6]", "[12]")
# Still in step.
out, received = mlfabric.alltoall(np.full((size, 1), rank, np.int64), [1] * size)
expect(out.ravel().tolist() == list(range(size)), "alltoall after the errors")

failed = len(failures)
total = mlfabric.allreduce(np.array([failed], np.int64))
if total[0] == 0:
    print("numpy_collectives_check rank %d: OK" % rank, flush=True)
mlfabric.shutdown()
sys.exit(0 if total[0] == 0 else 1)
