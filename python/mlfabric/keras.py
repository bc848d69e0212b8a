"""Keras 3 wrappers: synchronous data parallelism and asynchronous PS training.

Synchronous (Horovod-like):

    import keras, mlfabric, mlfabric.keras as mk
    mlfabric.init()
    opt = mk.DistributedOptimizer(keras.optimizers.SGD(0.1 * mlfabric.size()))
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    model.fit(x_shard, y_shard, callbacks=[mk.BroadcastGlobalVariablesCallback(0),
                                           mk.MetricAverageCallback()])

Asynchronous parameter server (MLfabric-A, DESIGN.md §3):

    trainer = mk.AsyncPSTrainer(model, loss_fn, server="ps0", learning_rate=0.05)
    if mlfabric.rank() == 0: trainer.start_server()     # hosts the model (python=True: in numpy)
    stats = trainer.train(dataset_batches, steps=200)   # pushes -lr*grad per layer, gets the model
    stats["dropped"], stats["delays"]                   # dropped updates, delay of each applied one

Each push carries the model's tensors in layer order with priorities 0, 1,
2, ... (front layers first: the next forward pass needs them first; lower =
sent first, api/mlfabric.h TensorSpec).

`jit_compile=False` is required: XLA cannot compile the MLfabric ops.
"""
import numpy as np
import keras
import tensorflow as tf

import mlfabric
from mlfabric import tensorflow as mtf


def DistributedOptimizer(optimizer, average=True, reducer=None):
    """Wraps a Keras 3 optimizer so `apply(grads, vars)` first averages the
    gradients over all ranks with one fused AllReduce."""
    base = type(optimizer)

    class _Distributed(base):
        def apply(self, grads, trainable_variables=None):
            grads = mtf.allreduce_list(list(grads), average=average,
                                       reducer=reducer or mlfabric.reducer())
            return super().apply(grads, trainable_variables)

    _Distributed.__name__ = "Distributed" + base.__name__
    return _Distributed.from_config(optimizer.get_config())


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Makes every rank start from rank `root`'s weights."""

    def __init__(self, root=0):
        super().__init__()
        self.root = root

    def on_train_begin(self, logs=None):
        mtf.broadcast_variables(self.model.variables, root=self.root)


class MetricAverageCallback(keras.callbacks.Callback):
    """Replaces each epoch's metrics by their average over ranks."""

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        keys = sorted(logs)
        values = np.array([float(logs[k]) for k in keys], dtype=np.float64)
        averaged = mlfabric.allreduce(values, average=True)
        for k, v in zip(keys, averaged):
            logs[k] = float(v)


def _flat(arrays):
    return np.concatenate([np.asarray(a, dtype=np.float32).ravel() for a in arrays])


def _unflat(flat, like):
    out, i = [], 0
    for a in like:
        n = int(np.prod(a.shape))
        out.append(flat[i:i + n].reshape(a.shape))
        i += n
    return out


class AsyncPSTrainer:
    """Asynchronous PS training through MLfabric: each worker gets the model,
    computes a gradient on its next batch, and pushes -lr * gradient with the
    gradient's L2 norm and the model version it used; the server applies
    updates in the order the scheduler commits them (model += update), and the
    scheduler drops updates that would exceed the job's delay bound."""

    def __init__(self, model, loss_fn, server="ps0", learning_rate=0.05, worker=None):
        self.model = model
        self.loss_fn = loss_fn
        self.server = server
        self.learning_rate = learning_rate
        self.worker = worker or mlfabric.Worker()
        self._server = None

    def start_server(self, python=False):
        """Hosts the model in this process as server `server`: a C++
        SumServer (model += update), or with python=True an mlfabric.Server
        whose callbacks do the same in numpy."""
        initial = _flat(self.model.get_weights())
        if not python:
            self._server = mlfabric.SumServer(self.server, initial)
            return self._server
        model, state = initial.copy(), {"version": 0, "applied": 0}

        def apply(update):
            values = update.array(np.float32)
            if values.size != model.size:
                raise ValueError("update of %d floats for a model of %d" % (values.size, model.size))
            model[:] += values
            state["version"] += update.count
            state["applied"] += update.count
            return state["version"]

        server = mlfabric.Server(self.server, apply, lambda: (state["version"], model))
        state["version"] = server.initial_version
        server.applied_count = lambda: state["applied"]
        self._server = server.start()
        return self._server

    def stop_server(self):
        if self._server is not None:
            self._server.stop()
            if isinstance(self._server, mlfabric.Server):
                self._server.close()
            self._server = None

    def server_applied(self):
        if self._server is None:
            return -1
        if isinstance(self._server, mlfabric.Server):
            return self._server.applied_count()
        return self._server.applied

    def pull(self):
        """Loads the server's model into the local model; returns its version."""
        import time
        deadline = time.time() + 60
        while True:
            try:
                version, data = self.worker.get(self.server)
                break
            except RuntimeError:
                if time.time() > deadline:
                    raise
                time.sleep(0.1)  # the server may still be registering
        flat = np.frombuffer(data, dtype=np.float32)
        self.model.set_weights(_unflat(flat, self.model.get_weights()))
        return version

    @tf.function(reduce_retracing=True)
    def _grads(self, x, y):
        with tf.GradientTape() as tape:
            loss = self.loss_fn(y, self.model(x, training=True))
        return loss, tape.gradient(loss, self.model.trainable_variables)

    def train(self, batches, steps, priorities=None):
        """Runs `steps` get/compute/push rounds over the iterator `batches`
        of (x, y); returns {"applied", "dropped", "failed", "delays", "losses",
        "drop_reasons", "fail_reasons"}. Each push holds one tensor per
        weight, with `priorities` (default: layer order)."""
        if len(self.model.trainable_variables) != len(self.model.get_weights()):
            raise ValueError("AsyncPSTrainer needs a model whose weights are all trainable")
        stats = {"applied": 0, "dropped": 0, "failed": 0, "delays": [], "losses": [],
                 "drop_reasons": {}, "fail_reasons": {}}
        for _ in range(steps):
            version = self.pull()
            x, y = next(batches)
            loss, grads = self._grads(tf.convert_to_tensor(x), tf.convert_to_tensor(y))
            grads = [np.asarray(g, dtype=np.float32) for g in grads]
            norm = float(np.sqrt(sum(float(np.sum(np.square(g, dtype=np.float64)))
                                     for g in grads)))
            update = [(-self.learning_rate * g).astype(np.float32) for g in grads]
            result = self.worker.push(self.server, update, version, norm,
                                      priorities=priorities, raise_on_failure=False)
            stats["losses"].append(float(loss))
            outcome = result["outcome"]
            stats[outcome] += 1
            if outcome == "applied":
                stats["delays"].append(int(result["delay"]))
            else:
                key = "drop_reasons" if outcome == "dropped" else "fail_reasons"
                reason = result["reason"]
                stats[key][reason] = stats[key].get(reason, 0) + 1
        return stats
