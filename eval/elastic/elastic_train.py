"""One rank of the elastic-training experiment (eval/elastic/README.md),
started by mlfabric-run --host-discovery-script: softmax regression on
sklearn's digits with mlfabric.elastic (ObjectState: step, weights), one
AllReduce and one commit per step.

Every step uses the same global batch of BATCH samples whatever the job's
size (drawn from the seed and the step number); rank r of n takes rows
r, r+n, ... of it. The AllReduce sums the ranks' gradient sums, their
sample counts, their losses and 2**<worker number> (which workers the sum
holds), so the update is the mean gradient over the batch and a run with
members coming and going follows the run without faults step for step
(except a step whose round completed without a rank that died in it).

Each process appends lines (wall clock first) to DIR/log-<worker>-<pid>:
    start T
    init T GEN SIZE RANK                    after mlfabric.init()
    enter T GEN SIZE RANK                   training starts (again) in GEN
    step T GEN SIZE RANK STEP SUMCRC MASK COUNT WCRC
        a completed step: the CRC-32 of the AllReduce's sum, the workers in
        it (bit mask), its sample count, the CRC-32 of the new weights
    fail T GEN SIZE RANK STEP REASON...     the step's AllReduce failed
    final T GEN SIZE RANK STEP WCRC ACCURACY LOSS

    elastic_train.py DIR STEPS SEED WANT STEP_MS [MODEL]
trains at least STEPS steps and until the job has WANT members; each step
also sleeps STEP_MS ms (the compute of a larger model: digits' own takes
about a millisecond). MODEL "softmax" (default) is the numpy regression
above; "keras" a Keras MLP (64 -> 32 relu -> 10, SGD) in a
mlfabric.keras.elastic.KerasState (its model's and optimizer's variables
plus the step), the gradients from tf.GradientTape summed by the same
AllReduce and applied by the optimizer: the weights CRC is over the
model's weights.
"""
import os
import sys
import time
import zlib

import numpy as np
from sklearn.datasets import load_digits

import mlfabric
import mlfabric.elastic

BATCH = 128
LEARNING_RATE = 0.5
TRAIN = 1437  # of digits' 1,797 images; the rest is the test set


def crc(array):
    return "%08x" % zlib.crc32(np.ascontiguousarray(array).tobytes())


def data(seed):
    """(x_train, y_train, x_test, y_test), split by a permutation from the seed;
    a column of ones appended (the bias)."""
    x, y = load_digits(return_X_y=True)
    x = np.hstack([x / 16.0, np.ones((len(x), 1))])
    order = np.random.RandomState(seed).permutation(len(x))
    x, y = x[order], y[order]
    return x[:TRAIN], y[:TRAIN], x[TRAIN:], y[TRAIN:]


def gradient(w, x, y):
    """Sums over the rows of x: (gradient of the cross-entropy, loss)."""
    logits = x @ w
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    loss = -np.log(p[np.arange(len(y)), y] + 1e-12).sum()
    p[np.arange(len(y)), y] -= 1.0
    return x.T @ p, loss


def evaluate(w, x, y):
    """(accuracy, mean loss) of weights w on (x, y)."""
    grad_unused, loss = gradient(w, x, y)
    del grad_unused
    return float(np.mean(np.argmax(x @ w, axis=1) == y)), float(loss / len(y))


class Log:
    """Appends one line per event, flushed at once (a SIGKILL loses none)."""

    def __init__(self, out, name):
        self._file = open(os.path.join(out, "log-%s-%d" % (name, os.getpid())), "a")

    def __call__(self, kind, *fields):
        self._file.write(" ".join([kind, "%.6f" % time.time()] + [str(f) for f in fields]) + "\n")
        self._file.flush()


def where():
    # mlfabric._generation: the membership generation this rank's AllReducer
    # was built for (the elastic API keeps it there; no public accessor).
    return mlfabric._generation, mlfabric.size(), mlfabric.rank()


def summed_step(state, seed, step_s, bit, log, gradient_of):
    """One step's AllReduce, both models: this rank's rows of the step's
    global batch, `gradient_of(rows)` -> (flat gradient sum, loss), the
    step's sleep, then the sum of every rank's (gradient, count, loss,
    2**worker). Returns (total, count, mask); a failed AllReduce is
    logged and raised (run() decides)."""
    gen, size, rank = where()
    batch = np.random.RandomState(seed * 1000003 + state.step).choice(TRAIN, BATCH, False)
    mine = batch[rank::size]
    grad, loss = gradient_of(mine)
    time.sleep(step_s)
    payload = np.concatenate([grad, [len(mine), loss, bit]])
    try:
        total = mlfabric.allreduce(payload)
    except Exception as e:  # noqa: BLE001 -- logged, then run() decides
        log("fail", gen, size, rank, state.step, str(e).replace("\n", " "))
        raise
    return total, total[-3], int(total[-1])


