"""TensorFlow ops and Horovod's `horovod.tensorflow` API.

A Horovod TensorFlow program runs with its import line changed
(`import horovod.tensorflow as hvd` -> `import mlfabric.tensorflow as hvd`)
under `mlfabric-run` (python/README.md lists where we differ):

    hvd.init()
    print(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size())
    g = hvd.allreduce(grad)                      # average over ranks (op=hvd.Sum: sum)
    tape = hvd.DistributedGradientTape(tape)     # tape.gradient() averages over ranks
    hvd.broadcast_variables(model.variables, root_rank=0)

Gradients are Horovod's: allreduce -> the allreduce of the upstream
gradient (same op, prescale, postscale); allgather -> the upstream gradient
averaged over ranks, this rank's rows; broadcast -> that average on the
root, zero elsewhere; alltoall -> the alltoall of the upstream gradient
with the received splits; reducescatter -> the allgather of the upstream
gradient (times the size for op=Sum). tf.IndexedSlices are allgathered (values and indices)
unless sparse_as_dense=True. Only the global process set exists; any other
process_set raises ValueError.

MLfabric's own ops (parameter-server push/get from TensorFlow):

    outcome, version, delay = hvd.push(worker, "ps0", [w0, b0, w1], version)  # priorities 0, 1, 2
    version, flat = hvd.get(worker, "ps0")

The kernels are asynchronous and only forward into the C++ core; calls on one
AllReducer run in call order, so every rank must issue the same sequence.
"""
import pickle
import sys
import types
import weakref

import numpy as np
import tensorflow as tf

import mlfabric
from mlfabric import _lib
from mlfabric import compression as _compression
from mlfabric import _tensorflow_elastic as elastic  # hvd.elastic (Horovod's elastic states)
from mlfabric import (cross_rank, cross_size, init, is_initialized, local_rank,  # noqa: F401
                      local_size, rank, shutdown, size)

_lib.load_core()
_ops = tf.load_op_library(_lib.find("mlfabric_tf_ops.so"))

_COLLECTIVE_TYPES = (tf.float16, tf.float32, tf.float64, tf.int8, tf.uint8, tf.int16, tf.uint16,
                     tf.int32, tf.int64)
_PUSH_TYPES = (tf.float32, tf.float64, tf.int32, tf.int64)

Compression = _compression.Compression

# Reduction ops, as in Horovod (hvd.Average, hvd.Sum, hvd.Min, hvd.Max,
# hvd.Product, hvd.Adasum).
Average = "average"
Sum = "sum"
Min = "min"
Max = "max"
Product = "product"
Adasum = "adasum"
_OPS = (Average, Sum, Min, Max, Product)



def __getattr__(name):
    # SyncBatchNormalization subclasses a Keras layer: Keras is imported on
    # first use only.
    if name == "SyncBatchNormalization":
        from mlfabric import _sync_batch_norm
        layer = _sync_batch_norm.SyncBatchNormalization
        if layer._sum_over_ranks is None:
            layer._sum_over_ranks = staticmethod(
                lambda tensor, reducer: allreduce(tensor, op=Sum, reducer=reducer))
        return layer
    raise AttributeError("module %r has no attribute %r" % (__name__, name))

def _check_dtype(tensor, allow_bool=False):
    """Horovod's dtypes: bool only where `allow_bool` (broadcast, allgather)."""
    if tensor.dtype == tf.bool and allow_bool:
        return
    if tensor.dtype not in _COLLECTIVE_TYPES:
        raise TypeError("mlfabric: unsupported dtype %s; collectives take float16, float32, "
                        "float64, int8, uint8, int16, uint16, int32 or int64 (broadcast and "
                        "allgather also bool)" % tensor.dtype.name)


def _check_push_dtype(tensor):
    if tensor.dtype not in _PUSH_TYPES:
        raise TypeError("mlfabric: unsupported dtype %s; pushes carry float32, float64, int32 "
                        "or int64" % tensor.dtype.name)


def _resolve_op(average, op, where):
    """Horovod's rule: `op` wins; `average` (deprecated there) maps to it;
    neither means Average."""
    if op is not None and average is not None:
        raise ValueError("%s: give `op` or `average`, not both" % where)
    if op is None:
        op = Sum if average is False else Average
    if op == Adasum:
        raise ValueError("%s: op=Adasum is not supported by MLfabric; use hvd.Average, hvd.Sum, "
                         "hvd.Min, hvd.Max or hvd.Product" % where)
    if op not in _OPS:
        raise ValueError("%s: unknown op %r; use hvd.Average, hvd.Sum, hvd.Min, hvd.Max or "
                         "hvd.Product" % (where, op))
    return op


# In a graph (tf.function, TF1) independent collectives may run in any
# order, but calls on one AllReducer must come in the same order on every
# rank: each collective op of a graph runs after the one created before it.
# Every rank builds the same graph in the same order, so this order is the
# same everywhere (Horovod matches tensors by name instead).
_last_collective = weakref.WeakKeyDictionary()


def _sum(tensor, reducer, op=Sum):
    """The one place that creates an AllReduce op: the element-wise sum
    (also for Average), minimum, maximum or product of `tensor` over the
    ranks, ordered after the graph's previous collective."""
    tensor = tf.convert_to_tensor(tensor)
    _check_dtype(tensor)
    reduce_op = Sum if op == Average else op
    return _ordered(lambda: _ops.mlfabric_allreduce(tensor, handle=reducer.handle,
                                                    reduce_op=reduce_op))


def _ordered(make_op):
    """Runs `make_op()` (which creates one collective op and returns its
    outputs) after the graph's previous collective; eagerly, at once."""
    if tf.executing_eagerly():
        return elastic.raises_membership_changed(make_op)()
    graph = tf.compat.v1.get_default_graph()
    previous = _last_collective.get(graph)
    with tf.control_dependencies([] if previous is None else [previous]):
        outputs = make_op()
    last = outputs[0] if isinstance(outputs, (list, tuple)) else outputs
    _last_collective[graph] = last
    return outputs


class ProcessSet:
    """Horovod's process set, for the one set MLfabric has: every rank
    (`global_process_set`). rank()/size()/included() as Horovod's."""
    process_set_id = 0
    ranks = None

    def rank(self):
        """This process's rank in the set: its global rank."""
        return mlfabric.rank()

    def size(self):
        """The number of ranks in the set: all of them."""
        return mlfabric.size()

    def included(self):
        """True: every rank is in the global set."""
        return True

    def __repr__(self):
        return "ProcessSet(process_set_id=0, ranks=all)"


global_process_set = ProcessSet()


