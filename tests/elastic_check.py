"""Run in every rank by //tests:elastic_test under mlfabric-run (2 ranks):
Horovod's elastic state API (`hvd.elastic`) on MLfabric's collectives.
  1. ObjectState (numpy broadcast by default, and with
     hvd.broadcast_object): sync makes every rank's attributes rank 0's;
     restore brings back the last commit; commit, modify, restore keeps
     the commit; reset callbacks; check_host_updates raises on every rank
     when only rank 0 recorded a host update;
  2. TensorFlowState: Horovod's test_elastic_state expectations (variables
     and attributes);
  3. TensorFlowKerasState / KerasState: a small Keras model and an SGD
     optimizer with momentum (its slots restored too);
  4. CommitStateCallback, UpdateBatchStateCallback, UpdateEpochStateCallback
     in a short model.fit;
  5. run(): a MembershipChangedError raised by the function on its first
     call restores the last commit, calls the reset callbacks, syncs and
     calls the function again (once); an error carrying the scheduler's
     "left the job ... membership generation" wording (a tf.errors.OpError
     from a tf.function) likewise; any other error propagates; the wording
     is recognised exactly as the scheduler writes it.
Prints "elastic_check rank R: OK".
"""
import faulthandler
import os
import sys

faulthandler.dump_traceback_later(240, exit=True)  # never hang the test
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras
import numpy as np
import tensorflow as tf

import mlfabric
import mlfabric.elastic
import mlfabric.keras as hvd_keras
import mlfabric.tensorflow as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
assert size == 2, "run with mlfabric-run -np 2"
failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)
        print("rank %d: FAILED %s" % (rank, what), file=sys.stderr, flush=True)


def same_on_all_ranks(values, what):
    values = np.asarray(values, np.float64).ravel()
    root = mlfabric.broadcast(values, 0)
    differs = mlfabric.allreduce(np.array([float(not np.array_equal(values, root))]))
    expect(float(differs[0]) == 0, "%s identical on every rank" % what)


def check_exposed():
    expect(hvd.elastic.run is mlfabric.elastic.run, "mlfabric.tensorflow.elastic.run")
    expect(hvd_keras.elastic.KerasState is hvd.elastic.KerasState, "mlfabric.keras.elastic")
    expect(hvd.elastic.HostsUpdatedInterrupt is mlfabric.elastic.MembershipChangedError,
           "HostsUpdatedInterrupt is MembershipChangedError")
    from mlfabric.tensorflow.elastic import TensorFlowKerasState  # as with Horovod
    expect(TensorFlowKerasState is hvd.elastic.TensorFlowKerasState, "import by module path")
    # Elastic ranks follow the worker names' numbers, not their bytes.
    expect(mlfabric._natural_order(["rank10", "rank2", "rank1", "rank0", "w1x3", "w1x20"]) ==
           ["rank0", "rank1", "rank2", "rank10", "w1x3", "w1x20"], "members in rank order")


def check_object_state(bcast_object, what):
    state = mlfabric.elastic.ObjectState(bcast_object, hvd.rank, batch=20 + rank,
                                         epoch=10 + rank, names=["r%d" % rank])
    state.sync()
    expect((state.batch, state.epoch, state.names) == (20, 10, ["r0"]),
           "%s: sync takes rank 0's attributes, got %r"
           % (what, (state.batch, state.epoch, state.names)))
    state.batch, state.epoch = 21, 11
    state.restore()
    expect((state.batch, state.epoch) == (20, 10), "%s: restore undoes changes" % what)
    state.batch, state.epoch = 21 + rank, 11
    state.commit()
    state.batch = 99
    state.restore()
    expect((state.batch, state.epoch) == (21 + rank, 11), "%s: restore returns to the commit"
           % what)
    state.sync()
    expect(state.batch == 21, "%s: sync after commit takes rank 0's commit" % what)
    calls = []
    state.register_reset_callbacks([lambda: calls.append("a"), lambda: calls.append("b")])
    state.on_reset()
    expect(calls == ["a", "b"], "%s: reset callbacks in order: %r" % (what, calls))
    if rank == 0:
        state.on_hosts_updated(5)
    try:
        state.commit()
        expect(False, "%s: commit after rank 0's host update raises on rank %d" % (what, rank))
    except mlfabric.elastic.HostsUpdatedInterrupt:
        pass
    state.commit()  # nothing new: no error


