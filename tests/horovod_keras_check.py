"""A Horovod-style Keras program: run under mlfabric-run by
tests/horovod_keras_test.sh, once per import order (CHECK_IMPORT_ORDER =
tensorflow-first | mlfabric-first). Only the import line differs from a
Horovod program. Checks, on every rank:
  1. model.fit with hvd.DistributedOptimizer (fp16 compression, momentum),
     BroadcastGlobalVariablesCallback, MetricAverageCallback and the two
     learning-rate callbacks: identical weights and metrics on every rank,
     the warm-up and schedule's learning rates batch by batch;
  2. backward_passes_per_step=2: nothing applied after the first pass, then
     the sum (or mean) of both passes averaged over ranks;
  3. a custom loop with hvd.DistributedGradientTape matches single-process
     training on the combined batch;
  4. allreduce (Average, Sum, fp16), allgather, broadcast, and bad input;
  5. backup workers: every rank applies the same sum of size - 1 gradients.
Prints "horovod_keras_check rank R: OK".
"""
import os
import sys

ORDER = os.environ.get("CHECK_IMPORT_ORDER", "tensorflow-first")
if ORDER == "tensorflow-first":
    import tensorflow as tf
    import keras
    import mlfabric.keras as hvd
elif ORDER == "mlfabric-first":
    import mlfabric.keras as hvd
    import tensorflow as tf
    import keras
else:
    sys.exit("CHECK_IMPORT_ORDER must be tensorflow-first or mlfabric-first, not %r" % ORDER)
import numpy as np

import mlfabric
import mlfabric.tensorflow as hvd_tf

hvd.init()
rank, size = hvd.rank(), hvd.size()
failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)
        print("rank %d: FAILED %s" % (rank, what), flush=True)


def same_on_all_ranks(values, what):
    """True when `values` (a flat float array) is bit-identical to rank 0's."""
    values = np.asarray(values, np.float64).ravel()
    root = hvd.broadcast(values, root_rank=0).numpy()
    differs = hvd.allreduce(np.array([float(not np.array_equal(values, root))]), op=hvd.Sum)
    expect(float(differs.numpy()[0]) == 0, "%s identical on every rank" % what)


def flat(variables):
    return np.concatenate([np.asarray(v).ravel() for v in variables])


print("horovod_keras_check rank %d: import order %s, backend %s, local %d/%d"
      % (rank, ORDER, mlfabric.reducer().backend, hvd.local_rank(), hvd.local_size()), flush=True)
expect(hvd.is_initialized(), "is_initialized")
expect(0 <= hvd.local_rank() < hvd.local_size() <= size, "local_rank < local_size <= size")
# mlfabric-run --ranks_per_host K: the mlfabric backend sums among the
# ranks of one host in shared memory (they are K here: size <= K).
per_host = int(os.environ.get("MLFABRIC_RANKS_PER_HOST", "1"))
if mlfabric.reducer().backend == "mlfabric":
    expect(mlfabric.reducer().local_size == min(per_host, size),
           "reducer local_size %d, expected %d" % (mlfabric.reducer().local_size,
                                                   min(per_host, size)))

# ---- 1. model.fit, written as for Horovod.
data = np.random.RandomState(0)
x_all = data.normal(size=(256, 8)).astype(np.float32)
y_all = (x_all @ data.normal(size=(8, 1)) + 0.1).astype(np.float32)
x, y = x_all[rank::size], y_all[rank::size]
keras.utils.set_random_seed(100 + rank)  # different initial weights: the callback must fix that
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(1)])
initial_lr = 0.02 * size
opt = hvd.DistributedOptimizer(keras.optimizers.SGD(initial_lr, momentum=0.5),
                               compression=hvd.Compression.fp16)
model.compile(optimizer=opt, loss="mse", jit_compile=False)
seen_lr = []


class RecordLr(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        seen_lr.append(float(self.model.optimizer.learning_rate))


batch_size, epochs, warmup = 16, 4, 2
steps = len(x) // batch_size
history = model.fit(
    x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0,
    callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
               hvd.callbacks.MetricAverageCallback(),
               hvd.callbacks.LearningRateWarmupCallback(initial_lr=initial_lr,
                                                        warmup_epochs=warmup, verbose=1),
               hvd.callbacks.LearningRateScheduleCallback(initial_lr=initial_lr, multiplier=0.5,
                                                          start_epoch=3),
               RecordLr()])
same_on_all_ranks(flat(model.get_weights()), "weights after fit")
same_on_all_ranks(history.history["loss"], "averaged loss")
losses = history.history["loss"]
expect(losses[-1] < 0.5 * losses[0], "fit reduces the loss: %s" % losses)
# Horovod's warm-up: lr = initial_lr / size * (e * (size - 1) / warmup + 1),
# e = epoch + batch / steps; then the schedule's 0.5 from epoch 3.
expected_lr = [initial_lr / size * ((epoch + batch / steps) * (size - 1) / warmup + 1)
               for epoch in range(warmup) for batch in range(steps)]
expect(len(seen_lr) == epochs * steps, "one learning rate per batch (%d)" % len(seen_lr))
expect(np.allclose(seen_lr[:warmup * steps], expected_lr[:warmup * steps], rtol=1e-6),
       "warm-up learning rates %s" % seen_lr[:warmup * steps])
expect(abs(seen_lr[0] - initial_lr / size) < 1e-9, "warm-up starts at initial_lr / size")
expect(np.allclose(seen_lr[warmup * steps:3 * steps], expected_lr[-1]),
       "after the warm-up the learning rate stays until the schedule starts")
expect(np.allclose(seen_lr[3 * steps:], initial_lr * 0.5), "schedule's multiplier from epoch 3")
expect("learning_rate" in history.history, "the learning rate is logged")