def add_process_set(process_set):
    """Horovod's dynamic process sets: MLfabric has only the global set, so
    this raises ValueError naming the ranks asked for."""
    ranks = getattr(process_set, "ranks", process_set)
    raise ValueError("mlfabric.tensorflow.add_process_set: MLfabric has only the global process "
                     "set (every rank), hvd.global_process_set; cannot add one of ranks %r"
                     % (ranks,))


def remove_process_set(process_set):
    """Horovod's: the global process set cannot be removed, and there is no
    other (ValueError)."""
    raise ValueError("mlfabric.tensorflow.remove_process_set: %r cannot be removed; MLfabric has "
                     "only the global process set" % (process_set,))


def _check_process_set(process_set, where):
    """Accepts the global process set (or its id 0); MLfabric has no other."""
    if process_set is None or process_set is global_process_set or process_set == 0:
        return
    if getattr(process_set, "process_set_id", None) == 0:
        return
    raise ValueError("%s: process_set %r is not supported; MLfabric has only the global process "
                     "set (every rank), hvd.global_process_set" % (where, process_set))


def _scale(tensor, factor):
    """tensor * factor as Horovod scales: integers in float64 and float16 in
    float32 (then cast back, truncating), other types in their own."""
    if factor == 1.0:
        return tensor
    dtype = tensor.dtype
    wide = tf.float32 if dtype == tf.float16 else tf.float64 if dtype.is_integer else dtype
    if wide == dtype:
        return tensor * tf.cast(factor, dtype)
    return tf.cast(tf.cast(tensor, wide) * tf.cast(factor, wide), dtype)


def _reduce_value(tensor, op, compression, prescale_factor, postscale_factor, reducer):
    """The forward value of a dense allreduce (no gradient of its own)."""
    tensor = _scale(tensor, prescale_factor)
    wire, ctx = compression.compress(tensor)
    total = compression.decompress(_sum(wire, reducer, op), ctx)
    if op == Average:
        # Over the contributions actually summed (backup workers leave the
        # latest out: reducer.summed < reducer.size).
        total = total / tf.cast(reducer.summed, total.dtype)
    return _scale(total, postscale_factor)


def _allreduce_dense(tensor, op, compression, prescale_factor, postscale_factor, reducer):
    """A dense allreduce whose gradient is Horovod's: the allreduce of the
    upstream gradient with the same op and the same pre- and postscale."""
    @tf.custom_gradient
    def reduce(x):
        def grad(dy):
            return _allreduce_dense(dy, op, compression, prescale_factor, postscale_factor,
                                    reducer)
        return _reduce_value(x, op, compression, prescale_factor, postscale_factor,
                             reducer), grad
    return reduce(tensor)


def _sparse_op(average, op, prescale_factor, postscale_factor, where):
    """The op of an allreduce that has a tf.IndexedSlices to reduce, checked
    as Horovod checks it, before anything moves: Adasum, Min, Max, Product
    and a pre- or postscale factor raise NotImplementedError (an allgather
    of values and indices can only sum or average)."""
    if op is not None and average is not None:
        raise ValueError("%s: give `op` or `average`, not both" % where)
    if op is None:
        op = Sum if average is False else Average
    if op == Adasum:
        raise NotImplementedError(
            "%s: op=Adasum cannot reduce a tf.IndexedSlices (and MLfabric has no Adasum); "
            "sparse_as_dense=True reduces it as a dense tensor" % where)
    if op in _OPS and op not in (Average, Sum):
        raise NotImplementedError(
            "%s: only Sum and Average reduce a tf.IndexedSlices, not %r; sparse_as_dense=True "
            "reduces it as a dense tensor" % (where, op))
    if prescale_factor != 1.0 or postscale_factor != 1.0:
        raise NotImplementedError("%s: prescale_factor and postscale_factor do not apply to a "
                                  "tf.IndexedSlices" % where)
    return _resolve_op(None, op, where)