def check_tensorflow_state():
    """Horovod's test_elastic_state, eagerly."""
    v = 1.0 if rank == 0 else 2.0
    variables = [tf.Variable(np.array([[v, v], [v, v]])), tf.Variable(np.array([v, v]))]
    other = [np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([0.0, 0.0])]
    state = hvd.elastic.TensorFlowState(variables, batch=20 + rank, epoch=10 + rank)
    state.sync()
    for var in variables:
        expect(np.allclose(var.numpy(), 1.0), "TensorFlowState: sync takes rank 0's variables")
    expect((state.batch, state.epoch) == (20, 10), "TensorFlowState: sync takes rank 0's "
           "attributes")
    for var, value in zip(variables, other):
        var.assign(value)
    state.batch, state.epoch = 21, 11
    state.restore()
    for var in variables:
        expect(np.allclose(var.numpy(), 1.0), "TensorFlowState: restore undoes changes")
    expect((state.batch, state.epoch) == (20, 10), "TensorFlowState: restore attributes")
    for var, value in zip(variables, other):
        var.assign(value)
    state.batch, state.epoch = 21, 11
    state.commit()
    state.restore()
    for var, value in zip(variables, other):
        expect(np.allclose(var.numpy(), value), "TensorFlowState: commit then restore")
    expect((state.batch, state.epoch) == (21, 11), "TensorFlowState: committed attributes")
    for bad, text in ((lambda: hvd.elastic.TensorFlowState(None), "give the variables"),
                      (lambda: hvd.elastic.TensorFlowState(variables, session=object()),
                       "TF1 sessions")):
        try:
            bad()
            expect(False, "TensorFlowState refuses bad input (%s)" % text)
        except ValueError as e:
            expect(text in str(e), "ValueError names %r: %s" % (text, e))


def small_model(seed):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=hvd_keras.DistributedOptimizer(
        keras.optimizers.SGD(0.05, momentum=0.9)), loss="mse", jit_compile=False)
    return model


def weights(model):
    return np.concatenate([w.ravel() for w in model.get_weights()])


def slots(variables):
    return np.concatenate([np.asarray(v).ravel().astype(np.float64) for v in variables])


def check_keras_state(state_class):
    model = small_model(100 + rank)  # different weights on each rank
    state = state_class(model, epoch=rank)
    state.sync()
    same_on_all_ranks(weights(model), "%s: weights after sync" % state_class.__name__)
    expect(state.epoch == 0, "%s: epoch after sync" % state_class.__name__)
    # The optimizer's own variables (after training Keras 3 lists the
    # model's among them too).
    optimizer_variables = list(model.optimizer.variables)
    expect(len(optimizer_variables) == 6, "the state built the optimizer: iterations, learning "
           "rate and 4 momentums, got %d" % len(optimizer_variables))
    committed, committed_slots = weights(model), slots(optimizer_variables)
    x = np.random.RandomState(rank).normal(size=(8, 4)).astype(np.float32)
    model.fit(x, x[:, :1], batch_size=4, epochs=1, verbose=0, shuffle=False)
    expect(not np.array_equal(weights(model), committed), "fit changed the weights")
    expect(not np.array_equal(slots(optimizer_variables), committed_slots),
           "fit changed the optimizer's variables")
    state.restore()
    expect(np.array_equal(weights(model), committed), "%s: restore brings back the weights"
           % state_class.__name__)
    expect(np.array_equal(slots(optimizer_variables), committed_slots),
           "%s: restore brings back the optimizer's variables" % state_class.__name__)
    model.fit(x, x[:, :1], batch_size=4, epochs=1, verbose=0, shuffle=False)
    state.commit()
    trained, trained_slots = weights(model), slots(optimizer_variables)
    same_on_all_ranks(trained, "%s: weights after DistributedOptimizer" % state_class.__name__)
    model.set_weights([w * 0 for w in model.get_weights()])
    state.restore()
    expect(np.array_equal(weights(model), trained), "%s: commit, modify, restore"
           % state_class.__name__)
    expect(np.array_equal(slots(optimizer_variables), trained_slots),
           "%s: optimizer's variables after commit, restore" % state_class.__name__)


class CountCommits(keras.callbacks.Callback):
    def __init__(self, state):
        super().__init__()
        self.commits = 0
        original = state.commit

        def counting():
            self.commits += 1
            original()
        state.commit = counting


