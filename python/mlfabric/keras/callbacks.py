"""Horovod's Keras callbacks (`hvd.callbacks.*`) for Keras 3.

    BroadcastGlobalVariablesCallback(root_rank)  every rank starts from root's weights
    MetricAverageCallback()                      epoch metrics averaged over ranks
    LearningRateScheduleCallback(initial_lr, multiplier, start_epoch, end_epoch, staircase)
    LearningRateWarmupCallback(initial_lr, warmup_epochs)   initial_lr / size -> initial_lr

The learning-rate callbacks follow Horovod's formulas: the schedule sets
lr = initial_lr * multiplier(epoch) for start_epoch <= epoch < end_epoch
(at each epoch's start when staircase, else every batch with a fractional
epoch); the warm-up is that schedule with multiplier(epoch) =
(epoch * (size - 1) / warmup_epochs + 1) / size, per batch, from
initial_lr / size at the start to initial_lr after warmup_epochs (Goyal et
al., "Accurate, Large Minibatch SGD", 2017). `momentum_correction` is
accepted and has no effect: Keras 3 compiles an optimizer's momentum into
the training step as a constant, so it cannot be rescaled for one batch
(python/README.md lists this among the differences from Horovod).
"""
import keras
import numpy as np

import mlfabric
from mlfabric import tensorflow as mtf


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Makes every rank's model (and optimizer state) equal rank
    `root_rank`'s: the model's variables before the first batch, and again
    with the optimizer's variables (created by the first step) after it, as
    Horovod does. `local_variables` (variables or a list of them, e.g. a
    PartialDistributedOptimizer's local layers' weights) keep each rank's
    own values."""

    def __init__(self, root_rank=0, device="", local_variables=None, root=None):
        super().__init__()
        self.root_rank = root if root is not None else root_rank
        if local_variables is None:
            local_variables = []
        elif not isinstance(local_variables, (list, tuple)):
            local_variables = [local_variables]
        self._local = {id(v) for v in local_variables}
        self._done = False

    def _broadcast(self, variables):
        shared = [v for v in variables if id(v) not in self._local]
        mtf.broadcast_variables(shared, root_rank=self.root_rank)

    def on_train_begin(self, logs=None):
        """Broadcasts the model's variables from root_rank."""
        self._broadcast(self.model.variables)

    def on_train_batch_end(self, batch, logs=None):
        """After the first batch, broadcasts the model's and the optimizer's
        variables once more (the optimizer creates its variables then)."""
        if self._done:
            return
        self._done = True
        self._broadcast(self.model.variables)
        self._broadcast(self.model.optimizer.variables)


class MetricAverageCallback(keras.callbacks.Callback):
    """Replaces each epoch's metrics by their average over ranks (one
    AllReduce per epoch; every rank must report the same metric names)."""

    def __init__(self, device=""):
        super().__init__()

    def on_epoch_end(self, epoch, logs=None):
        """Averages the epoch's metrics over all ranks, in place."""
        if not logs:
            return
        keys = sorted(logs)
        values = np.array([float(logs[k]) for k in keys], dtype=np.float64)
        averaged = mlfabric.allreduce(values, average=True)
        for k, v in zip(keys, averaged):
            logs[k] = float(v)


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets lr = initial_lr * multiplier(epoch) between start_epoch
    (inclusive) and end_epoch (exclusive; None = to the end). `multiplier`
    is a number or a function of the (fractional, unless staircase) epoch."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        if initial_lr is None or float(initial_lr) <= 0:
            raise ValueError("LearningRateScheduleCallback: initial_lr must be a positive "
                             "learning rate, got %r" % (initial_lr,))
        self.initial_lr = float(initial_lr)
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = 0

    def _in_range(self, epoch):
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _adjust(self, epoch):
        optimizer = self.model.optimizer
        old_lr = float(optimizer.learning_rate)
        new_lr = self.initial_lr * float(self.multiplier(epoch))
        if new_lr != old_lr:
            optimizer.learning_rate = new_lr  # assigns the optimizer's variable

    def on_train_begin(self, logs=None):
        """Learns steps_per_epoch from the fit when it was not given."""
        if self.steps_per_epoch is None:
            self.steps_per_epoch = self.params.get("steps") if self.params else None
        if not self.staircase and not self.steps_per_epoch:
            raise ValueError("%s: steps_per_epoch is unknown (pass it, or fit with a sized "
                             "dataset)" % type(self).__name__)

    def on_epoch_begin(self, epoch, logs=None):
        """Sets the epoch's learning rate (staircase schedules)."""
        self.current_epoch = epoch
        if self.staircase and self._in_range(epoch):
            self._adjust(epoch)

    def on_train_batch_begin(self, batch, logs=None):
        """Sets the batch's learning rate (smooth schedules)."""
        if self.staircase:
            return
        epoch = self.current_epoch + float(batch) / self.steps_per_epoch
        if self._in_range(epoch):
            self._adjust(epoch)

    def on_epoch_end(self, epoch, logs=None):
        """Reports the learning rate in the epoch's logs."""
        if logs is not None:
            logs["learning_rate"] = float(self.model.optimizer.learning_rate)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Gradual warm-up: the learning rate rises linearly, batch by batch,
    from initial_lr / size to initial_lr over `warmup_epochs` epochs."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True,
                 steps_per_epoch=None, verbose=0):
        def multiplier(epoch):
            size = mlfabric.size()
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        """Reports the learning rate, and the end of the warm-up once."""
        super().on_epoch_end(epoch, logs)
        if epoch == self.warmup_epochs - 1 and self.verbose > 0 and mlfabric.rank() == 0:
            print("\nEpoch %d: finished gradual learning rate warmup to %g."
                  % (epoch + 1, float(self.model.optimizer.learning_rate)))