def _allreduce_sparse(slices, op, reducer, where):
    """Horovod's allreduce of a tf.IndexedSlices (op Sum or Average, from
    _sparse_op): an allgather of its values and of its indices (duplicates
    stay; a sum over equal indices is the allreduce of the dense tensor).
    Average divides the values by the size as Horovod does, with `/`: an
    integer dtype's values become floating point (int8, uint8, int16:
    float32; int32, int64: float64)."""
    if reducer.summed != reducer.size:
        raise ValueError("%s: a tf.IndexedSlices cannot be reduced with backup workers (use "
                         "sparse_as_dense=True)" % where)
    values = allgather(slices.values, reducer=reducer)
    indices = allgather(slices.indices, reducer=reducer)
    if op == Average:
        values = values / tf.cast(reducer.size, values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


def allreduce(tensor, average=None, device_dense="", device_sparse="",
              compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, name=None, process_set=None, ignore_name_scope=False,
              reducer=None):
    """The average (default, or op=Average) or sum (op=Sum) of `tensor` over
    all ranks, as Horovod's `hvd.allreduce`: postscale * reduce(prescale *
    tensor). Differentiable as Horovod's: the gradient is the allreduce of
    the upstream gradient with the same op, prescale and postscale. A
    tf.IndexedSlices is reduced as Horovod does, by allgathering its values
    and indices (Average divides the values by the size, so integer values
    become floating point; other ops and pre- or postscale factors raise
    NotImplementedError). `compression` is
    applied to what crosses the network (Compression.fp16: float32/64
    travel as float16). `device_*`, `name` and `ignore_name_scope` are
    accepted and ignored (CPU tensors; ops are matched by call order)."""
    del device_dense, device_sparse, name, ignore_name_scope
    where = "mlfabric.tensorflow.allreduce"
    _check_process_set(process_set, where)
    if isinstance(tensor, tf.IndexedSlices):
        op = _sparse_op(average, op, prescale_factor, postscale_factor, where)
        return _allreduce_sparse(tensor, op, reducer or mlfabric.reducer(), where)
    op = _resolve_op(average, op, where)
    reducer = reducer or mlfabric.reducer()
    tensor = tf.convert_to_tensor(tensor)
    _check_dtype(tensor)
    return _allreduce_dense(tensor, op, compression, prescale_factor, postscale_factor, reducer)


@tf.RegisterGradient("MlfabricAllreduce")
def _allreduce_grad(op, grad):
    # The raw op's gradient, as Horovod's: the same reduction of the
    # gradients (for a sum, d(sum_r x_r)/dx_r = 1). allreduce, allgather and
    # broadcast define their own.
    reduce_op = op.get_attr("reduce_op")
    if isinstance(reduce_op, bytes):
        reduce_op = reduce_op.decode()
    return _sum(grad, _ReducerHandle(op.get_attr("handle")), reduce_op)


class _ReducerHandle:
    """An AllReducer known only by its handle (in a registered gradient)."""

    def __init__(self, handle):
        self.handle = handle


# Tensor fusion (Horovod's HOROVOD_FUSION_THRESHOLD): a step's tensors travel
# as few AllReduces as possible, one fused buffer per dtype of at most this
# many bytes (a larger tensor goes alone). Every AllReduce through the
# mlfabric backend is a scheduler-planned round with a fixed cost of a few
# milliseconds on top of its bytes, so fewer, larger rounds are faster.
_DEFAULT_FUSION_THRESHOLD = 128 * 1024 * 1024


def fusion_threshold():
    """Bytes per fused AllReduce buffer: MLFABRIC_FUSION_THRESHOLD, else
    HOROVOD_FUSION_THRESHOLD, else 128 MiB (Horovod's default). 0 turns
    fusion off (one AllReduce per tensor)."""
    import os
    for name in ("MLFABRIC_FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD"):
        value = os.environ.get(name, "").strip()
        if value:
            try:
                threshold = int(value)
            except ValueError:
                raise ValueError("%s must be a number of bytes, not %r" % (name, value))
            if threshold < 0:
                raise ValueError("%s must be >= 0 bytes, got %d" % (name, threshold))
            return threshold
    return _DEFAULT_FUSION_THRESHOLD


def _fusion_buckets(tensors, threshold):
    """Indices of `tensors` in fused buckets: per dtype in first-seen order,
    consecutive tensors of that dtype up to `threshold` bytes (a tensor of
    unknown or larger size, or any tensor when threshold is 0, alone).
    Depends only on dtypes and static shapes, so every rank cuts the same
    buckets."""
    by_dtype = {}
    for i, t in enumerate(tensors):
        by_dtype.setdefault(t.dtype, []).append(i)
    buckets = []
    for indices in by_dtype.values():
        current, current_bytes = [], 0
        for i in indices:
            n = tensors[i].shape.num_elements()
            nbytes = None if n is None else n * tensors[i].dtype.size
            if (nbytes is None or threshold == 0 or
                    (current and current_bytes + nbytes > threshold)):
                if current:
                    buckets.append(current)
                current, current_bytes = [], 0
            current.append(i)
            current_bytes += nbytes or 0
            if nbytes is None or threshold == 0:
                buckets.append(current)
                current, current_bytes = [], 0
        if current:
            buckets.append(current)
    return buckets


# A fused buffer is one AllReduce of its tensors' concatenation: the ranks
# agree on its length and dtype with every call, but not on how it divides
# into tensors. So that tensors of different shapes on different ranks
# ([3, 4] and [5] against [4, 3] and [5]) fail instead of summing misplaced
# elements, the ranks first agree on the call's layout (every tensor's dtype
# and shape, in order) in one small sum: with each eager call, and once
# while a tf.function is traced (every rank traces at the same call), not
# with each of its steps; not in a TF1 graph, where nothing runs while it
# is built, nor with backup workers, whose sums may leave ranks out.
# Horovod's coordinator compares every tensor of every step.
def _layout_key(tensors):
    return tuple((t.dtype.name, tuple(-1 if d is None else int(d) for d in t.shape.as_list()))
                 for t in tensors)


def _layout_text(key):
    return ", ".join("%s%s" % (dtype, list(shape)) for dtype, shape in key)


def _agree_layout(tensors, reducer, where):
    """Raises tf.errors.FailedPreconditionError on every rank, naming the
    ranks and their layouts, when the ranks' fused layouts differ."""
    import hashlib
    if reducer.size == 1 or reducer.summed != reducer.size:
        return  # with backup workers a sum may leave ranks out: no agreement by sum
    # (A rank that left the job fails this sum as it fails a collective op.)
    summed = elastic.raises_membership_changed(lambda a: reducer.allreduce(a, "sum"))
    with tf.init_scope():
        if not tf.executing_eagerly():
            return  # a TF1 graph: nothing can run while it is built
        text = _layout_text(_layout_key(tensors)).encode()
        digest = int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")
        words = np.zeros(reducer.size, np.int64)
        words[reducer.rank] = (digest >> 2) | 1  # positive, never 0 (0: a rank not in the sum)
        words = summed(words)
        mine = words[reducer.rank]
        if all(w in (0, mine) for w in words):
            return
        # Differing: every rank gathers every layout to name them (the same
        # words on every rank, so every rank comes here).
        lengths = np.zeros(reducer.size, np.int64)
        lengths[reducer.rank] = len(text)
        lengths = summed(lengths)
        longest = int(lengths.max())
        table = np.zeros((reducer.size, longest), np.uint8)
        table[reducer.rank, :len(text)] = np.frombuffer(text, np.uint8)
        table = summed(table.reshape(-1)).reshape(reducer.size, longest)
        layouts = [bytes(table[r, :lengths[r]]).decode(errors="replace")
                   for r in range(reducer.size)]
        first = next(r for r in range(reducer.size) if words[r] != 0)
        other = next(r for r in range(reducer.size) if words[r] not in (0, words[first]))
        raise tf.errors.FailedPreconditionError(
            None, None,
            "%s: Mismatched fused tensor shapes: rank %d passed %s while rank %d passed %s "
            "(every rank must pass tensors of the same shapes and dtypes, in the same order)"
            % (where, first, layouts[first], other, layouts[other]))


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="",
                      compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=None, reducer=None,
                      fusion_threshold_bytes=None):
    """The allreduce of each tensor of a list (None entries pass through),
    fused as Horovod's tensor fusion: one AllReduce per dtype for up to
    `fusion_threshold_bytes` (default: fusion_threshold(), from
    MLFABRIC_FUSION_THRESHOLD) of consecutive tensors, each packed into one
    flat buffer, summed, and unpacked. Each element is summed over the same
    ranks as without fusion (the sum is element-wise), and every dtype keeps
    its own precision. The fused AllReduces run one after another in bucket
    order, the same on every rank. A tf.IndexedSlices entry is reduced
    alone, as allreduce does (allgather of values and indices); with one
    in the list, as in Horovod, only Sum and Average without pre- or
    postscale factors are allowed (NotImplementedError otherwise). The
    ranks first agree on the tensors' dtypes and shapes (_agree_layout):
    tf.errors.FailedPreconditionError on every rank when they differ."""
    where = "mlfabric.tensorflow.grouped_allreduce"
    del device_dense, device_sparse
    _check_process_set(process_set, where)
    if any(isinstance(t, tf.IndexedSlices) for t in tensors):
        op = _sparse_op(average, op, prescale_factor, postscale_factor, where)
    else:
        op = _resolve_op(average, op, where)
    threshold = fusion_threshold() if fusion_threshold_bytes is None else int(
        fusion_threshold_bytes)
    if threshold < 0:
        raise ValueError("%s: fusion_threshold_bytes must be >= 0, got %d" % (where, threshold))
    reducer = reducer or mlfabric.reducer()
    out = list(tensors)
    sparse = [i for i, t in enumerate(out) if isinstance(t, tf.IndexedSlices)]
    for i in sparse:
        out[i] = _allreduce_sparse(out[i], op, reducer, where)
    positions = [i for i, t in enumerate(out) if t is not None and i not in sparse]
    present = [tf.convert_to_tensor(out[i]) for i in positions]
    if not present:
        return out
    # bfloat16 has no AllReduce of its own: it travels as float32 (exact)
    # and is rounded back once, as the single-buffer fusion always did.
    wire = [tf.cast(t, tf.float32) if t.dtype == tf.bfloat16 else t for t in present]
    for t in wire:
        _check_dtype(t)
    _agree_layout(present, reducer, where)
    for bucket in _fusion_buckets(wire, threshold):
        # Buckets run in order: _sum orders a graph's collectives.
        parts = [wire[i] for i in bucket]
        if len(parts) == 1:
            flat = tf.reshape(parts[0], [-1])
        else:
            flat = tf.concat([tf.reshape(t, [-1]) for t in parts], axis=0)
        total = _allreduce_dense(flat, op, compression, prescale_factor, postscale_factor,
                                 reducer)
        sizes = [tf.size(t) for t in parts]
        pieces = [total] if len(parts) == 1 else tf.split(total, sizes)
        for i, piece in zip(bucket, pieces):
            # (op=Average of an integer tensor divides into floats: cast back.)
            out[positions[i]] = tf.cast(tf.reshape(piece, tf.shape(present[i])),
                                        present[i].dtype)
    return out


