"""Run in every rank by tests/keras_mlfabric_test.sh under mlfabric-run (3 ranks).

One TensorFlow import per process covers all Python checks:
  1. sync: Keras DistributedOptimizer over the mlfabric AllReduce backend ends
     with bit-identical weights on every rank and matches single-process
     training on the combined batch (rank 0 trains the reference);
  2. bad input: shapes/dtypes that differ across ranks, unsupported dtypes,
     an unregistered server -> clear Python exceptions, nothing hangs;
  3. TF ops MlfabricPush/MlfabricGet against an in-process SumServer: exact sums;
  4. async PS on scikit-learn's digits: test accuracy, dropped updates, delays.
Prints "keras_check rank R: OK" on success; rank 0 prints the figures.
"""
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import mlfabric  # this order; tests/horovod_keras_check.py runs both
import numpy as np
import tensorflow as tf
import keras

import mlfabric.keras as mk
import mlfabric.tensorflow as mtf

failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)
        print("rank %d: FAILED %s" % (mlfabric.rank(), what), file=sys.stderr, flush=True)


def flat_weights(model):
    return np.concatenate([w.ravel() for w in model.get_weights()]).astype(np.float32)


def barrier():
    mlfabric.allreduce(np.zeros(1, np.float32))


reducer = mlfabric.init(backend=os.environ.get("CHECK_BACKEND", "mlfabric"))
rank, size = mlfabric.rank(), mlfabric.size()
expect(reducer.backend == os.environ.get("CHECK_BACKEND", "mlfabric"), "backend name")
t0 = time.time()

# ---- 1. synchronous DistributedOptimizer
rows, features, epochs, lr = 16, 8, 5, 0.1
rng = np.random.default_rng(0)
X = rng.normal(size=(rows * size, features)).astype(np.float32)
Y = (X @ rng.normal(size=(features, 1)) + 0.1 * rng.normal(size=(rows * size, 1))).astype(np.float32)
shard = slice(rank * rows, (rank + 1) * rows)


def make_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((features,)), keras.layers.Dense(4, activation="tanh"),
                             keras.layers.Dense(1)])


model = make_model(100 + rank)  # different starting points: the broadcast must fix them
initial_root = mlfabric.broadcast(flat_weights(model), root=0)
model.compile(optimizer=mk.DistributedOptimizer(keras.optimizers.SGD(lr)), loss="mse",
              jit_compile=False)
history = model.fit(X[shard], Y[shard], batch_size=rows, epochs=epochs, shuffle=False, verbose=0,
                    callbacks=[mk.BroadcastGlobalVariablesCallback(0), mk.MetricAverageCallback()])
mine = flat_weights(model)
root = mlfabric.broadcast(mine, root=0)
mismatch = mlfabric.allreduce(np.array([int(not np.array_equal(mine, root))], np.int32))[0]
expect(mismatch == 0, "weights identical on every rank (%d ranks differ)" % mismatch)
if rank == 0:
    reference = make_model(100)
    reference.set_weights([w for w in reference.get_weights()])
    flat0 = initial_root
    parts, i = [], 0
    for w in reference.get_weights():
        parts.append(flat0[i:i + w.size].reshape(w.shape))
        i += w.size
    reference.set_weights(parts)
    reference.compile(optimizer=keras.optimizers.SGD(lr), loss="mse", jit_compile=False)
    reference.fit(X, Y, batch_size=rows * size, epochs=epochs, shuffle=False, verbose=0)
    diff = float(np.max(np.abs(flat_weights(reference) - mine)))
    print("sync: %d ranks x %d rows, %d epochs: max |w_distributed - w_single| = %.2e; "
          "averaged final loss %.4f" % (size, rows, epochs, diff, history.history["loss"][-1]),
          flush=True)
    expect(diff < 1e-5, "distributed training matches single-process training (diff %g)" % diff)
    expect(np.max(np.abs(flat_weights(reference) - initial_root)) > 1e-3, "training moved weights")
print("rank %d: sync part done in %.1f s" % (rank, time.time() - t0), flush=True)

# ---- gradient of allreduce (Horovod's convention): the gradient of a summed
# AllReduce is the summed AllReduce of the gradient, so on rank r
# d/dx sum(allreduce(c_r * x)) = c_r * size.
x = tf.Variable(tf.ones([3]))
with tf.GradientTape() as tape:
    total = tf.reduce_sum(mtf.allreduce(x * float(rank + 1), op=mtf.Sum))
grad = tape.gradient(total, x).numpy()
expect(np.array_equal(grad, np.full(3, float((rank + 1) * size), np.float32)),
       "allreduce gradient %s" % grad)

# ---- 2. bad input
try:
    mtf.allreduce(tf.ones([rank + 1]))
    expect(False, "shapes that differ across ranks raise")
except tf.errors.FailedPreconditionError as e:
    expect("differ across ranks" in str(e), "message names the mismatch: %s" % e)
try:
    mlfabric.allreduce(np.ones(4, np.float64 if rank == 0 else np.float32))
    expect(False, "dtypes that differ across ranks raise")
