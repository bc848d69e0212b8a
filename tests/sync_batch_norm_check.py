"""Run in every rank by //tests:sync_batch_norm_test under mlfabric-run (2
ranks, a host each): mlfabric.tensorflow / mlfabric.keras
SyncBatchNormalization against one keras BatchNormalization over the two
ranks' batches concatenated, which every rank computes locally.

For the mpi and the mlfabric AllReduce backends, with batches of different
sizes on the two ranks (3 and 5 rows):
  1. training calls, eagerly and in a tf.function, over two steps: the
     output equals the reference's rows of this rank, the moving mean and
     variance equal the reference's, and the gradients flow as for the
     whole batch: the input gradient is this rank's rows of the reference's,
     and gamma's and beta's, summed over the ranks, are the reference's;
  2. a mask (positions left out of the statistics) as the reference's;
  3. inference (training=False) normalizes with the moving statistics;
  4. in a Keras model trained by model.fit with hvd.DistributedOptimizer,
     every rank ends with the same weights and moving statistics;
  5. get_config/from_config round trip; Horovod's constructor arguments
     are accepted (fused=False, virtual_batch_size=None and adjustment=None,
     which Keras 3 has not, dropped); fused=True, a virtual_batch_size, an
     adjustment and synchronized=True are refused with ValueError.
Prints "sync_batch_norm_check rank R: OK" on success.
"""
import faulthandler
import os
import sys

faulthandler.dump_traceback_later(280, exit=True)  # never hang the test
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras
import mlfabric
import numpy as np
import tensorflow as tf

import mlfabric.keras as hvd_keras
import mlfabric.tensorflow as hvd

failures = []
mlfabric.init(backend="mpi")
rank, size = mlfabric.rank(), mlfabric.size()
assert size == 2, "run with mlfabric-run -np 2"
ROWS = (0, 3, 8)  # rank 0 has rows [0, 3), rank 1 rows [3, 8)
mine = slice(ROWS[rank], ROWS[rank + 1])


def expect(cond, what):
    if not cond:
        failures.append(what)
        print("rank %d: FAILED %s" % (rank, what), file=sys.stderr, flush=True)


def close(a, b, what, tol=2e-5):
    a, b = np.asarray(a), np.asarray(b)
    ok = a.shape == b.shape and np.allclose(a, b, rtol=tol, atol=tol)
    expect(ok, "%s: %s vs %s" % (what, a.ravel()[:6], b.ravel()[:6]))


def raises(fn, exc, text):
    try:
        fn()
    except exc as e:
        expect(text in str(e), "%s names %r: %s" % (exc.__name__, text, e))
        return
    expect(False, "expected %s naming %r" % (exc.__name__, text))


rng = np.random.default_rng(7)
# Channels with different means and scales; the same arrays on every rank.
X = [(rng.normal(size=(8, 2, 3)) * [1.0, 3.0, 0.5] + [2.0, -1.0, 10.0]).astype(np.float32)
     for _ in range(2)]
W = [rng.normal(size=(8, 2, 3)).astype(np.float32) for _ in range(2)]
MASK = rng.random((8, 2)) > 0.3


def step(layer, x, w, mask=None):
    """(output, d loss / d x, [d gamma, d beta]) of one training call, loss
    = sum(output * w)."""
    x = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        out = layer(x, training=True, mask=None if mask is None else tf.convert_to_tensor(mask))
        loss = tf.reduce_sum(out * w)
    dx, dgamma, dbeta = tape.gradient(loss, [x, layer.gamma, layer.beta])
    return out, dx, [dgamma, dbeta]