def allreduce_list(tensors, average=False, reducer=None, compression=Compression.none):
    """MLfabric's name for grouped_allreduce (sum unless average=True)."""
    return grouped_allreduce(tensors, op=Average if average else Sum, reducer=reducer,
                             compression=compression)


def allgather(tensor, name=None, ignore_name_scope=False, process_set=None, reducer=None):
    """Concatenates every rank's `tensor` along the first dimension, in rank
    order (as Horovod's `hvd.allgather`; first dimensions may differ, the
    others must match), eagerly or in a graph. One MlfabricAllgather, the C++
    `AllReducer::Allgather` (MPI_Allgatherv, or between hosts on the mlfabric
    backend each rank's rows pushed once to every other rank). Gradient, as
    Horovod's: the upstream gradient averaged over ranks, then this rank's
    rows of it."""
    del name, ignore_name_scope
    _check_process_set(process_set, "mlfabric.tensorflow.allgather")
    reducer = reducer or mlfabric.reducer()
    tensor = tf.convert_to_tensor(tensor)
    _check_dtype(tensor, allow_bool=True)
    if tensor.shape.rank == 0:
        tensor = tf.reshape(tensor, [1])
    if tensor.dtype == tf.bool:  # moves as bytes; not differentiable
        return _ordered(lambda: _ops.mlfabric_allgather(tensor, handle=reducer.handle))[0]
    inner = tensor.shape.rank - 1

    @tf.custom_gradient
    def gather(x):
        gathered, rows = _ordered(lambda: _ops.mlfabric_allgather(x, handle=reducer.handle))

        def grad(dy):
            averaged = _allreduce_dense(dy, Average, Compression.none, 1.0, 1.0, reducer)
            before = tf.reduce_sum(rows[:reducer.rank])
            begin = tf.concat([tf.reshape(before, [1]), tf.zeros([inner], tf.int64)], axis=0)
            return tf.slice(averaged, begin, tf.shape(x, out_type=tf.int64))
        return gathered, grad
    return gather(tensor)


def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=None,
                      reducer=None):
    """allgather of each tensor of a list, one after another, as Horovod's
    grouped_allgather (same results; Horovod fuses them)."""
    del name, ignore_name_scope
    _check_process_set(process_set, "mlfabric.tensorflow.grouped_allgather")
    return [allgather(t, reducer=reducer) for t in tensors]


def _alltoall(tensor, splits, reducer):
    """(output, received splits) of one MlfabricAlltoall, ordered; its
    gradient is Horovod's: the alltoall of the upstream gradient with the
    received splits (each row goes back to the rank it came from)."""
    @tf.custom_gradient
    def exchange(x):
        output, received = _ordered(
            lambda: _ops.mlfabric_alltoall(x, splits, handle=reducer.handle))

        def grad(dy, _):
            return _alltoall(dy, received, reducer)[0]
        return (output, received), grad
    return exchange(tensor)


def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=None,
             reducer=None):
    """Horovod's `hvd.alltoall`: sends splits[d] rows (first dimension) of
    `tensor` to rank d and returns the rows every rank sent this one,
    concatenated in rank order. Without `splits` the first dimension is
    divided equally (it must divide by the size) and only the tensor is
    returned; with `splits`, `(tensor, received_splits)` as Horovod, where
    received_splits[s] (int32) rows came from rank s. Splits may be uneven or
    zero and the tensor empty; the other dimensions must match on every
    rank. Gradient, as Horovod's: the alltoall of the upstream gradient with
    the received splits."""
    del name, ignore_name_scope
    where = "mlfabric.tensorflow.alltoall"
    _check_process_set(process_set, where)
    reducer = reducer or mlfabric.reducer()
    tensor = tf.convert_to_tensor(tensor)
    _check_dtype(tensor, allow_bool=True)
    if tensor.shape.rank == 0:
        raise ValueError("%s: a scalar cannot be split; give a tensor with a first dimension"
                         % where)
    wire = tf.constant([], tf.int32) if splits is None else tf.cast(splits, tf.int32)
    if wire.shape.rank not in (None, 1):
        raise ValueError("%s: splits must be a vector (one count per rank), got shape %s"
                         % (where, wire.shape))
    if wire.shape.rank == 1 and splits is not None and wire.shape[0] not in (None, reducer.size):
        raise ValueError("%s: %d splits for %d ranks (one count per rank)"
                         % (where, wire.shape[0], reducer.size))
    if tensor.dtype == tf.bool:  # moves as bytes; not differentiable
        output, received = _ordered(
            lambda: _ops.mlfabric_alltoall(tensor, wire, handle=reducer.handle))
    else:
        output, received = _alltoall(tensor, wire, reducer)
    return output if splits is None else (output, received)