def check_callbacks():
    model = small_model(7)
    state = hvd_keras.elastic.KerasState(model, batch=0, epoch=1)
    counter = CountCommits(state)
    seen_batches = []

    class RecordBatch(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen_batches.append(state.batch)

    x = np.random.RandomState(rank).normal(size=(16, 4)).astype(np.float32)
    # 4 batches per epoch, 2 epochs; the state records the epoch count from 1.
    model.fit(x, x[:, :1], batch_size=4, epochs=2, verbose=0, shuffle=False, callbacks=[
        hvd_keras.elastic.UpdateBatchStateCallback(state),
        hvd_keras.elastic.UpdateEpochStateCallback(state),
        hvd_keras.elastic.CommitStateCallback(state, batches_per_commit=3), RecordBatch()])
    expect(seen_batches == [0, 1, 2, 3] * 2, "state.batch after each batch: %r" % seen_batches)
    expect(state.batch == 0, "state.batch is 0 after an epoch's end")
    expect(state.epoch == 3, "state.epoch counts on from 1: %r" % state.epoch)
    # 8 batches: commits after batches 3 and 6, and at each epoch's end.
    expect(counter.commits == 4, "commits: %d, expected 4" % counter.commits)
    fitted = weights(model)
    model.set_weights([w + 1 for w in model.get_weights()])
    state.restore()
    expect(np.array_equal(weights(model), fitted), "the epoch's end committed the weights")
    try:
        hvd_keras.elastic.CommitStateCallback(state, batches_per_commit=0)
        expect(False, "batches_per_commit=0 is refused")
    except ValueError as e:
        expect("batches_per_commit" in str(e), "ValueError names batches_per_commit: %s" % e)


SCHEDULER_WORDING = ("round 3 failed: worker 'rank1' left the job (its application left host "
                     "h1) at membership generation 5; the job's member_loss is fail, so the "
                     "round fails and the next one has size 1 (round 3 opened at membership "
                     "generation 4)")


def check_run():
    variable = tf.Variable([float(rank)])
    state = hvd.elastic.TensorFlowState([variable], step=rank)
    resets, calls = [], []
    state.register_reset_callbacks([lambda: resets.append(variable.numpy()[0])])

    @hvd.elastic.run
    def train(state, raise_first):
        calls.append((variable.numpy()[0], state.step))
        if len(calls) == 1:
            state.commit()  # rank 0's values (after the sync)
            variable.assign([42.0])
            state.step = 42
            raise raise_first
        return "done"

    result = train(state, hvd.elastic.MembershipChangedError("a worker left"))
    expect(result == "done", "run returns the function's result")
    expect(calls == [(0.0, 0), (0.0, 0)], "the retry starts from the commit: %r" % calls)
    expect(resets == [0.0], "reset callbacks once, after the restore: %r" % resets)

    calls.clear()
    op_error = tf.errors.UnavailableError(None, None, SCHEDULER_WORDING)
    expect(train(state, op_error) == "done" and len(calls) == 2,
           "a TF error with the scheduler's wording is retried (%d calls)" % len(calls))
    calls.clear()
    try:
        train(state, RuntimeError("something else failed"))
        expect(False, "another error propagates")
    except RuntimeError as e:
        expect("something else" in str(e) and len(calls) == 1, "no retry for %s" % e)

    expect(mlfabric.elastic.is_membership_change(SCHEDULER_WORDING), "the scheduler's wording")
    expect(not mlfabric.elastic.is_membership_change(
        "round 3 failed: mismatch: push from 'rank1' has 40 bytes"), "other round failures")
    wrapped = mlfabric.elastic.raises_membership_changed(lambda: (_ for _ in ()).throw(op_error))
    try:
        wrapped()
        expect(False, "the collectives' mapping raises")
    except mlfabric.elastic.MembershipChangedError as e:
        expect(e.__cause__ is op_error and "left the job" in str(e), "mapped error: %s" % e)
    try:
        train(None, None)
        expect(False, "run refuses a first argument that is no State")
    except TypeError as e:
        expect("elastic State" in str(e), "TypeError names the State: %s" % e)


print("elastic_check rank %d: backend %s" % (rank, mlfabric.reducer().backend), flush=True)
check_exposed()
check_object_state(None, "ObjectState (numpy broadcast)")
check_object_state(hvd.broadcast_object, "ObjectState (hvd.broadcast_object)")
check_tensorflow_state()
check_keras_state(hvd.elastic.TensorFlowKerasState)
check_keras_state(hvd_keras.elastic.KerasState)
check_callbacks()
check_run()
# Every rank agrees before reporting: no rank leaves while another waits.
failed = mlfabric.allreduce(np.array([len(failures)], np.int64))[0]
if failures or failed:
    print("elastic_check rank %d: %d failure(s) here, %d in all" % (rank, len(failures), failed),
          flush=True)
    sys.exit(1)
print("elastic_check rank %d: OK" % rank, flush=True)