class KerasModel:
    """The Keras variant: an MLP on the same inputs (without the bias
    column), its gradient sums as one flat float64 array."""

    def __init__(self, seed):
        import tensorflow as tf  # only here: importing it takes seconds
        import keras
        import mlfabric.keras
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        keras.utils.set_random_seed(seed)
        self.tf = tf
        self.model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, "relu"),
                                       keras.layers.Dense(10)])
        self.optimizer = keras.optimizers.SGD(LEARNING_RATE)
        self.optimizer.build(self.model.trainable_variables)
        self.loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                              reduction="sum")
        self.state_class = mlfabric.keras.elastic.KerasState

    def gradient(self, x, y):
        with self.tf.GradientTape() as tape:
            loss = self.loss(y, self.model(x[:, :64], training=True))
        grads = tape.gradient(loss, self.model.trainable_variables)
        return np.concatenate([g.numpy().ravel() for g in grads]).astype(np.float64), float(loss)

    def apply(self, mean_gradient):
        grads, at = [], 0
        for v in self.model.trainable_variables:
            n = int(np.prod(v.shape))
            grads.append(self.tf.constant(mean_gradient[at:at + n].reshape(v.shape), v.dtype))
            at += n
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))

    def weights(self):
        return np.concatenate([w.ravel() for w in self.model.get_weights()])

    def evaluate(self, x, y):
        logits = self.model(x[:, :64], training=False).numpy()
        loss = float(self.loss(y, logits)) / len(y)
        return float(np.mean(np.argmax(logits, axis=1) == y)), loss


def main_keras(out, steps, seed, want, step_s, name, bit, log):
    """main() with the Keras model (MODEL "keras")."""
    x, y, x_test, y_test = data(seed)
    net = KerasModel(seed)
    mlfabric.init()
    log("init", *where())
    state = net.state_class(net.model, net.optimizer, step=0)

    @mlfabric.elastic.run
    def train(state):
        log("enter", *where())
        while state.step < steps or mlfabric.size() < want:
            gen, size, rank = where()
            total, count, mask = summed_step(state, seed, step_s, bit, log,
                                             lambda rows: net.gradient(x[rows], y[rows]))
            net.apply(total[:-3] / count)
            state.step += 1
            log("step", gen, size, rank, state.step, crc(total), mask, int(count),
                crc(net.weights()))
            state.commit()

    train(state)
    accuracy, loss = net.evaluate(x_test, y_test)
    log("final", *where(), state.step, crc(net.weights()), "%.4f" % accuracy, "%.4f" % loss)


def main():
    out, steps, seed, want = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    step_s = float(sys.argv[5]) / 1000.0
    model = sys.argv[6] if len(sys.argv) > 6 else "softmax"
    if model not in ("softmax", "keras"):
        sys.exit("elastic_train.py: MODEL %r is neither softmax nor keras" % model)
    name = os.environ["MLFABRIC_WORKER_NAME"]
    bit = 2.0 ** int(name[len("rank"):])  # worker numbers stay small: exact in float64
    log = Log(out, name)
    log("start")
    if model == "keras":
        main_keras(out, steps, seed, want, step_s, name, bit, log)
        return
    x, y, x_test, y_test = data(seed)
    mlfabric.init()
    log("init", *where())
    state = mlfabric.elastic.ObjectState(step=0, w=np.zeros((x.shape[1], 10)))

    @mlfabric.elastic.run
    def train(state):
        log("enter", *where())  # after each rebuild for a new membership
        while state.step < steps or mlfabric.size() < want:
            gen, size, rank = where()

            def gradient_of(rows):
                grad, loss = gradient(state.w, x[rows], y[rows])
                return grad.ravel(), loss
            total, count, mask = summed_step(state, seed, step_s, bit, log, gradient_of)
            state.w = state.w - LEARNING_RATE * total[:-3].reshape(state.w.shape) / count
            state.step += 1
            log("step", gen, size, rank, state.step, crc(total), mask, int(count), crc(state.w))
            state.commit()

    train(state)
    accuracy, loss = evaluate(state.w, x_test, y_test)
    log("final", *where(), state.step, crc(state.w), "%.4f" % accuracy, "%.4f" % loss)


if __name__ == "__main__":
    main()
