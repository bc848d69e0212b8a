"""Gradient compression for the AllReduce, as Horovod's `hvd.Compression`.

`Compression.none` sends tensors as they are; `Compression.fp16` sends
float32 and float64 tensors as float16 (half the bytes of float32) and
casts the result back: the daemons and MPI sum the float16 values, each
addition rounded to float16 (docs/user-guide/horovod.md).
Other dtypes pass through unchanged.
"""
import tensorflow as tf


class NoneCompressor:
    """Leaves tensors as they are."""

    @staticmethod
    def compress(tensor):
        """Returns (tensor, None): nothing to undo."""
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        """Returns the tensor as it is."""
        return tensor


class FP16Compressor:
    """Sends floating-point tensors as float16."""

    @staticmethod
    def compress(tensor):
        """Returns (tensor as float16, its dtype) for a wider floating-point
        tensor, else (tensor, None)."""
        if tensor.dtype.is_floating and tensor.dtype != tf.float16:
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        """Casts the tensor back to the dtype compress() recorded in ctx."""
        return tensor if ctx is None else tf.cast(tensor, ctx)


class Compression:
    """Horovod's names: Compression.none, Compression.fp16."""
    none = NoneCompressor
    fp16 = FP16Compressor