def _reducescatter_value(tensor, op, prescale_factor, postscale_factor, reducer):
    """The forward value: postscale * reducescatter(prescale * tensor), Average
    as the sum divided by the size."""
    tensor = _scale(tensor, prescale_factor)
    reduce_op = Sum if op == Average else op
    out = _ordered(lambda: _ops.mlfabric_reducescatter(tensor, handle=reducer.handle,
                                                       reduce_op=reduce_op))
    if op == Average:
        out = out / tf.cast(reducer.size, out.dtype)
    return _scale(out, postscale_factor)


def _reducescatter(tensor, op, prescale_factor, postscale_factor, reducer):
    """A reducescatter whose gradient is Horovod's: the allgather of the
    upstream gradient, times the size for op=Sum (Horovod scales only Sum)."""
    @tf.custom_gradient
    def scatter(x):
        def grad(dy):
            if op == Sum:
                dy = dy * tf.cast(reducer.size, dy.dtype)
            return allgather(dy, reducer=reducer)
        return _reducescatter_value(x, op, prescale_factor, postscale_factor, reducer), grad
    return scatter(tensor)


def _check_reducescatter(tensor, op, process_set, reducer, where):
    _check_process_set(process_set, where)
    op = _resolve_op(None, op, where)
    tensor = tf.convert_to_tensor(tensor)
    _check_dtype(tensor)
    if tensor.shape.rank == 0:
        raise ValueError("%s: a scalar cannot be scattered; give a tensor with a first dimension"
                         % where)
    if reducer.summed != reducer.size:
        raise ValueError("%s: not available with backup workers" % where)
    return tensor, op


def reducescatter(tensor, device_dense="", compression=Compression.none, op=Average, name=None,
                  process_set=None, ignore_name_scope=False, prescale_factor=1.0,
                  postscale_factor=1.0, reducer=None):
    """Horovod's `hvd.reducescatter`: reduces `tensor` (same shape on every
    rank) over the ranks by `op` (Average by default; Sum, Min, Max,
    Product) and returns this rank's rows of the result: the first
    dimension divided as evenly as possible, the earlier ranks taking one
    extra row each. postscale * reducescatter(prescale * tensor).
    Gradient, as Horovod's: the allgather of the upstream gradient (times
    the size for op=Sum)."""
    del device_dense, name, ignore_name_scope
    where = "mlfabric.tensorflow.reducescatter"
    reducer = reducer or mlfabric.reducer()
    tensor, op = _check_reducescatter(tensor, op, process_set, reducer, where)
    wire, ctx = compression.compress(tensor)
    out = _reducescatter(wire, op, prescale_factor, postscale_factor, reducer)
    return compression.decompress(out, ctx)


def grouped_reducescatter(tensors, device_dense="", compression=Compression.none, op=Average,
                          process_set=None, prescale_factor=1.0, postscale_factor=1.0,
                          reducer=None):
    """reducescatter of each tensor of a list, one after another, as
    Horovod's grouped_reducescatter (same results; Horovod fuses them)."""
    return [reducescatter(t, device_dense, compression, op, process_set=process_set,
                          prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                          reducer=reducer) for t in tensors]


def _broadcast_value(tensor, root_rank, reducer):
    """One MlfabricBroadcast, ordered: the ranks agree on the root (and
    length and dtype) before any data moves, so a root_rank that differs
    across ranks, or is not a rank, fails every rank."""
    return _ordered(lambda: _ops.mlfabric_broadcast(tensor, handle=reducer.handle,
                                                    root_rank=root_rank))


def broadcast(tensor, root_rank=0, name=None, ignore_name_scope=False, process_set=None,
              reducer=None):
    """Rank `root_rank`'s value of `tensor` on every rank. The ranks first
    agree on the root: a root_rank that differs across ranks raises
    tf.errors.FailedPreconditionError on every rank, naming the ranks and
    their roots ("Mismatched Broadcast root rank: rank 0 passed root 0
    while rank 1 passed root 1"); one that is not a rank, ValueError on
    every rank (in a graph: tf.errors.InvalidArgumentError when it runs).
    Gradient, as Horovod's:
    on the root the upstream gradient averaged over ranks, zero
    elsewhere."""
    del name, ignore_name_scope
    where = "mlfabric.tensorflow.broadcast"
    _check_process_set(process_set, where)
    reducer = reducer or mlfabric.reducer()
    root_rank = int(root_rank)
    value = tf.convert_to_tensor(tensor)
    _check_dtype(value, allow_bool=True)
    if not 0 <= root_rank < reducer.size and tf.executing_eagerly():
        # This rank still joins the ranks' agreement, so none is left
        # waiting: the same bad root fails every rank (ValueError here), a
        # differing one with FailedPreconditionError.
        try:
            _broadcast_value(value, root_rank, reducer)
        except tf.errors.InvalidArgumentError as e:
            raise ValueError("%s: root_rank %d is not a rank (size %d)"
                             % (where, root_rank, reducer.size)) from e
    if value.dtype == tf.bool:  # not differentiable
        return _broadcast_value(value, root_rank, reducer)
    is_root = reducer.rank == root_rank

    @tf.custom_gradient
    def bcast(x):
        def grad(dy):
            averaged = _allreduce_dense(dy, Average, Compression.none, 1.0, 1.0, reducer)
            return averaged if is_root else tf.zeros_like(averaged)
        return _broadcast_value(x, root_rank, reducer), grad
    return bcast(value)


def broadcast_variables(variables, root_rank=0, process_set=None, inplace=False, reducer=None,
                        root=None):
    """Sets every variable to its value on rank `root_rank` (Horovod's;
    `inplace` is accepted: MLfabric always assigns the received values)."""
    del inplace
    if root is not None:  # MLfabric's earlier keyword
        root_rank = root
    _check_process_set(process_set, "mlfabric.tensorflow.broadcast_variables")
    assigns = [v.assign(broadcast(v, root_rank, reducer=reducer)) for v in list(variables)]
    if not tf.executing_eagerly() and not tf.inside_function():
        return tf.group(*assigns)  # a TF1 graph: the op to run
    return None


