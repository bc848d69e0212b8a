"""TensorFlow ops: MlfabricAllreduce, MlfabricPush, MlfabricGet.

    import mlfabric, mlfabric.tensorflow as mtf
    mlfabric.init()
    g = mtf.allreduce(grad, average=True)        # differentiable
    mtf.broadcast_variables(model.variables, root=0)
    outcome, version, delay = mtf.push(worker, "ps0", [w0, b0, w1], version)  # priorities 0, 1, 2
    version, flat = mtf.get(worker, "ps0")

The kernels are asynchronous and only forward into the C++ core; calls on one
AllReducer run in call order, so every rank must issue the same sequence.
"""
import tensorflow as tf

import mlfabric
from mlfabric import _lib

_lib.load_core()
_ops = tf.load_op_library(_lib.find("mlfabric_tf_ops.so"))

_SUPPORTED = (tf.float32, tf.float64, tf.int32, tf.int64)


def _check_dtype(tensor):
    if tensor.dtype not in _SUPPORTED:
        raise TypeError("mlfabric: unsupported dtype %s; use float32, float64, int32 or int64"
                        % tensor.dtype.name)


def allreduce(tensor, average=False, reducer=None):
    """Sum (or mean) of `tensor` over all ranks."""
    reducer = reducer or mlfabric.reducer()
    tensor = tf.convert_to_tensor(tensor)
    _check_dtype(tensor)
    total = _ops.mlfabric_allreduce(tensor, handle=reducer.handle)
    if average:
        total = total / tf.cast(reducer.size, total.dtype)
    return total


@tf.RegisterGradient("MlfabricAllreduce")
def _allreduce_grad(op, grad):
    # d(sum_r x_r)/dx_r = 1: the gradient of the sum is the sum of the gradients.
    return _ops.mlfabric_allreduce(grad, handle=op.get_attr("handle"))


def allreduce_list(tensors, average=False, reducer=None):
    """One fused AllReduce for a list of tensors (None entries pass through)."""
    present = [t for t in tensors if t is not None]
    if not present:
        return list(tensors)
    dtype = present[0].dtype
    flat = tf.concat([tf.reshape(tf.cast(t, dtype), [-1]) for t in present], axis=0)
    total = allreduce(flat, average=average, reducer=reducer)
    sizes = [tf.size(t) for t in present]
    parts = tf.split(total, sizes)
    out, i = [], 0
    for t in tensors:
        if t is None:
            out.append(None)
        else:
            out.append(tf.cast(tf.reshape(parts[i], tf.shape(t)), t.dtype))
            i += 1
    return out


def broadcast_variables(variables, root=0, reducer=None):
    """Sets every variable to its value on rank `root`."""
    reducer = reducer or mlfabric.reducer()
    variables = list(variables)
    for v in variables:
        value = tf.convert_to_tensor(v)
        _check_dtype(value)
        mine = value if reducer.rank == root else tf.zeros_like(value)
        v.assign(_ops.mlfabric_allreduce(mine, handle=reducer.handle))


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
        _check_dtype(t)
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
