"""Keras synchronous training speed, one AllReduce backend per run.

    mlfabric-run -np 2 python3 python/benchmarks/keras_steps.py --backend mpi
    mlfabric-run -np 2 python3 python/benchmarks/keras_steps.py --backend mlfabric
    mlfabric-run -np 2 python3 python/benchmarks/keras_steps.py --backend mlfabric \
        --model mobilenetv2

A Horovod-style program (TensorFlow imported first, mlfabric.keras as hvd)
trains with hvd.DistributedOptimizer for --epochs epochs of --batch samples
per rank, and rank 0 prints steps per second over the epochs after the
first (which includes tracing). --model digits (default): an MLP on
scikit-learn's digits. --model mobilenetv2: keras.applications.MobileNetV2
(random weights, 32x32x3 inputs, 10 classes) on --samples synthetic images
per rank. The gradients of a step are fused into one AllReduce per dtype
up to MLFABRIC_FUSION_THRESHOLD bytes (mlfabric.tensorflow.fusion_threshold;
0 = one AllReduce per tensor). Compare two runs' figures as a ratio
(python/README.md, "Measured figures").
"""
import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402  (any import order works)
import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import mlfabric.keras as hvd  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--backend", default="mpi", choices=["mpi", "mlfabric"])
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--batch", type=int, default=32)
parser.add_argument("--hidden", type=int, default=64)
parser.add_argument("--model", default="digits", choices=["digits", "mobilenetv2"])
parser.add_argument("--samples", type=int, default=256, help="mobilenetv2: images per rank")
parser.add_argument("--straggle", default="",
                    help="R,S: each rank's step is S times as long with probability R (the "
                         "testbed's compute settings: C1 0.10,2, C2 0.10,4); the same draws "
                         "for every backend")
args = parser.parse_args()
straggle_r, straggle_s = (map(float, args.straggle.split(",")) if args.straggle else (0.0, 1.0))

hvd.init(backend=args.backend)
keras.utils.set_random_seed(1)
if args.model == "digits":
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x, y = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]
    model = keras.Sequential([keras.Input((64,)),
                              keras.layers.Dense(args.hidden, activation="relu"),
                              keras.layers.Dense(10)])
else:
    rng = np.random.default_rng(hvd.rank())
    x = rng.standard_normal((args.samples, 32, 32, 3)).astype(np.float32)
    y = rng.integers(0, 10, args.samples)
    model = keras.Sequential([keras.Input((32, 32, 3)), keras.applications.MobileNetV2(
        input_shape=(32, 32, 3), weights=None, classes=10, classifier_activation=None)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05 * hvd.size())),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              jit_compile=False)


class Timer(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epoch_times, self.steps = [], 0

    def on_epoch_begin(self, epoch, logs=None):
        self.t = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_times.append(time.perf_counter() - self.t)


class Straggler(keras.callbacks.Callback):
    """A straggling step: sleeps (S - 1) times the step's own duration."""

    def __init__(self):
        super().__init__()
        self.rng = np.random.default_rng(1000 + hvd.rank())

    def on_train_batch_begin(self, batch, logs=None):
        self.t = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        if self.rng.random() < straggle_r:
            time.sleep((straggle_s - 1) * (time.perf_counter() - self.t))


timer = Timer()
callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), timer]
if straggle_r > 0:
    callbacks.append(Straggler())
model.fit(x, y, batch_size=args.batch, epochs=args.epochs, verbose=0, shuffle=False,
          callbacks=callbacks)
steps = int(np.ceil(len(x) / args.batch))
measured = timer.epoch_times[1:] or timer.epoch_times
rate = steps * len(measured) / sum(measured)
if hvd.rank() == 0:
    params = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    print("keras_steps: %s, backend %s, %d ranks, %d parameters, %d steps/epoch%s: %.1f steps/s "
          "(%.2f ms per step)" % (args.model, args.backend, hvd.size(), params, steps,
                                  ", straggle " + args.straggle if args.straggle else "", rate,
                                  1000 / rate), flush=True)
hvd.shutdown()