except ValueError as e:
    expect("float64" in str(e) and "float32" in str(e), "message names both dtypes: %s" % e)
for bad in (lambda: mtf.allreduce(tf.ones([2], tf.bfloat16)),
            lambda: mlfabric.allreduce(np.ones(2, np.complex64))):
    try:
        bad()
        expect(False, "bfloat16 / complex64 raise")
    except TypeError as e:
        expect("float32" in str(e), "unsupported dtype message: %s" % e)
worker = mlfabric.Worker(name="check%d" % rank)
start = time.time()
try:
    mtf.get(worker, "no-such-server")
    expect(False, "get from an unregistered server raises")
except tf.errors.OpError as e:
    expect("no-such-server" in str(e), "unregistered server named: %s" % e)
expect(time.time() - start < 30, "unregistered server answered promptly")
barrier()
print("rank %d: bad-input part done" % rank, flush=True)

# ---- 3. TF push/get ops against a SumServer
dim = 1000
server = mlfabric.SumServer("check-ps", np.zeros(dim, np.float32)) if rank == 0 else None
barrier()
mine = np.arange(dim, dtype=np.float32) * (rank + 1)
for turn in range(size):  # one at a time, so a small delay bound drops none
    if turn == rank:
        for attempt in range(100):
            try:
                version, _ = mtf.get(worker, "check-ps")
                break
            except tf.errors.OpError:
                time.sleep(0.1)
        outcome, applied_version, delay = mtf.push(worker, "check-ps", mine, version)
        expect(int(outcome) == 0, "push applied (outcome %d)" % int(outcome))
        expect(int(delay) == 0, "sequential push has delay 0 (%d)" % int(delay))
    barrier()
version, model_sum = mtf.get(worker, "check-ps")
expected = np.arange(dim, dtype=np.float32) * (size * (size + 1) // 2)
expect(np.array_equal(model_sum.numpy(), expected), "server holds the exact sum of the pushes")
barrier()
if server is not None:
    server.stop()

# ---- 4. async PS on scikit-learn's digits
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

digits = load_digits()
xd = (digits.data / 16.0).astype(np.float32)
yd = digits.target.astype(np.int64)
x_train, x_test, y_train, y_test = train_test_split(xd, yd, test_size=0.25, random_state=0)
keras.utils.set_random_seed(7)
net = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                        keras.layers.Dense(10)])
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
trainer = mk.AsyncPSTrainer(net, loss_fn, server="ps0", learning_rate=0.2, worker=worker)
if rank == 0:
    trainer.start_server()
steps = int(os.environ.get("PS_STEPS", "120"))
mine_x, mine_y = x_train[rank::size], y_train[rank::size]


def batches(batch=32, seed=rank):
    r = np.random.default_rng(seed)
    while True:
        idx = r.choice(len(mine_x), batch, replace=False)
        yield mine_x[idx], mine_y[idx]


t1 = time.time()
stats = trainer.train(batches(), steps)
elapsed = time.time() - t1
hist = np.zeros(12, np.int64)
for d in stats["delays"]:
    hist[min(d, 11)] += 1
totals = mlfabric.allreduce(np.array([stats["applied"], stats["dropped"], stats["failed"]],
                                     np.int64))
hist = mlfabric.allreduce(hist)
barrier()
if rank == 0:
    trainer.pull()
    accuracy = float(np.mean(np.argmax(net.predict(x_test, verbose=0), axis=1) == y_test))
    delays = np.repeat(np.arange(12), hist)
    print("async PS (digits, %d workers x %d steps, lr 0.2, planner %s, tau_max %s): "
          "test accuracy %.3f; applied %d, dropped %d, failed %d; delay p50 %d p90 %d max %d; "
          "delay histogram (0..11+) %s; %.1f s, %.1f pushes/s"
          % (size, steps, os.environ.get("CHECK_PLANNER", "?"),
             os.environ.get("MLFABRIC_DELAY_BOUND", "?"), accuracy, totals[0], totals[1],
             totals[2], np.percentile(delays, 50) if len(delays) else -1,
             np.percentile(delays, 90) if len(delays) else -1, delays.max() if len(delays) else -1,
             hist.tolist(), elapsed, size * steps / elapsed), flush=True)
    if stats["drop_reasons"]:
        print("drop reasons on rank 0: %s" % stats["drop_reasons"], flush=True)
    expect(accuracy >= 0.85, "async PS test accuracy %.3f >= 0.85" % accuracy)
    expect(totals[2] == 0, "no push failed")
    expect(totals[0] + totals[1] == size * steps, "every push ended applied or dropped")
barrier()
if rank == 0:
    trainer.stop_server()
worker.close()
mlfabric.shutdown()
if failures:
    print("keras_check rank %d: %d FAILED: %s" % (rank, len(failures), failures), flush=True)
    sys.exit(1)
print("keras_check rank %d: OK (%.1f s)" % (rank, time.time() - t0), flush=True)
