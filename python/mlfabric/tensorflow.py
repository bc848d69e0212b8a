"""TensorFlow ops and Horovod's `horovod.tensorflow` API.

A Horovod TensorFlow program runs with its import line changed
(`import horovod.tensorflow as hvd` -> `import mlfabric.tensorflow as hvd`)
under `mlfabric-run` (python/README.md lists where we differ):

    hvd.init()
    print(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size())
    g = hvd.allreduce(grad)                      # average over ranks (op=hvd.Sum: sum)
    tape = hvd.DistributedGradientTape(tape)     # tape.gradient() averages over ranks
    hvd.broadcast_variables(model.variables, root_rank=0)

MLfabric's own ops (parameter-server push/get from TensorFlow):

    outcome, version, delay = hvd.push(worker, "ps0", [w0, b0, w1], version)  # priorities 0, 1, 2
    version, flat = hvd.get(worker, "ps0")

The kernels are asynchronous and only forward into the C++ core; calls on one
AllReducer run in call order, so every rank must issue the same sequence.
"""
import numpy as np
import tensorflow as tf

import mlfabric
from mlfabric import _lib
from mlfabric import compression as _compression
from mlfabric import init, is_initialized, local_rank, local_size, rank, shutdown, size  # noqa: F401

_lib.load_core()
_ops = tf.load_op_library(_lib.find("mlfabric_tf_ops.so"))

_COLLECTIVE_TYPES = (tf.float16, tf.float32, tf.float64, tf.int32, tf.int64)
_PUSH_TYPES = (tf.float32, tf.float64, tf.int32, tf.int64)

Compression = _compression.Compression

# Reduction ops, as in Horovod (hvd.Average, hvd.Sum, hvd.Adasum).
Average = "average"
Sum = "sum"
Adasum = "adasum"


def _check_dtype(tensor):
    if tensor.dtype not in _COLLECTIVE_TYPES:
        raise TypeError("mlfabric: unsupported dtype %s; collectives take float16, float32, "
                        "float64, int32 or int64" % tensor.dtype.name)


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
        raise ValueError("%s: op=Adasum is not supported by MLfabric; use hvd.Average or hvd.Sum"
                         % where)
    if op not in (Average, Sum):
        raise ValueError("%s: unknown op %r; use hvd.Average or hvd.Sum" % (where, op))
    return op


def _sum(tensor, reducer):
    tensor = tf.convert_to_tensor(tensor)
    _check_dtype(tensor)
    return _ops.mlfabric_allreduce(tensor, handle=reducer.handle)


def allreduce(tensor, average=None, device_dense="", device_sparse="",
              compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, name=None, reducer=None):
    """The average (default, or op=Average) or sum (op=Sum) of `tensor` over
    all ranks, as Horovod's `hvd.allreduce`. Differentiable: the gradient of
    the result is the allreduce of the gradient. `compression` is applied to
    what crosses the network (Compression.fp16: float32/64 travel as
    float16). `device_*` are accepted and ignored (CPU tensors)."""
    del device_dense, device_sparse, name
    op = _resolve_op(average, op, "mlfabric.tensorflow.allreduce")
    reducer = reducer or mlfabric.reducer()
    tensor = tf.convert_to_tensor(tensor)  # IndexedSlices become dense
    _check_dtype(tensor)
    if prescale_factor != 1.0:
        tensor = tensor * tf.cast(prescale_factor, tensor.dtype)
    wire, ctx = compression.compress(tensor)
    total = compression.decompress(_sum(wire, reducer), ctx)
    if op == Average:
        # Over the contributions actually summed (backup workers leave the
        # latest out: reducer.summed < reducer.size).
        total = total / tf.cast(reducer.summed, total.dtype)
    if postscale_factor != 1.0:
        total = total * tf.cast(postscale_factor, total.dtype)
    return total


@tf.RegisterGradient("MlfabricAllreduce")
def _allreduce_grad(op, grad):
    # d(sum_r x_r)/dx_r = 1: the gradient of the sum is the sum of the gradients.
    return _ops.mlfabric_allreduce(grad, handle=op.get_attr("handle"))


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