def broadcast_global_variables(root_rank):
    """Horovod's TF1 call: the op that sets every variable of
    tf.compat.v1.global_variables() to its value on rank `root_rank` (run
    it in the session after initialising the variables). Eagerly, as
    Horovod, RuntimeError: TF2 has no global variables collection; use
    broadcast_variables(model.variables, root_rank)."""
    if tf.executing_eagerly():
        raise RuntimeError("mlfabric.tensorflow.broadcast_global_variables() does not run "
                           "eagerly (TF2 has no global variables); use "
                           "hvd.broadcast_variables(<model/optimizer variables>, root_rank)")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def broadcast_(variables, root_rank, name=None, process_set=None, reducer=None):
    """Horovod's in-place broadcast: every variable takes its value on rank
    `root_rank`; returns the variables' new values (a list of tensors)."""
    del name
    _check_process_set(process_set, "mlfabric.tensorflow.broadcast_")
    variables = list(variables)
    values = []
    for v in variables:
        with tf.control_dependencies([v.assign(broadcast(v, root_rank, reducer=reducer))]):
            values.append(v.read_value())
    return values


class _DistributedGradientTape:
    """Wraps a tf.GradientTape: gradient() returns the gradients averaged
    (or summed) over all ranks, fused (grouped_allreduce); gradients of
    local sources (PartialDistributedGradientTape) stay local."""

    def __init__(self, tape, compression, op, reducer, sparse_as_dense=False,
                 prescale_factor=1.0, postscale_factor=1.0, local_sources=(),
                 scale_local_gradients=True):
        self._tape = tape
        self._compression = compression
        self._op = op
        self._reducer = reducer
        self._sparse_as_dense = sparse_as_dense
        self._prescale_factor = prescale_factor
        self._postscale_factor = postscale_factor
        self._local = {id(v) for v in local_sources}
        self._scale_local = scale_local_gradients

    def register_local_source(self, source):
        """Horovod's: `source`'s gradient is not reduced over ranks."""
        self._local.add(id(source))

    def gradient(self, target, sources, output_gradients=None, **kwargs):
        grads = self._tape.gradient(target, sources, output_gradients, **kwargs)
        reduced = self._reduce(tf.nest.flatten(grads), tf.nest.flatten(sources))
        return tf.nest.pack_sequence_as(grads, reduced)

    def _reduce(self, flat, flat_sources):
        """The gradients `flat` of `flat_sources` reduced over ranks, fused;
        local sources' gradients kept (divided by the size when
        scale_local_gradients, as Horovod)."""
        if self._sparse_as_dense:
            flat = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                    for g in flat]
        local = [id(s) in self._local for s in flat_sources]
        shared = grouped_allreduce([None if loc else g for g, loc in zip(flat, local)],
                                   op=self._op, compression=self._compression,
                                   prescale_factor=self._prescale_factor,
                                   postscale_factor=self._postscale_factor,
                                   reducer=self._reducer)
        size = (self._reducer or mlfabric.reducer()).size
        out = []
        for g, loc, reduced in zip(flat, local, shared):
            if not loc or g is None or not self._scale_local:
                out.append(reduced if not loc else g)
            elif isinstance(g, tf.IndexedSlices):
                out.append(tf.IndexedSlices(g.values / size, g.indices, g.dense_shape))
            else:
                out.append(g / size)
        return out

    def __getattr__(self, name):
        return getattr(self._tape, name)

    def __enter__(self):
        self._tape.__enter__()
        return self

    def __exit__(self, *exc):
        return self._tape.__exit__(*exc)


def _predivide(op, gradient_predivide_factor, reducer, where):
    """Horovod's gradient_predivide_factor f: op Average becomes Sum with
    prescale 1/f and postscale f/size (the same average, divided partly
    before the sum). Returns (op, prescale, postscale)."""
    if gradient_predivide_factor == 1.0:
        return op, 1.0, 1.0
    if op != Average:
        raise ValueError("%s: gradient_predivide_factor needs op == Average, got %r"
                         % (where, op))
    size = (reducer or mlfabric.reducer()).size
    f = float(gradient_predivide_factor)
    return Sum, 1.0 / f, f / size


def DistributedGradientTape(gradtape, device_dense="", device_sparse="",
                            compression=Compression.none, sparse_as_dense=False,
                            op=Average, gradient_predivide_factor=1.0, num_groups=0,
                            groups=None, process_set=None, reducer=None):
    """Horovod's DistributedGradientTape: `tape.gradient(loss, vars)` returns
    the gradients averaged over ranks (op=Sum: summed). Sparse gradients
    (tf.IndexedSlices) are allgathered as Horovod does, or reduced dense
    with sparse_as_dense=True. `num_groups`/`groups` are ignored (fusion is
    by dtype and MLFABRIC_FUSION_THRESHOLD, grouped_allreduce)."""
    del device_dense, device_sparse, num_groups, groups
    where = "mlfabric.tensorflow.DistributedGradientTape"
    _check_process_set(process_set, where)
    op = _resolve_op(None, op, where)
    op, pre, post = _predivide(op, gradient_predivide_factor, reducer, where)
    return _DistributedGradientTape(gradtape, compression, op, reducer, sparse_as_dense,
                                    pre, post)


def _layer_variables(local_layers):
    if local_layers is None:
        return []
    layers = local_layers if isinstance(local_layers, (list, tuple)) else [local_layers]
    variables = []
    for layer in layers:
        if not hasattr(layer, "trainable_weights"):
            raise ValueError("local_layers: expected Keras layers, got %r" % (layer,))
        variables.extend(layer.trainable_weights)
    return variables


def PartialDistributedGradientTape(gradtape, device_dense="", device_sparse="",
                                   compression=Compression.none, sparse_as_dense=False,
                                   op=Average, gradient_predivide_factor=1.0, num_groups=0,
                                   groups=None, process_set=None, local_layers=None,
                                   scale_local_gradients=True, reducer=None):
    """Horovod's PartialDistributedGradientTape: as DistributedGradientTape,
    but the gradients of `local_layers`' trainable weights (and of sources
    given to tape.register_local_source) are not reduced; with
    scale_local_gradients they are divided by the size, as Horovod does."""
    tape = DistributedGradientTape(gradtape, compression=compression,
                                   sparse_as_dense=sparse_as_dense, op=op,
                                   gradient_predivide_factor=gradient_predivide_factor,
                                   process_set=process_set, reducer=reducer)
    tape._local = {id(v) for v in _layer_variables(local_layers)}
    tape._scale_local = scale_local_gradients
    return tape


