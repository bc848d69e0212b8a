"""`mlfabric.keras.elastic`: Horovod's `horovod.tensorflow.keras.elastic` for Keras 3.

    import mlfabric.keras as hvd
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)

    @hvd.elastic.run
    def train(state):
        model.fit(x, y, epochs=epochs - state.epoch, callbacks=[   # Keras counts from 0
            hvd.elastic.CommitStateCallback(state, batches_per_commit=10),
            hvd.elastic.UpdateBatchStateCallback(state),
            hvd.elastic.UpdateEpochStateCallback(state)])

    train(state)

KerasState / TensorFlowKerasState keep the model's and the optimizer's
variables (mlfabric.tensorflow.elastic); the callbacks below commit the
state and keep `state.batch` and `state.epoch` current, with Horovod's
semantics (horovod/_keras/elastic.py).
"""
import keras

from mlfabric._tensorflow_elastic import (HostsUpdatedInterrupt, KerasState,  # noqa: F401
                                          MembershipChangedError, ObjectState, State,
                                          TensorFlowKerasState, TensorFlowState,
                                          is_membership_change, run, run_fn)


class CommitStateCallback(keras.callbacks.Callback):
    """Commits `state` after every `batches_per_commit` batches and at the
    end of every epoch. A commit copies every tracked variable to host
    memory and is a collective (check_host_updates), so every rank must
    use the same batches_per_commit."""

    def __init__(self, state, batches_per_commit=1):
        super().__init__()
        if int(batches_per_commit) != batches_per_commit or batches_per_commit < 1:
            raise ValueError("CommitStateCallback: batches_per_commit must be an integer >= 1, "
                             "got %r" % (batches_per_commit,))
        self.state = state
        self.batches_per_commit = int(batches_per_commit)
        self.batches_remaining = self.batches_per_commit

    def on_train_begin(self, logs=None):
        """Counts batches to the next commit from zero."""
        # Every (re)start counts from zero on every rank.
        self.batches_remaining = self.batches_per_commit

    def on_batch_end(self, batch, logs=None):
        """Commits the state every batches_per_commit batches."""
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None):
        """Commits the state at each epoch's end."""
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Sets `state.batch` to the batch just finished (Keras's index in its
    epoch) and back to 0 at each epoch's end. At an epoch's start it sets
    `params["steps"]` to the steps left after `state.batch`, as Horovod;
    Keras 3's fit() does not read params back, so a resumed epoch still
    runs all its steps (python/README.md)."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.steps_per_epoch = None

    def on_train_begin(self, logs=None):
        """Forgets the steps per epoch of an earlier fit()."""
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        """Sets params["steps"] to the steps left after state.batch."""
        params = self.params or {}
        if params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = params["steps"]
            params["steps"] = self.steps_per_epoch - self.state.batch

    def on_batch_end(self, batch, logs=None):
        """Records the batch just finished in state.batch."""
        self.state.batch = batch

    def on_epoch_end(self, epoch, logs=None):
        """Sets state.batch back to 0."""
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Sets `state.epoch` at each epoch's end to the epochs completed in
    all: the state's epoch when fit() began plus Keras's epoch index + 1,
    so a fit() restarted by run() does not repeat or skip one. As with
    Horovod, call fit(epochs=total - state.epoch) without initial_epoch
    (Keras's index then counts from 0)."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.initial_epoch = state.epoch

    def on_train_begin(self, logs=None):
        """Takes the state's epoch as where this fit() starts."""
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch, logs=None):
        """Records the epochs completed in all in state.epoch."""
        self.state.epoch = self.initial_epoch + epoch + 1