def grouped_allreduce(tensors, average=None, compression=Compression.none, op=None,
                      reducer=None, fusion_threshold_bytes=None):
    """The allreduce of each tensor of a list (None entries pass through),
    fused as Horovod's tensor fusion: one AllReduce per dtype for up to
    `fusion_threshold_bytes` (default: fusion_threshold(), from
    MLFABRIC_FUSION_THRESHOLD) of consecutive tensors, each packed into one
    flat buffer, summed, and unpacked. Each element is summed over the same
    ranks as without fusion (the sum is element-wise), and every dtype keeps
    its own precision. The fused AllReduces run one after another in bucket
    order, the same on every rank."""
    op = _resolve_op(average, op, "mlfabric.tensorflow.grouped_allreduce")
    threshold = fusion_threshold() if fusion_threshold_bytes is None else int(
        fusion_threshold_bytes)
    if threshold < 0:
        raise ValueError("mlfabric.tensorflow.grouped_allreduce: fusion_threshold_bytes must be "
                         ">= 0, got %d" % threshold)
    positions = [i for i, t in enumerate(tensors) if t is not None]
    present = [tf.convert_to_tensor(tensors[i]) for i in positions]
    if not present:
        return list(tensors)
    # bfloat16 has no AllReduce of its own: it travels as float32 (exact)
    # and is rounded back once, as the single-buffer fusion always did.
    wire = [tf.cast(t, tf.float32) if t.dtype == tf.bfloat16 else t for t in present]
    for t in wire:
        _check_dtype(t)
    reduced = [None] * len(present)
    previous = []
    for bucket in _fusion_buckets(wire, threshold):
        # A control dependency on the previous bucket's sum: in a graph the
        # AllReduce ops would otherwise be independent and could run in a
        # different order on different ranks (calls on one AllReducer must
        # come in the same order everywhere).
        with tf.control_dependencies(previous):
            parts = [wire[i] for i in bucket]
            if len(parts) == 1:
                flat = tf.reshape(parts[0], [-1])
            else:
                flat = tf.concat([tf.reshape(t, [-1]) for t in parts], axis=0)
            total = allreduce(flat, op=op, compression=compression, reducer=reducer)
        previous = [total]
        sizes = [tf.size(t) for t in parts]
        pieces = [total] if len(parts) == 1 else tf.split(total, sizes)
        for i, piece in zip(bucket, pieces):
            # (op=Average of an integer tensor divides into floats: cast back.)
            reduced[i] = tf.cast(tf.reshape(piece, tf.shape(present[i])), present[i].dtype)
    out = list(tensors)
    for i, r in zip(positions, reduced):
        out[i] = r
    return out


def allreduce_list(tensors, average=False, reducer=None, compression=Compression.none):
    """MLfabric's name for grouped_allreduce (sum unless average=True)."""
    return grouped_allreduce(tensors, op=Average if average else Sum, reducer=reducer,
                             compression=compression)


def allgather(tensor, name=None, reducer=None):
    """Concatenates every rank's `tensor` along the first dimension, in rank
    order (as Horovod's `hvd.allgather`; first dimensions may differ, the
    others must match). Built on the AllReduce: one small AllReduce of the
    first dimensions, then one of a zero-filled buffer holding each rank's
    rows at its offset (the sum of one value and zeros is that value)."""
    del name
    reducer = reducer or mlfabric.reducer()
    tensor = tf.convert_to_tensor(tensor)
    _check_dtype(tensor)
    if tensor.shape.rank == 0:
        tensor = tf.reshape(tensor, [1])
    rows = np.zeros(reducer.size, np.int64)
    rows[reducer.rank] = int(tensor.shape[0])
    rows = np.asarray(_sum(tf.constant(rows), reducer))
    inner = tensor.shape[1:]
    before, total = int(rows[:reducer.rank].sum()), int(rows.sum())
    padded = tf.concat([tf.zeros([before] + inner.as_list(), tensor.dtype), tensor,
                        tf.zeros([total - before - int(tensor.shape[0])] + inner.as_list(),
                                 tensor.dtype)], axis=0)
    return _sum(padded, reducer)


def broadcast(tensor, root_rank=0, name=None, reducer=None):
    """Rank `root_rank`'s value of `tensor` on every rank."""
    del name
    reducer = reducer or mlfabric.reducer()
    if not 0 <= root_rank < reducer.size:
        raise ValueError("mlfabric.tensorflow.broadcast: root_rank %d is not a rank (size %d)"
                         % (root_rank, reducer.size))
    value = tf.convert_to_tensor(tensor)
    _check_dtype(value)
    mine = value if reducer.rank == root_rank else tf.zeros_like(value)
    return _ops.mlfabric_allreduce(mine, handle=reducer.handle)


def broadcast_variables(variables, root_rank=0, reducer=None, root=None):
    """Sets every variable to its value on rank `root_rank`."""
    if root is not None:  # MLfabric's earlier keyword
        root_rank = root
    for v in list(variables):
        v.assign(broadcast(v, root_rank, reducer=reducer))