def _distributed_optimizer_class(base, compression=Compression.none, sparse_as_dense=False,
                                 op=Average, prescale=1.0, postscale=1.0, passes=1,
                                 average_aggregated_gradients=False, reducer=None, local=(),
                                 scale_local_gradients=True):
    """A subclass of the Keras 3 optimizer class `base` whose updates apply
    the gradients reduced over ranks (DistributedOptimizer's class)."""

    class _Distributed(base):
        # Keras 3 calls _clip_gradients exactly once per variable update,
        # with the (accumulated, averaged) gradients, before clipping and
        # the update step: the one place where every rank's gradients must
        # be combined. It is a private hook; tests/horovod_keras_check.py
        # fails if a Keras upgrade moves it. _backend_apply_gradients is
        # where the variables of those gradients are known.
        def _backend_apply_gradients(self, grads, trainable_variables):
            self._mlfabric_variables = list(trainable_variables)
            return super()._backend_apply_gradients(grads, trainable_variables)

        def _clip_gradients(self, grads):
            if passes > 1 and not average_aggregated_gradients:
                # Keras averages the N accumulated passes; Horovod sums them.
                grads = [None if g is None else g * passes for g in grads]
            tape = _DistributedGradientTape(None, compression, op, reducer, sparse_as_dense,
                                            prescale, postscale, (), scale_local_gradients)
            tape._local = set(local)
            variables = getattr(self, "_mlfabric_variables", [None] * len(grads))
            grads = tape._reduce(list(grads), list(variables))
            return super()._clip_gradients(grads)

    _Distributed.__name__ = "Distributed" + base.__name__
    return _Distributed


def _keras_distributed_optimizer(optimizer, name=None, device_dense="", device_sparse="",
                                 compression=Compression.none, sparse_as_dense=False,
                                 gradient_predivide_factor=1.0, op=Average,
                                 backward_passes_per_step=1, average_aggregated_gradients=False,
                                 num_groups=0, groups=None, process_set=None, reducer=None,
                                 average=None, backup_workers=0, local_layers=None,
                                 scale_local_gradients=True):
    """mlfabric.keras.DistributedOptimizer and PartialDistributedOptimizer
    (see there), here so that both mlfabric.keras and this module's
    DistributedOptimizer use it without this module importing mlfabric.keras."""
    del device_dense, device_sparse, num_groups, groups
    where = "mlfabric.keras.DistributedOptimizer"
    _check_process_set(process_set, where)
    if average is not None:
        op = Average if average else Sum
    op = _resolve_op(None, op, where)
    passes = int(backward_passes_per_step)
    if passes < 1:
        raise ValueError("%s: backward_passes_per_step must be >= 1, got %r"
                         % (where, backward_passes_per_step))
    if backup_workers:
        if reducer is not None:
            raise ValueError("%s: give reducer or backup_workers, not both" % where)
        reducer = mlfabric.backup_reducer(backup_workers)
    op, prescale, postscale = _predivide(op, gradient_predivide_factor, reducer, where)
    if getattr(optimizer, "gradient_accumulation_steps", None):
        raise ValueError("%s: the optimizer already accumulates gradients "
                         "(gradient_accumulation_steps); use backward_passes_per_step" % where)
    local = {id(v) for v in _layer_variables(local_layers)}
    cls = _distributed_optimizer_class(type(optimizer), compression, sparse_as_dense, op, prescale,
                                       postscale, passes, average_aggregated_gradients, reducer,
                                       local, scale_local_gradients)
    config = optimizer.get_config()
    if passes > 1:
        config["gradient_accumulation_steps"] = passes
    if name is not None:
        config["name"] = name
    return cls.from_config(config)


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False,
                         backward_passes_per_step=1, op=Average,
                         average_aggregated_gradients=False, **kwargs):
    """Horovod's DistributedOptimizer for a Keras 3 optimizer (the same as
    mlfabric.keras.DistributedOptimizer)."""
    return _keras_distributed_optimizer(
        optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
        backward_passes_per_step=backward_passes_per_step, op=op,
        average_aggregated_gradients=average_aggregated_gradients, **kwargs)


# ---- Horovod's small API: ranks as tensors, build flags, join, objects.

def _check_set_id(process_set_id, where):
    if process_set_id != 0:
        raise ValueError("%s: process_set_id %r is not supported; MLfabric has only the global "
                         "process set (id 0)" % (where, process_set_id))


def rank_op(name=None):
    """This process's rank as an int32 tensor (fixed for the process's life:
    MLfabric has no elastic membership)."""
    return tf.constant(mlfabric.rank(), tf.int32, name=name)


def local_rank_op(name=None):
    """local_rank() as an int32 tensor."""
    return tf.constant(mlfabric.local_rank(), tf.int32, name=name)


def size_op(process_set_id=0, name=None):
    """size() as an int32 tensor (process_set_id 0, the global set, only)."""
    _check_set_id(process_set_id, "mlfabric.tensorflow.size_op")
    return tf.constant(mlfabric.size(), tf.int32, name=name)


def local_size_op(name=None):
    """local_size() as an int32 tensor."""
    return tf.constant(mlfabric.local_size(), tf.int32, name=name)


def process_set_included_op(process_set_id=0, name=None):
    """1 (int32): every rank is in the global process set, the only one."""
    _check_set_id(process_set_id, "mlfabric.tensorflow.process_set_included_op")
    mlfabric.reducer()
    return tf.constant(1, tf.int32, name=name)


def mpi_built(verbose=False):
    """True: every MLfabric build has the mpi AllReduce backend (Open MPI is
    opened at run time)."""
    return True


def mpi_enabled():
    """True when this process's AllReducer uses the mpi backend."""
    return mlfabric.reducer().backend == "mpi"


def mpi_threads_supported():
    """True when the mpi backend is in use (MLfabric calls MPI from one
    thread per AllReducer, which needs no MPI_THREAD_MULTIPLE)."""
    return mpi_enabled()


def gloo_built(verbose=False):
    """False: MLfabric has no Gloo backend."""
    return False


def gloo_enabled():
    """False: MLfabric has no Gloo backend."""
    return False


def nccl_built(verbose=False):
    """The NCCL version (e.g. 22105) when this process's AllReducer uses the
    nccl backend, else 0. MLfabric opens libnccl at run time, so whether
    it is usable is known only once init() chose a backend."""
    if mlfabric.reducer().backend != "nccl":
        return 0
    import ctypes
    version = ctypes.c_int(0)
    ctypes.CDLL("libnccl.so.2").ncclGetVersion(ctypes.byref(version))
    return int(version.value)


def cuda_built(verbose=False):
    """False: MLfabric's TensorFlow kernels are CPU kernels (GPU tensors are
    copied to the host; the nccl backend stages buffers itself)."""
    return False


def rocm_built(verbose=False):
    """False: no ROCm kernels."""
    return False


def ddl_built(verbose=False):
    """False: no IBM DDL backend."""
    return False


def ccl_built(verbose=False):
    """False: no oneCCL backend."""
    return False


