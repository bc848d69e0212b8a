"""Run in every rank by tests/keras_shards_test.sh under mlfabric-run (3 ranks).

A Keras model trained asynchronously over a server group of 2 shards
(docs/user-guide/sharded-servers.md) ends with the same weights as the same
training over one server: ranks 0 and 1 host shards "ps-0" and "ps-1" of
group "ps" (each a contiguous run of whole variables, mlfabric.partition),
rank 2 hosts the single server "whole" and trains against both, one after
the other, from the same initial weights on the same batches.
Prints "keras_shards_check rank R: OK" on success.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf  # noqa: F401  (TensorFlow first: any import order works)
import keras

import mlfabric
import mlfabric.keras as mk

failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)
        print("rank %d: FAILED %s" % (mlfabric.rank(), what), file=sys.stderr, flush=True)


def barrier():
    mlfabric.allreduce(np.zeros(1, np.float32))


mlfabric.init(backend="mpi")
rank, size = mlfabric.rank(), mlfabric.size()
expect(size == 3, "3 ranks, got %d" % size)

# partition: whole tensors, contiguous, balanced; bad input is named.
expect(mlfabric.partition([4, 4, 4, 4], 2) == [(0, 8), (8, 16)], "partition even")
expect(mlfabric.partition([400, 4, 4, 400], 2, group="g")[1] == mlfabric.Shard("g", 1, 2, 404, 808),
       "partition shards")
for bad in (([4, 4], 3), ([4, 0], 1), ([4], 0)):
    try:
        mlfabric.partition(*bad)
        expect(False, "partition%r raised nothing" % (bad,))
    except ValueError as e:
        expect("partition" in str(e), "partition error names itself: %s" % e)

keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"),
                          keras.layers.Dense(4)])
loss = keras.losses.MeanSquaredError()
rng = np.random.default_rng(1)
X = rng.normal(size=(64, 8)).astype(np.float32)
Y = rng.normal(size=(64, 4)).astype(np.float32)
initial = model.get_weights()
sharded = mk.AsyncPSTrainer(model, loss, server="ps", learning_rate=0.05, shards=2)
single = mk.AsyncPSTrainer(model, loss, server="whole", learning_rate=0.05)
if rank < 2:
    sharded.start_server(shard=rank)
    print("keras_shards_check rank %d: serving %s" % (rank, sharded.shards[rank]), flush=True)
else:
    single.start_server()
barrier()

steps = 30
if rank == 2:
    def batches():
        i = 0
        while True:
            k = i % 8
            yield X[8 * k:8 * k + 8], Y[8 * k:8 * k + 8]
            i += 1

    over_group = sharded.train(batches(), steps=steps)
    version_a, data_a = sharded.worker.get("ps")
    model.set_weights(initial)
    over_one = single.train(batches(), steps=steps)
    version_b, data_b = single.worker.get("whole")
    a = np.frombuffer(data_a, np.float32)
    b = np.frombuffer(data_b, np.float32)
    flat0 = np.concatenate([w.ravel() for w in initial]).astype(np.float32)
    expect(over_group["applied"] == steps, "group: %r" % (over_group,))
    expect(over_one["applied"] == steps, "single: %r" % (over_one,))
    expect(version_a == version_b == steps, "versions %d and %d" % (version_a, version_b))
    expect(a.shape == b.shape == flat0.shape, "model sizes")
    if a.shape == b.shape:
        diff = float(np.max(np.abs(a - b)))
        moved = float(np.max(np.abs(a - flat0)))
        print("keras_shards_check: max |w_group - w_single| = %.3g, training moved weights by "
              "up to %.3g, loss %.4f -> %.4f" % (diff, moved, over_group["losses"][0],
                                                over_group["losses"][-1]), flush=True)
        expect(diff <= 1e-6, "weights differ by %g" % diff)
        expect(moved > 1e-3, "training did not move the weights")
    # Shards the scheduler refuses, and a malformed spec: ValueErrors that
    # name what is wrong.
    # (the scheduler's refusals come back through the daemon: RuntimeError)
    for spec, words in ((mlfabric.Shard("ps", 1, 2, 512, 848), "shard 1 of group 'ps' is 'ps-1'"),
                        (mlfabric.Shard("ps", 0, 3, 0, 512), "group 'ps' has 2 shards"),
                        (("ps", 0, 2), "expected mlfabric.Shard")):
        try:
            mlfabric.Server("intruder", lambda u: 0, lambda: (0, b""), shard=spec)
            expect(False, "shard %r was accepted" % (spec,))
        except (ValueError, RuntimeError) as e:
            expect(words in str(e), "shard %r: %s" % (spec, e))
    # A push of the wrong size to the group fails, naming the sizes.
    result = sharded.worker.push("ps", [np.zeros(3, np.float32)], 0, 0.0,
                                 raise_on_failure=False)
    expect(result["outcome"] == "failed" and "holds a model of" in result["reason"],
           "wrong-size push: %r" % (result,))
barrier()
if rank < 2:
    sharded.stop_server()
else:
    single.stop_server()
mlfabric.shutdown()
if failures:
    print("keras_shards_check rank %d: FAILED %s" % (rank, failures), flush=True)
    sys.exit(1)
print("keras_shards_check rank %d: OK" % rank, flush=True)
