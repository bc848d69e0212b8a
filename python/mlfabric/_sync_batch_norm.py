"""SyncBatchNormalization: Keras batch normalization whose training-time
batch statistics are those of every rank's batch together (Horovod's
hvd.SyncBatchNormalization), exposed as mlfabric.tensorflow and
mlfabric.keras SyncBatchNormalization."""
import keras
import tensorflow as tf

import mlfabric


@keras.saving.register_keras_serializable(package="mlfabric")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """keras.layers.BatchNormalization whose training-time mean and variance
    are computed over the batches of all ranks, as if they were one batch:
    each rank computes its count, mean and centred second moment per
    channel, one AllReduce (in float64) combines them over the ranks, and
    every rank normalizes with the whole batch's mean and (biased)
    variance, and updates its moving statistics with them, so they stay
    equal on every rank. Batches may differ in size across ranks: each
    rank's rows weigh by their count (Horovod averages the ranks' means,
    which equals this only for equal batch sizes). Masks are honoured (masked-out positions
    count nowhere). Gradients flow through the AllReduce (its gradient is
    the AllReduce of the upstream gradients), so each rank's input gradient
    is its rows of the gradient of the whole batch's loss.

    Every rank must call the layer the same number of times in the same
    order (it issues one AllReduce per training call); inference uses the
    moving statistics and communicates nothing. On one rank it is
    BatchNormalization.

    Takes Horovod's constructor arguments (those of TF2's Keras 2
    BatchNormalization). Three of them Keras 3 no longer has; they are
    accepted at the values that mean "off" and dropped: `fused` (None or
    False; Keras 3 has no fused kernel), `virtual_batch_size` (None: the
    statistics of the whole batch) and `adjustment` (None: no random
    adjustment of the normalised values). Another value raises ValueError
    naming the argument rather than being silently ignored. `renorm`,
    `renorm_clipping`, `renorm_momentum`, `trainable` and `name` go to Keras
    3's BatchNormalization, which has them. `synchronized=True`
    (tf.distribute's) is refused. `reducer`: the AllReducer (default:
    mlfabric.init()'s)."""

    # The Sum allreduce with its gradient, (tensor, reducer) -> tensor. This
    # module sits below mlfabric.tensorflow in the package's layer order
    # (tools/layering), so mlfabric.tensorflow sets it when it hands the
    # class out.
    _sum_over_ranks = None

    def __init__(self, fused=None, virtual_batch_size=None, adjustment=None, reducer=None,
                 **kwargs):
        if fused:
            raise ValueError("SyncBatchNormalization: fused=True is not supported (Keras 3 "
                             "has no fused batch normalization)")
        if virtual_batch_size is not None:
            raise ValueError("SyncBatchNormalization: virtual_batch_size=%r is not supported "
                             "(Keras 3's BatchNormalization has no ghost batches; leave it "
                             "None)" % (virtual_batch_size,))
        if adjustment is not None:
            raise ValueError("SyncBatchNormalization: adjustment is not supported (Keras 3's "
                             "BatchNormalization has none; leave it None)")
        if kwargs.get("synchronized"):
            raise ValueError("SyncBatchNormalization: synchronized=True is tf.distribute's "
                             "synchronization; this layer synchronizes through MLfabric "
                             "(leave synchronized=False)")
        super().__init__(**kwargs)
        self._mlfabric_reducer = reducer

    def _moments(self, inputs, mask):
        reducer = self._mlfabric_reducer or mlfabric.reducer()
        if reducer.size == 1:
            return super()._moments(inputs, mask)
        axes = self._reduction_axes
        if mask is None:
            weights = tf.ones_like(inputs)
        else:
            weights = tf.cast(tf.broadcast_to(tf.expand_dims(mask, -1), tf.shape(inputs)),
                              inputs.dtype)
        # This rank's count, mean and centred second moment, two passes as
        # Keras computes them (no cancellation) ...
        count = tf.reduce_sum(weights, axes)
        mean = tf.math.divide_no_nan(tf.reduce_sum(inputs * weights, axes), count)
        m2 = tf.reduce_sum(tf.square(inputs - mean) * weights, axes)
        # ... combined over the ranks in float64 (Chan, Golub and LeVeque's
        # pairwise update): sum(n_r c_r), sum(M2_r + n_r c_r^2), sum(n_r) in
        # one AllReduce; the variance is sum(M2_r + n_r c_r^2) / n - mean^2,
        # whose cancellation float64 absorbs for float32 data far from 0.
        count, mean, m2 = (tf.cast(t, tf.float64) for t in (count, mean, m2))
        stats = tf.stack([count * mean, m2 + count * tf.square(mean), count])
        sum_over_ranks = type(self)._sum_over_ranks
        if sum_over_ranks is None:
            raise RuntimeError("SyncBatchNormalization: take it from mlfabric.tensorflow or "
                               "mlfabric.keras, which give it their allreduce")
        total, total_sq, count = tf.unstack(sum_over_ranks(stats, reducer))
        mean = tf.math.divide_no_nan(total, count)
        # Rounding can leave a variance a hair below 0.
        variance = tf.maximum(tf.math.divide_no_nan(total_sq, count) - tf.square(mean), 0.0)
        return tf.cast(mean, inputs.dtype), tf.cast(variance, inputs.dtype)