def join(device="", process_set=None):
    """A barrier: returns once every rank has called join(), as an int32
    tensor holding -1. Unlike Horovod's join, it does not stand in for the
    collectives of ranks that ran out of data (every rank must still issue
    the same collectives), and MLfabric cannot tell which rank joined last,
    which Horovod returns: hence -1."""
    del device
    _check_process_set(process_set, "mlfabric.tensorflow.join")
    if not tf.executing_eagerly():
        with tf.control_dependencies([_sum(tf.zeros([1], tf.int32), mlfabric.reducer())]):
            return tf.constant(-1, tf.int32)
    _sum(tf.zeros([1], tf.int32), mlfabric.reducer())
    return tf.constant(-1, tf.int32)


def _object_fetcher(session, where):
    """How the object collectives read a collective's value, as Horovod's:
    eagerly at once; while a tf.function is traced, eagerly outside it
    (tf.init_scope), so the object crosses the ranks at trace time and the
    trace holds the result; in a TF1 graph through `session` or the default
    session. Returns fetch(make), where make() builds the collective and
    returns its tensor."""
    if tf.inside_function():
        with tf.init_scope():
            eager_outside = tf.executing_eagerly()
        if eager_outside:
            def fetch_at_trace(make):
                with tf.init_scope():
                    return make().numpy()
            return fetch_at_trace
    if tf.executing_eagerly():
        return lambda make: make().numpy()
    session = session or tf.compat.v1.get_default_session()
    if session is None:
        raise RuntimeError("%s in a TF1 graph runs its collectives in a session: pass "
                           "session= or call it under a default session (with "
                           "session.as_default()), or call it eagerly" % where)

    def fetch_in_session(make):
        # Run at once, so outside the graph's order of collectives: later
        # ops must not depend on it, or every later step would run it again.
        graph = session.graph
        with graph.as_default():
            saved = _last_collective.pop(graph, None)
            try:
                tensor = make()
            finally:
                _last_collective.pop(graph, None)
                if saved is not None:
                    _last_collective[graph] = saved
        return session.run(tensor)
    return fetch_in_session


def _to_words(data):
    """bytes as int64 words (zero-padded to 8 bytes), exact through a sum."""
    padded = data + b"\0" * (-len(data) % 8)
    return np.frombuffer(padded, np.int64).copy()


def allgather_object(obj, session=None, name=None, process_set=None):
    """Every rank's picklable `obj`, as a list in rank order (Horovod's):
    eagerly, in a tf.function (at trace time: every rank must trace it at
    the same point of its collectives) or in a TF1 graph (through `session`
    or the default session)."""
    del name
    where = "mlfabric.tensorflow.allgather_object"
    _check_process_set(process_set, where)
    fetch = _object_fetcher(session, where)
    data = pickle.dumps(obj)
    lengths = fetch(lambda: allgather(tf.constant([len(data)], tf.int64)))
    words = fetch(lambda: allgather(tf.constant(_to_words(data)))).tobytes()
    out, offset = [], 0
    for n in lengths:
        out.append(pickle.loads(words[offset:offset + int(n)]))
        offset += int(n) + (-int(n) % 8)
    return out


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=None):
    """Rank `root_rank`'s picklable `obj` on every rank (Horovod's; other
    ranks' `obj` is ignored): eagerly, in a tf.function (serialised and
    broadcast at trace time: every rank must trace it at the same point of
    its collectives) or in a TF1 graph (through `session` or the default
    session)."""
    del name
    where = "mlfabric.tensorflow.broadcast_object"
    _check_process_set(process_set, where)
    fetch = _object_fetcher(session, where)
    reducer = mlfabric.reducer()
    data = pickle.dumps(obj) if reducer.rank == root_rank else b""
    n = int(fetch(lambda: broadcast(tf.constant([len(data)], tf.int64), root_rank))[0])
    words = _to_words(data) if data else np.zeros((n + 7) // 8, np.int64)
    received = fetch(lambda: broadcast(tf.constant(words), root_rank)).tobytes()
    return pickle.loads(received[:n])


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=None):
    """A function fn(obj) -> broadcast_object(obj, root_rank) (Horovod's)."""
    _check_process_set(process_set, "mlfabric.tensorflow.broadcast_object_fn")
    return lambda obj: broadcast_object(obj, root_rank, session=session, name=name)


def push(worker, server, updates, version, norm=None, priorities=None):
    """Pushes one tensor or a list of tensors (in layer order) to `server` as
    one update computed from model `version`. Tensor i is sent with priority
    priorities[i] (default i: front layers first; lower = more urgent, see
    api/mlfabric.h TensorSpec). `norm` defaults to the L2 norm over all
    tensors. Returns (outcome, applied_version, delay) tensors: outcome 0 =
    applied, 1 = dropped; a failed push raises tf.errors.UnavailableError."""
    single = not isinstance(updates, (list, tuple))
    tensors = [tf.convert_to_tensor(updates)] if single else [
        tf.convert_to_tensor(u) for u in updates]
    if not tensors:
        raise ValueError("mlfabric.tensorflow.push: no tensors given (an empty list)")
    for t in tensors:
        _check_push_dtype(t)
    if priorities is None:
        priorities = []  # the core assigns layer order
    else:
        priorities = [int(p) for p in priorities]
        if len(priorities) != len(tensors):
            raise ValueError("mlfabric.tensorflow.push: priorities has %d entries for %d tensors "
                             "(one per tensor; lower = sent first)"
                             % (len(priorities), len(tensors)))
    if norm is None:
        norm = tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(tf.cast(t, tf.float32)))
                                 for t in tensors]))
    return _ops.mlfabric_push(tensors, tf.cast(version, tf.int64), tf.cast(norm, tf.float32),
                              tf.constant(priorities, tf.int32), handle=worker.handle,
                              server=server)


def get(worker, server, dtype=tf.float32, priority=0):
    """The server's current model: (version, flat tensor of `dtype`).

    `priority` orders the reply's packets in the server daemon's queue
    among this job's traffic (lower first; 0, the default, is the most
    urgent)."""
    return _ops.mlfabric_get(handle=worker.handle, server=server, T=dtype, priority=priority)


def _executing_eagerly():
    """Horovod's horovod.tensorflow.util._executing_eagerly."""
    return tf.executing_eagerly()


# Horovod's `horovod.tensorflow.util`, for programs (and Horovod's own tests)
# that import from it: `from mlfabric.tensorflow.util import _executing_eagerly`.
util = types.ModuleType(__name__ + ".util", "Horovod's horovod.tensorflow.util helpers.")
util._executing_eagerly = _executing_eagerly
sys.modules[util.__name__] = util