# ---- 2. backward_passes_per_step: accumulate locally, communicate once.
def linear_model():
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, use_bias=False,
                                                                kernel_initializer="ones")])
    return m


def passes(r):
    g = np.random.RandomState(10 + r)
    return [(g.normal(size=(4, 3)).astype(np.float32), g.normal(size=(4, 1)).astype(np.float32))
            for _ in range(2)]


def local_gradient(xb, yb):
    w = tf.Variable(tf.ones([3, 1]))
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(tf.matmul(xb, w) - yb))
    return tape.gradient(loss, w).numpy()


lr = 0.1
for average_aggregated in (False, True):
    m = linear_model()
    m.compile(optimizer=hvd.DistributedOptimizer(
        keras.optimizers.SGD(lr), backward_passes_per_step=2,
        average_aggregated_gradients=average_aggregated), loss="mse", jit_compile=False)
    mine = passes(rank)
    m.train_on_batch(*mine[0])
    expect(np.array_equal(m.get_weights()[0], np.ones((3, 1), np.float32)),
           "no update after the first of two passes")
    m.train_on_batch(*mine[1])
    # Both passes start from w = 1 (nothing applied in between).
    total = sum(local_gradient(*p) for r in range(size) for p in passes(r)) / size
    if average_aggregated:
        total = total / 2
    expect(np.allclose(m.get_weights()[0], 1 - lr * total, atol=1e-5),
           "backward_passes_per_step=2 (average_aggregated_gradients=%s): %s vs %s"
           % (average_aggregated, m.get_weights()[0].ravel(), (1 - lr * total).ravel()))

# ---- 3. DistributedGradientTape == single-process training on the combined batch.
def small_model():
    keras.utils.set_random_seed(7)  # same on every rank and for the reference
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="tanh"),
                             keras.layers.Dense(1)])


distributed, reference = small_model(), small_model()
opt_d, opt_r = keras.optimizers.SGD(0.05), keras.optimizers.SGD(0.05)
for step in range(5):
    xb, yb = x_all[step * 32:(step + 1) * 32], y_all[step * 32:(step + 1) * 32]
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(distributed(xb[rank::size]) - yb[rank::size]))
    tape = hvd_tf.DistributedGradientTape(tape)
    grads = tape.gradient(loss, distributed.trainable_variables)
    opt_d.apply(grads, distributed.trainable_variables)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(reference(xb) - yb))
    opt_r.apply(tape.gradient(loss, reference.trainable_variables), reference.trainable_variables)
gap = np.max(np.abs(flat(distributed.get_weights()) - flat(reference.get_weights())))
expect(gap < 1e-5, "DistributedGradientTape matches the combined batch (max gap %.2g)" % gap)

# ---- 4. collectives and bad input.
value = tf.constant([float(rank), 1.0])
expect(np.allclose(hvd.allreduce(value).numpy(), [(size - 1) / 2, 1.0]), "allreduce averages")
expect(np.allclose(hvd.allreduce(value, op=hvd.Sum).numpy(), [size * (size - 1) / 2, size]),
       "op=Sum sums")
expect(np.allclose(hvd.allreduce(value, average=False).numpy(), [size * (size - 1) / 2, size]),
       "average=False sums")
half = hvd_tf.allreduce(tf.fill([1000], 0.1), compression=hvd.Compression.fp16)
expect(half.dtype == tf.float32 and np.allclose(half.numpy(), 0.1, rtol=1e-3),
       "fp16 compression: float32 out, half precision")
gathered = hvd.allgather(tf.fill([rank + 1, 2], float(rank))).numpy()
want = np.concatenate([np.full((r + 1, 2), float(r)) for r in range(size)])
expect(gathered.shape == want.shape and np.array_equal(gathered, want), "allgather in rank order")
expect(hvd.broadcast(tf.constant([rank]), root_rank=size - 1).numpy()[0] == size - 1, "broadcast")
for bad, name in ((lambda: hvd_tf.allreduce(value, op=hvd_tf.Adasum), "Adasum"),
                  (lambda: hvd_tf.allreduce(value, average=True, op=hvd.Sum), "both"),
                  (lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                                    backward_passes_per_step=0), ">= 1"),
                  (lambda: hvd.broadcast(value, root_rank=size), "not a rank")):
    try:
        bad()
        expect(False, "%s raises" % name)
    except ValueError as e:
        expect(name in str(e), "error names %s: %s" % (name, e))

# ---- 5. backup workers (MLfabric's): each step sums the first size - 1
# ranks' gradients; a late rank applies that same sum.
backup = mlfabric.backup_reducer(1)
expect(backup.summed == size - 1, "backup reducer sums size - 1 (%d)" % backup.summed)
for step in range(3):
    m = linear_model()
    m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(lr), backup_workers=1),
              loss="mse", jit_compile=False)
    m.train_on_batch(*passes(rank)[0])
    w = m.get_weights()[0]
    same_on_all_ranks(w, "weights with a backup worker (step %d)" % step)
    if size == 2:  # the one gradient summed is rank 0's or rank 1's, not their mean
        candidates = [1 - lr * local_gradient(*passes(r)[0]) for r in range(size)]
        expect(any(np.allclose(w, c, atol=1e-5) for c in candidates),
               "backup_workers=1 applies one rank's gradient: %s" % w.ravel())

hvd.allreduce(tf.zeros([1]))  # every rank is done before any leaves
hvd.shutdown()
expect(not hvd.is_initialized(), "shutdown")
if failures:
    sys.exit("horovod_keras_check rank %d: %d failures" % (rank, len(failures)))
print("horovod_keras_check rank %d: OK" % rank, flush=True)
