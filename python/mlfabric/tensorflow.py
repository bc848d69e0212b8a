"""TensorFlow ops: MlfabricAllreduce, MlfabricPush, MlfabricGet.

    import mlfabric, mlfabric.tensorflow as mtf
    mlfabric.init()
    g = mtf.allreduce(grad, average=True)        # differentiable
    mtf.broadcast_variables(model.variables, root=0)
    outcome, version, delay = mtf.push(worker, "ps0", update, version, norm)
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


def push(worker, server, update, version, norm=None):
    """Pushes `update`; returns (outcome, applied_version, delay) tensors:
    outcome 0 = applied, 1 = dropped. A failed push raises."""
    update = tf.convert_to_tensor(update)
    _check_dtype(update)
    if norm is None:
        norm = tf.norm(tf.cast(update, tf.float32))
    return _ops.mlfabric_push(update, tf.cast(version, tf.int64), tf.cast(norm, tf.float32),
                              handle=worker.handle, server=server)


def get(worker, server, dtype=tf.float32):
    """The server's current model: (version, flat tensor of `dtype`)."""
    return _ops.mlfabric_get(handle=worker.handle, server=server, T=dtype)