class _DistributedGradientTape:
    """Wraps a tf.GradientTape: gradient() returns the gradients averaged
    (or summed) over all ranks, fused (grouped_allreduce)."""

    def __init__(self, tape, compression, op, reducer):
        self._tape = tape
        self._compression = compression
        self._op = op
        self._reducer = reducer

    def gradient(self, target, sources, output_gradients=None, **kwargs):
        grads = self._tape.gradient(target, sources, output_gradients, **kwargs)
        flat = tf.nest.flatten(grads)
        dense = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in flat]
        reduced = grouped_allreduce(dense, op=self._op, compression=self._compression,
                                    reducer=self._reducer)
        return tf.nest.pack_sequence_as(grads, reduced)

    def __getattr__(self, name):
        return getattr(self._tape, name)

    def __enter__(self):
        self._tape.__enter__()
        return self

    def __exit__(self, *exc):
        return self._tape.__exit__(*exc)


def DistributedGradientTape(gradtape, device_dense="", device_sparse="",
                            compression=Compression.none, sparse_as_dense=False,
                            op=Average, gradient_predivide_factor=1.0, num_groups=0,
                            reducer=None):
    """Horovod's DistributedGradientTape: `tape.gradient(loss, vars)` returns
    the gradients averaged over ranks (op=Sum: summed). Sparse gradients are
    reduced as dense tensors; `num_groups` is ignored (fusion is by dtype and
    MLFABRIC_FUSION_THRESHOLD, grouped_allreduce)."""
    del device_dense, device_sparse, sparse_as_dense, num_groups
    op = _resolve_op(None, op, "mlfabric.tensorflow.DistributedGradientTape")
    if gradient_predivide_factor != 1.0:
        raise ValueError("mlfabric: gradient_predivide_factor is not supported (use 1.0)")
    return _DistributedGradientTape(gradtape, compression, op, reducer)


def _keras_distributed_optimizer(optimizer, name=None, device_dense="", device_sparse="",
                                 compression=Compression.none, sparse_as_dense=False,
                                 gradient_predivide_factor=1.0, op=Average,
                                 backward_passes_per_step=1, average_aggregated_gradients=False,
                                 num_groups=0, groups=None, reducer=None, average=None,
                                 backup_workers=0):
    """mlfabric.keras.DistributedOptimizer (see there), here so that both
    mlfabric.keras and this module's DistributedOptimizer use it without
    this module importing mlfabric.keras."""
    del device_dense, device_sparse, sparse_as_dense, num_groups, groups
    if average is not None:
        op = Average if average else Sum
    op = _resolve_op(None, op, "mlfabric.keras.DistributedOptimizer")
    if gradient_predivide_factor != 1.0:
        raise ValueError("mlfabric: gradient_predivide_factor is not supported (use 1.0)")
    passes = int(backward_passes_per_step)
    if passes < 1:
        raise ValueError("mlfabric.keras.DistributedOptimizer: backward_passes_per_step must be "
                         ">= 1, got %r" % (backward_passes_per_step,))
    if backup_workers:
        if reducer is not None:
            raise ValueError("mlfabric.keras.DistributedOptimizer: give reducer or backup_workers, "
                             "not both")
        reducer = mlfabric.backup_reducer(backup_workers)
    if getattr(optimizer, "gradient_accumulation_steps", None):
        raise ValueError("mlfabric.keras.DistributedOptimizer: the optimizer already accumulates "
                         "gradients (gradient_accumulation_steps); use backward_passes_per_step")
    base = type(optimizer)

    class _Distributed(base):
        # Keras 3 calls _clip_gradients exactly once per variable update,
        # with the (accumulated, averaged) gradients, before clipping and
        # the update step: the one place where every rank's gradients must
        # be combined. It is a private hook; tests/horovod_keras_check.py
        # fails if a Keras upgrade moves it.
        def _clip_gradients(self, grads):
            if passes > 1 and not average_aggregated_gradients:
                # Keras averages the N accumulated passes; Horovod sums them.
                grads = [None if g is None else g * passes for g in grads]
            grads = grouped_allreduce(list(grads), op=op, compression=compression,
                                      reducer=reducer or mlfabric.reducer())
            return super()._clip_gradients(grads)

    _Distributed.__name__ = "Distributed" + base.__name__
    config = optimizer.get_config()
    if passes > 1:
        config["gradient_accumulation_steps"] = passes
    if name is not None:
        config["name"] = name
    return _Distributed.from_config(config)


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False,
                         backward_passes_per_step=1, op=Average,
                         average_aggregated_gradients=False, **kwargs):
    """Horovod's DistributedOptimizer for a Keras 3 optimizer (the same as
    mlfabric.keras.DistributedOptimizer)."""
    return _keras_distributed_optimizer(
        optimizer, name=name, compression=compression,
        backward_passes_per_step=backward_passes_per_step, op=op,
        average_aggregated_gradients=average_aggregated_gradients, **kwargs)


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
