"""A complete MLfabric program with Keras 3 (docs/user-guide/python-keras.md).

    bazel build //python:runtime //tools/run:mlfabric-run
    export PYTHONPATH=$PWD/python       # or: pip install -e ./python
    bazel-bin/tools/run/mlfabric-run -np 4 python3 examples/train_keras.py
    bazel-bin/tools/run/mlfabric-run -np 2 python3 examples/train_keras.py --mode async

--mode sync (default), Horovod-style data parallelism: every rank trains on
its shard of scikit-learn's digits; DistributedOptimizer averages the
gradients over all ranks with one fused AllReduce per step; rank 0's initial
weights are broadcast; the epoch metrics are averaged over ranks.

--mode async, asynchronous parameter server (MLfabric-A): rank 0 hosts the
model in a Python server (mlfabric.Server with numpy callbacks); every rank
gets the model, computes a gradient and pushes -lr * gradient per layer
(priorities in layer order) with its norm; the scheduler drops pushes that
would exceed the job's delay bound (mlfabric-run --delay_bound).

Rank 0 prints the test accuracy; every rank prints "train_keras rank R: OK"
when the run met --min_accuracy. tests/examples_test.sh runs both modes.
"""
import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import mlfabric
import numpy as np
import keras
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import mlfabric.keras as mk

parser = argparse.ArgumentParser()
parser.add_argument("--mode", choices=["sync", "async"], default="sync")
parser.add_argument("--epochs", type=int, default=8)
parser.add_argument("--steps", type=int, default=100, help="async: pushes per rank")
parser.add_argument("--min_accuracy", type=float, default=0.85)
args = parser.parse_args()

mlfabric.init()  # AllReduce backend "auto": MPI under mlfabric-run
rank, size = mlfabric.rank(), mlfabric.size()

digits = load_digits()
x = (digits.data / 16.0).astype(np.float32)
y = digits.target.astype(np.int64)
x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0)
x_mine, y_mine = x_train[rank::size], y_train[rank::size]  # this rank's shard

keras.utils.set_random_seed(rank)  # different initial weights: the broadcast aligns them
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(10)])
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

if args.mode == "sync":
    # Horovod's recipe: the averaged gradient is less noisy, scale the rate.
    model.compile(optimizer=mk.DistributedOptimizer(keras.optimizers.SGD(0.1 * size)), loss=loss,
                  metrics=["accuracy"], jit_compile=False)  # XLA cannot compile MLfabric ops
    model.fit(x_mine, y_mine, batch_size=32, epochs=args.epochs, verbose=0,
              callbacks=[mk.BroadcastGlobalVariablesCallback(0), mk.MetricAverageCallback()])
    summary = "sync, %d ranks x %d epochs" % (size, args.epochs)
else:
    trainer = mk.AsyncPSTrainer(model, loss, server="ps0", learning_rate=0.2)
    if rank == 0:
        trainer.start_server(python=True)  # the model lives in a numpy array on rank 0

    def batches(batch=32):
        rng = np.random.default_rng(rank)
        while True:
            idx = rng.choice(len(x_mine), batch, replace=False)
            yield x_mine[idx], y_mine[idx]

    stats = trainer.train(batches(), steps=args.steps)
    counts = mlfabric.allreduce(np.array([stats["applied"], stats["dropped"], stats["failed"]],
                                         np.int64))
    mlfabric.allreduce(np.zeros(1, np.float32))  # every rank is done pushing
    if rank == 0:
        trainer.pull()  # the server's final model
        if trainer.server_applied() != counts[0]:
            print("train_keras: the server applied %d, the workers saw %d applied"
                  % (trainer.server_applied(), counts[0]), file=sys.stderr)
            counts[2] += 1  # count it as a failure
    summary = ("async PS, %d ranks x %d pushes (tau_max %s): applied %d, dropped %d, failed %d"
               % (size, args.steps, os.environ.get("MLFABRIC_DELAY_BOUND", "?"), *counts))

accuracy = float(np.mean(np.argmax(model.predict(x_test, verbose=0), axis=1) == y_test))
ok = accuracy >= args.min_accuracy and (args.mode == "sync" or counts[2] == 0)
if rank == 0:
    print("train_keras: %s: test accuracy %.3f" % (summary, accuracy), flush=True)
verdict = mlfabric.broadcast(np.array([int(ok)], np.int32), root=0)[0]
mlfabric.allreduce(np.zeros(1, np.float32))  # keep rank 0's server up until all are done
if args.mode == "async" and rank == 0:
    trainer.stop_server()
mlfabric.shutdown()
if not verdict:
    print("train_keras rank %d: FAILED (accuracy %.3f < %.2f or failed pushes)"
          % (rank, accuracy, args.min_accuracy), flush=True)
    sys.exit(1)
print("train_keras rank %d: OK" % rank, flush=True)
