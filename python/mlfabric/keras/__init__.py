"""Keras 3: Horovod's `horovod.tensorflow.keras` API, and asynchronous PS training.

Synchronous data parallelism, written as for Horovod (only the import
line differs; run under `mlfabric-run -np N`):

    import tensorflow as tf, keras
    import mlfabric.keras as hvd
    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1 * hvd.size()),
                                   compression=hvd.Compression.fp16)
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    model.fit(x_shard, y_shard, callbacks=[
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1 * hvd.size(), warmup_epochs=3)])

Asynchronous parameter server (MLfabric-A, docs/architecture.md §3):

    trainer = hvd.AsyncPSTrainer(model, loss_fn, server="ps0", learning_rate=0.05)
    if hvd.rank() == 0: trainer.start_server()     # hosts the model (python=True: in numpy)
    stats = trainer.train(dataset_batches, steps=200)   # pushes -lr*grad per layer, gets the model
    stats["dropped"], stats["delays"]                   # dropped updates, delay of each applied one

A model split across S servers (a server group, docs/user-guide/sharded-servers.md):

    trainer = hvd.AsyncPSTrainer(model, loss_fn, server="ps", shards=2)
    if hvd.rank() < 2: trainer.start_server(shard=hvd.rank())  # "ps-0", "ps-1"
    trainer.train(batches, steps=200)        # pushes and gets the whole model of "ps"

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
from mlfabric import (cross_rank, cross_size, init, is_initialized, local_rank,  # noqa: F401
                      local_size, rank, shutdown, size)
from mlfabric.tensorflow import Average, Compression, Sum  # noqa: F401
from mlfabric.tensorflow import (allgather_object, broadcast_object, broadcast_object_fn,  # noqa: F401
                                 ccl_built, cuda_built, ddl_built, global_process_set, gloo_built,
                                 gloo_enabled, join, mpi_built, mpi_enabled, nccl_built,
                                 rocm_built)
from mlfabric.keras import callbacks  # noqa: F401
from mlfabric.keras import elastic  # noqa: F401  (hvd.elastic)
from mlfabric.keras.callbacks import (BroadcastGlobalVariablesCallback,  # noqa: F401
                                      MetricAverageCallback)

SyncBatchNormalization = mtf.SyncBatchNormalization  # with mlfabric.tensorflow's allreduce


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=Average,
                         backward_passes_per_step=1, average_aggregated_gradients=False,
                         num_groups=0, groups=None, process_set=None, scale_local_gradients=True,
                         reducer=None, average=None, backup_workers=0):
    """Wraps a Keras 3 optimizer so that each update applies the gradients
    averaged (op=Average, the default) or summed (op=Sum) over all ranks,
    as Horovod's `hvd.DistributedOptimizer`. The gradients of one step
    travel fused, one AllReduce per dtype for up to
    MLFABRIC_FUSION_THRESHOLD bytes (128 MiB unless set; 0 = one per
    tensor; mlfabric.tensorflow.grouped_allreduce), compressed by
    `compression`.

    backward_passes_per_step=N accumulates N local gradients and
    communicates and applies once every N steps (Keras's
    gradient_accumulation_steps does the accumulating); the accumulated
    gradient is their sum, or their mean with
    average_aggregated_gradients=True, as in Horovod. Sparse gradients
    (tf.IndexedSlices, e.g. of an Embedding) are allgathered as Horovod
    does, or reduced dense with sparse_as_dense=True.
    gradient_predivide_factor=f (op=Average only) sums gradients scaled by
    1/f and scales the sum by f/size, as Horovod. `device_*`, `num_groups`
    and `groups` (fusion is by dtype and threshold) are accepted and
    ignored; process_set must be the global set. `average` is MLfabric's
    earlier keyword (True = Average).

    backup_workers=b (MLfabric's, not Horovod's; Chen et al., 2016): each
    step's AllReduce sums the first size - b ranks' gradients to reach the
    scheduler; a rank whose gradients come later has them dropped
    (late_for_round) and applies the same sum, so every rank's weights stay
    equal. op=Average divides by the size - b gradients summed. Uses the
    mlfabric AllReduce backend, whatever init() chose."""
    return mtf._keras_distributed_optimizer(
        optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse,
        compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, num_groups=num_groups,
        groups=groups, process_set=process_set, scale_local_gradients=scale_local_gradients,
        reducer=reducer, average=average, backup_workers=backup_workers)


def PartialDistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                                compression=Compression.none, sparse_as_dense=False,
                                gradient_predivide_factor=1.0, op=Average,
                                backward_passes_per_step=1, average_aggregated_gradients=False,
                                groups=None, process_set=None, local_layers=None,
                                scale_local_gradients=True):
    """Horovod's PartialDistributedOptimizer: DistributedOptimizer, except
    that the gradients of `local_layers`' trainable weights (a layer or a
    list of layers) are applied without reducing them over ranks; with
    scale_local_gradients they are divided by the size, as Horovod does."""
    if local_layers is None:
        raise ValueError("mlfabric.keras.PartialDistributedOptimizer: local_layers is required "
                         "(a Keras layer or a list of layers); use DistributedOptimizer otherwise")
    return mtf._keras_distributed_optimizer(
        optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, groups=groups,
        process_set=process_set, local_layers=local_layers,
        scale_local_gradients=scale_local_gradients)


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none, legacy_opts=False):
    """Loads a saved Keras 3 model (keras.models.load_model) and makes its
    optimizer, with the state it was saved with, a DistributedOptimizer
    (Horovod's hvd.load_model). The loaded optimizer object becomes an
    instance of its distributed subclass, which adds behaviour and no
    state, so nothing is copied. `custom_optimizers` and `legacy_opts` are
    accepted and unused: any optimizer class, custom or not, is wrapped
    (custom classes still go in `custom_objects` for Keras to load them)."""
    del custom_optimizers, legacy_opts
    model = keras.models.load_model(filepath, custom_objects=custom_objects)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not type(optimizer).__name__.startswith("Distributed"):
        optimizer.__class__ = mtf._distributed_optimizer_class(type(optimizer),
                                                               compression=compression)
    return model


def allreduce(value, name=None, average=True, prescale_factor=1.0, postscale_factor=1.0,
              op=None, compression=Compression.none, process_set=None):
    """The average (or, with average=False or op=Sum, the sum) of a
    tensor-like value over ranks, as a tensor."""
    if op is not None:
        average = None
    return mtf.allreduce(tf.convert_to_tensor(value), average=average, op=op,
                         compression=compression, prescale_factor=prescale_factor,
                         postscale_factor=postscale_factor, name=name, process_set=process_set)


def allgather(value, name=None, process_set=None):
    """Every rank's value concatenated along the first dimension."""
    return mtf.allgather(tf.convert_to_tensor(value), name=name, process_set=process_set)


def broadcast(value, root_rank, name=None, process_set=None):
    """Rank `root_rank`'s value on every rank."""
    return mtf.broadcast(tf.convert_to_tensor(value), root_rank, name=name,
                         process_set=process_set)


def broadcast_variables(variables, root_rank=0, process_set=None):
    """Assigns rank `root_rank`'s values to `variables` on every rank."""
    mtf.broadcast_variables(variables, root_rank, process_set=process_set)


def broadcast_global_variables(root_rank):
    """Horovod's (TF1 graphs only; eagerly RuntimeError, as Horovod): see
    mlfabric.tensorflow.broadcast_global_variables."""
    return mtf.broadcast_global_variables(root_rank)


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
    computes a gradient on its next batch, and pushes -lr * gradient with
    that update's L2 norm (what the replica's divergence bound counts,
    mlfabric.md §5.3) and the model version it used; the server applies
    updates in the order the scheduler commits them (model += update), and the
    scheduler drops updates that would exceed the job's delay bound."""

    def __init__(self, model, loss_fn, server="ps0", learning_rate=0.05, worker=None,
                 shards=None):
        self.model = model
        self.loss_fn = loss_fn
        self.server = server
        self.learning_rate = learning_rate
        self.worker = worker or mlfabric.Worker()
        self._server = None
        # shards=S: `server` names a server group of S shards, each holding
        # a contiguous run of whole variables (mlfabric.partition, in
        # get_weights() order, balanced by bytes). Workers push and get the
        # whole model by the group's name; start_server(shard=i) hosts run i.
        self.shards = None
        if shards:
            sizes = [4 * int(np.prod(w.shape)) for w in model.get_weights()]
            self.shards = mlfabric.partition(sizes, shards, group=server)

    def start_server(self, python=False, shard=None):
        """Hosts the model in this process as server `server`: a C++
        SumServer (model += update), or with python=True an mlfabric.Server
        whose callbacks do the same in numpy. With shards=S, shard=i hosts
        shard i of the group instead, as server "<server>-<i>", holding its
        run of variables only."""
        initial = _flat(self.model.get_weights())
        name, spec = self.server, None
        if shard is not None:
            if self.shards is None:
                raise ValueError("AsyncPSTrainer.start_server(shard=%r): the trainer was made "
                                 "without shards=S" % (shard,))
            if not 0 <= int(shard) < len(self.shards):
                raise ValueError("AsyncPSTrainer.start_server: shard must be in [0, %d), got %r"
                                 % (len(self.shards), shard))
            spec = self.shards[int(shard)]
            name = "%s-%d" % (self.server, spec.index)
            initial = initial[spec.begin // 4:spec.end // 4].copy()
        if not python:
            self._server = mlfabric.SumServer(name, initial, shard=spec)
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

        server = mlfabric.Server(name, apply, lambda: (state["version"], model), shard=spec)
        state["version"] = server.initial_version
        server.applied_count = lambda: state["applied"]
        self._server = server.start()
        return self._server

    def stop_server(self):
        """Stops and closes the server start_server() started on this rank, if any."""
        if self._server is not None:
            self._server.stop()
            if isinstance(self._server, mlfabric.Server):
                self._server.close()
            self._server = None

    def server_applied(self):
        """Updates the server on this rank applied so far; -1 without one."""
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
            update = [(-self.learning_rate * g).astype(np.float32) for g in grads]
            # The norm of the update the server applies, not of the gradient:
            # the scheduler's divergence estimate adds these (§5.3, eq. 7-11).
            norm = float(np.sqrt(sum(float(np.sum(np.square(u, dtype=np.float64)))
                                     for u in update)))
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