def compare(backend, red, how, mask=None):
    """Two training steps of a SyncBatchNormalization against the reference."""
    ref = keras.layers.BatchNormalization(momentum=0.8)
    sync = hvd.SyncBatchNormalization(momentum=0.8, reducer=red)
    run = step if how == "eager" else tf.function(step)
    ref_run = step if how == "eager" else tf.function(step)
    tag = "%s %s%s" % (backend, how, " mask" if mask is not None else "")
    ref.build((None, 2, 3))
    sync.build((None, 2, 3))
    for i in range(2):
        m_all = None if mask is None else mask
        m_mine = None if mask is None else mask[mine]
        r_out, r_dx, r_dvars = ref_run(ref, X[i], W[i], m_all)
        s_out, s_dx, s_dvars = run(sync, X[i][mine], W[i][mine], m_mine)
        close(s_out, r_out.numpy()[mine], "%s step %d output" % (tag, i))
        close(s_dx, r_dx.numpy()[mine], "%s step %d input gradient" % (tag, i))
        for name, s, r in zip(("gamma", "beta"), s_dvars, r_dvars):
            close(red.allreduce(s.numpy()), r, "%s step %d %s gradient summed" % (tag, i, name))
        close(sync.moving_mean, ref.moving_mean, "%s step %d moving mean" % (tag, i))
        close(sync.moving_variance, ref.moving_variance, "%s step %d moving variance" % (tag, i))
    # 3. Inference: the moving statistics, no communication.
    close(sync(X[0][mine], training=False), ref(X[0], training=False).numpy()[mine],
          "%s inference" % tag)


def fit(backend, red):
    """4. model.fit with a SyncBatchNormalization and DistributedOptimizer."""
    keras.utils.set_random_seed(1)  # the same initial weights on every rank
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6),
                              hvd_keras.SyncBatchNormalization(reducer=red),
                              keras.layers.Dense(1)])
    opt = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.05), reducer=red)
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    data = np.random.default_rng(rank).normal(size=(16, 4)).astype(np.float32) * (rank + 1)
    model.fit(data, data.sum(axis=1, keepdims=True), batch_size=4, epochs=2, verbose=0,
              shuffle=False)
    flat = np.concatenate([w.ravel() for w in model.get_weights()]).astype(np.float64)
    theirs = red.allreduce(flat) - flat  # the other rank's weights
    close(flat, theirs, "%s fit: weights and moving statistics equal on both ranks" % backend)
    bn = model.layers[1]
    expect(not np.allclose(bn.moving_mean.numpy(), 0.0), "%s fit: moving mean moved" % backend)


for backend in ("mpi", "mlfabric"):
    red = mlfabric.AllReducer(backend=backend)
    for how in ("eager", "tf.function"):
        compare(backend, red, how)
    compare(backend, red, "eager", mask=MASK)
    fit(backend, red)
    red.close()

# 5. Configuration.
layer = hvd_keras.SyncBatchNormalization(momentum=0.7, epsilon=1e-4)
again = keras.layers.deserialize(keras.layers.serialize(layer))
expect(type(again) is hvd.SyncBatchNormalization and again.momentum == 0.7,
       "serialize/deserialize round trip: %r" % (again,))
raises(lambda: hvd.SyncBatchNormalization(fused=True), ValueError, "fused=True")
# Horovod's constructor, every argument at its default: Keras 3 has no fused,
# virtual_batch_size or adjustment, which are dropped at their "off" values
# and refused otherwise.
for module in (hvd, hvd_keras):
    layer = module.SyncBatchNormalization(
        axis=1, momentum=0.9, epsilon=1e-3, center=True, scale=True,
        beta_initializer="zeros", gamma_initializer="ones", moving_mean_initializer="zeros",
        moving_variance_initializer="ones", beta_regularizer=None, gamma_regularizer=None,
        beta_constraint=None, gamma_constraint=None, renorm=False, renorm_clipping=None,
        renorm_momentum=0.99, fused=False, trainable=True, virtual_batch_size=None,
        adjustment=None, name="horovod_args")
    expect(layer.axis == 1 and layer.momentum == 0.9 and layer.name == "horovod_args",
           "Horovod's constructor arguments: %r" % (layer.get_config(),))
    raises(lambda: module.SyncBatchNormalization(virtual_batch_size=4), ValueError,
           "virtual_batch_size=4 is not supported")
    raises(lambda: module.SyncBatchNormalization(adjustment=lambda shape: (1.0, 0.0)),
           ValueError, "adjustment is not supported")
raises(lambda: hvd.SyncBatchNormalization(synchronized=True), ValueError, "synchronized=True")

failed = len(failures)
total = mlfabric.allreduce(np.array([failed], np.int64))
if total[0] == 0:
    print("sync_batch_norm_check rank %d: OK" % rank, flush=True)
mlfabric.shutdown()
sys.exit(0 if total[0] == 0 else 1)
