"""Horovod's `horovod.tensorflow` semantics, run in every rank by
//tests:horovod_tf_test under mlfabric-run (2 ranks). Checks, on every rank:
  1. gradients as Horovod defines them and as its test suite computes the
     expectations (test_horovod_allreduce_grad_cpu, ..._average_grad_cpu,
     ..._allgather_grad_cpu, ..._broadcast_grad_cpu): allreduce -> the
     allreduce of the upstream gradient with the same op, prescale and
     postscale; allgather -> the upstream gradient averaged over ranks, this
     rank's rows; broadcast -> that average on the root, zero elsewhere;
     eagerly and in a tf.function, float32 and float64, 1-3 dimensions;
     grouped_allreduce's fused tensors in different shapes on different
     ranks raise FailedPreconditionError naming both layouts;
  2. tf.IndexedSlices: allreduce and grouped_allreduce allgather values and
     indices (Average divides the values by the size, integers into floats
     as Horovod's `/` does); other ops and pre-/postscale factors raise
     NotImplementedError on every rank before anything moves; a Keras model with an
     Embedding trained by DistributedOptimizer (sparse, and
     sparse_as_dense=True) ends with identical weights on both ranks, equal
     to a single-process run on the concatenated batch;
  3. the small API: rank_op/size_op/local_rank_op/local_size_op/
     process_set_included_op, the build flags, join, grouped_allgather,
     allgather_object/broadcast_object/broadcast_object_fn (eagerly, at a
     tf.function's trace and in a TF1 session), broadcast_,
     gradient_predivide_factor, PartialDistributedGradientTape, Keras
     PartialDistributedOptimizer, BroadcastGlobalVariablesCallback with
     local_variables, load_model, broadcast_global_variables in a TF1
     session, and process_set errors (add_process_set, remove_process_set).
Prints "horovod_tf_check rank R: OK".
"""
import faulthandler
import itertools
import os
import sys
import tempfile

faulthandler.dump_traceback_later(270, exit=True)  # never hang the test
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf
import keras

import mlfabric
import mlfabric.keras as hvd_keras
import mlfabric.tensorflow as hvd

tf.get_logger().setLevel("ERROR")  # the per-case tf.functions retrace on purpose
hvd.init()
rank, size = hvd.rank(), hvd.size()
assert size == 2, "run with mlfabric-run -np 2"
failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)
        print("rank %d: FAILED %s" % (rank, what), file=sys.stderr, flush=True)


def close(got, want, what, tol=1e-8):
    """Horovod's tests' measure: the norm of the difference."""
    err = float(np.linalg.norm(np.asarray(want, np.float64) - np.asarray(got, np.float64)))
    expect(err < tol, "%s: gradient differs from expected, error %g" % (what, err))


def same_on_all_ranks(values, what):
    values = np.asarray(values, np.float64).ravel()
    root = hvd.broadcast(tf.constant(values), root_rank=0).numpy()
    expect(np.array_equal(values, root), "%s identical on every rank" % what)


print("horovod_tf_check rank %d: backend %s" % (rank, mlfabric.reducer().backend), flush=True)

# ---- 1. gradients.
for mode, dtype, dim in itertools.product(("eager", "tf.function"), (tf.float32, tf.float64),
                                          (1, 2, 3)):
    run = (lambda f: f()) if mode == "eager" else (lambda f: tf.function(f)())
    tag = "%s %s dim %d" % (mode, dtype.name, dim)
    tensor = tf.Variable(tf.random.uniform([5] * dim, -100, 100, dtype=dtype))

    def reduce_grad(**kwargs):
        with tf.GradientTape() as tape:
            out = hvd.allreduce(tensor, **kwargs)
        return tape.gradient(out, tensor, tf.ones([5] * dim, dtype))

    close(run(lambda: reduce_grad(op=hvd.Sum)), np.ones([5] * dim) * size, "Sum " + tag)
    close(run(lambda: reduce_grad(average=False)), np.ones([5] * dim) * size,
          "average=False " + tag)
    close(run(lambda: reduce_grad(op=hvd.Average)), np.ones([5] * dim), "Average " + tag)
    # postscale * sum(prescale * grad) = 3 * size * 2.
    close(run(lambda: reduce_grad(op=hvd.Sum, prescale_factor=2.0, postscale_factor=3.0)),
          np.ones([5] * dim) * 6 * size, "Sum with pre/postscale " + tag)
    close(run(lambda: reduce_grad(op=hvd.Average, prescale_factor=0.5)),
          np.ones([5] * dim) * 0.5, "Average with prescale " + tag)

    rows = [3, 2][:size]
    gather_in = tf.Variable(tf.ones([rows[rank]] + [17] * (dim - 1), dtype) * rank)

    def gather_grad():
        with tf.GradientTape() as tape:
            gathered = hvd.allgather(gather_in)
        grad_ys = tf.concat([tf.ones([n] + [17] * (dim - 1), dtype) * r
                             for r, n in enumerate(rows)], axis=0)
        return tape.gradient(gathered, gather_in, grad_ys)

    close(run(gather_grad), np.ones([rows[rank]] + [17] * (dim - 1)) * rank, "allgather " + tag)

    for root in range(size):
        bcast_in = tf.Variable(tf.ones([5] * dim, dtype) * rank)

        def bcast_grad():
            with tf.GradientTape() as tape:
                out = hvd.broadcast(bcast_in, root)
            return tape.gradient(out, bcast_in)

        close(run(bcast_grad), np.ones([5] * dim) * (1 if rank == root else 0),
              "broadcast root %d %s" % (root, tag))

# A graph with two independent collectives and their gradients: every rank
# runs them in the order they were created (they would otherwise race).
a, b = tf.Variable([1.0 + rank, 2.0]), tf.Variable([10.0 * (rank + 1)])


@tf.function
def two_collectives():
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(hvd.allreduce(a, op=hvd.Sum) * 2.0) + tf.reduce_sum(
            hvd.allgather(b) * tf.constant([1.0, 5.0]))
    return tape.gradient(loss, [a, b])


for _ in range(3):
    ga, gb = two_collectives()
    close(ga.numpy(), [2.0 * size] * 2, "tf.function: gradient of a Sum allreduce")
    close(gb.numpy(), [[1.0, 5.0][rank]], "tf.function: gradient of an allgather")
gathered = tf.function(lambda: hvd.allgather(tf.fill([rank + 1, 2], float(rank))))().numpy()
expect(np.array_equal(gathered, [[0, 0], [1, 1], [1, 1]]), "allgather in a tf.function")
gathered_bool = hvd.allgather(tf.constant([[rank == 0, True, False]] * (rank + 1))).numpy()
expect(gathered_bool.tolist() == [[True, True, False]] + [[False, True, False]] * 2,
       "allgather of bool")
# Rows of the same length in different shapes: every rank fails naming both
# (Horovod's shape check), eagerly and in a tf.function; then it goes on.
for mode, call in (("eagerly", lambda f: f()), ("in a tf.function", lambda f: tf.function(f)())):
    try:
        call(lambda: hvd.allgather(tf.ones([1, 2, 6] if rank == 0 else [1, 3, 4])))
        expect(False, "allgather of row shapes [2, 6] and [3, 4] %s: no error" % mode)
    except tf.errors.FailedPreconditionError as e:
        expect("Mismatched Allgather tensor shapes: rank 0 passed shape [2, 6] while rank 1 "
               "passed shape [3, 4]" in str(e), "allgather row shape mismatch %s: %s" % (mode, e))
# A fused buffer of the same length and dtype whose tensors' shapes differ
# ([3, 4] and [5] on rank 0, [4, 3] and [5] elsewhere): every rank fails
# naming both layouts, eagerly and while a tf.function is traced, before
# any data moves; the layout every rank passes is then summed as before.
for mode, call in (("eagerly", lambda f: f()), ("in a tf.function", lambda f: tf.function(f)())):
    try:
        call(lambda: hvd.grouped_allreduce(
            [tf.ones([3, 4] if rank == 0 else [4, 3]), tf.ones([5])], op=hvd.Sum))
        expect(False, "grouped_allreduce of [3, 4] against [4, 3] %s: no error" % mode)
    except tf.errors.FailedPreconditionError as e:
        expect("Mismatched fused tensor shapes: rank 0 passed float32[3, 4], float32[5] while "
               "rank 1 passed float32[4, 3], float32[5]" in str(e),
               "grouped_allreduce layout mismatch %s: %s" % (mode, e))
    fused = call(lambda: hvd.grouped_allreduce([tf.ones([3, 4]), tf.ones([5])], op=hvd.Sum))
    expect(all(np.array_equal(t.numpy(), np.full(t.shape, size, np.float32)) for t in fused),
           "grouped_allreduce after a layout mismatch %s" % mode)

# ---- 2. tf.IndexedSlices.
slices = tf.IndexedSlices(tf.constant([[1.0, 2.0], [3.0, 4.0]]) * (rank + 1),
                          tf.constant([rank, rank + 1], tf.int64), tf.constant([4, 2], tf.int64))
for op, scale in ((hvd.Sum, 1.0), (hvd.Average, 1.0 / size)):
    out = hvd.allreduce(slices, op=op)
    expect(isinstance(out, tf.IndexedSlices), "allreduce of IndexedSlices stays IndexedSlices")
    want_values = np.concatenate([np.array([[1.0, 2.0], [3.0, 4.0]]) * (r + 1) * scale
                                  for r in range(size)])
    expect(np.allclose(out.values.numpy(), want_values), "IndexedSlices values %s" % op)
    expect(list(out.indices.numpy()) == [i for r in range(size) for i in (r, r + 1)],
           "IndexedSlices indices %s" % op)
    dense = hvd.allreduce(tf.convert_to_tensor(slices), op=op).numpy()
    expect(np.allclose(tf.convert_to_tensor(out).numpy(), dense),
           "IndexedSlices %s equals the dense allreduce" % op)
mixed = hvd.grouped_allreduce([slices, tf.constant([1.0, rank]), None], op=hvd.Sum)
expect(isinstance(mixed[0], tf.IndexedSlices) and mixed[2] is None
       and np.allclose(mixed[1].numpy(), [size, sum(range(size))]),
       "grouped_allreduce of IndexedSlices, a tensor and None")
# Horovod's refusals (test_horovod_allreduce_indexed_slices_op_error and
# ..._prescale_postscale_error), raised before any collective, so the ranks
# stay in step: the next call below still pairs up.
for call, what in ((lambda: hvd.allreduce(slices, op=hvd.Min), "op=Min"),
                   (lambda: hvd.allreduce(slices, op=hvd.Product), "op=Product"),
                   (lambda: hvd.allreduce(slices, op=hvd.Adasum), "op=Adasum"),
                   (lambda: hvd.allreduce(slices, op=hvd.Sum, prescale_factor=0.5), "prescale"),
                   (lambda: hvd.allreduce(slices, average=False, postscale_factor=2.0),
                    "postscale"),
                   (lambda: hvd.grouped_allreduce([tf.constant([1.0]), slices], op=hvd.Max),
                    "grouped op=Max")):
    try:
        call()
        expect(False, "IndexedSlices with %s: no error" % what)
    except NotImplementedError as e:
        expect("IndexedSlices" in str(e), "IndexedSlices with %s: %s" % (what, e))
# Average of integer values: floats, as Horovod's values / size (the test
# suite subtracts a float reference: test_horovod_allreduce_indexed_slices_average_cpu).
int_slices = tf.IndexedSlices(tf.constant([[3, 5]], tf.int32) * (rank + 1),
                              tf.constant([0], tf.int64), tf.constant([1, 2], tf.int64))
for out in (hvd.allreduce(int_slices, op=hvd.Average),
            hvd.grouped_allreduce([int_slices, tf.constant([2], tf.int32)], op=hvd.Average)[0]):
    expect(out.values.dtype == tf.float64, "int32 IndexedSlices averaged into float64, got %s"
           % out.values.dtype)
    expect(np.allclose(out.values.numpy(),
                       [[3.0 * (r + 1) / size, 5.0 * (r + 1) / size] for r in range(size)]),
           "int32 IndexedSlices average values %s" % out.values.numpy())


def embedding_model():
    keras.utils.set_random_seed(11)
    return keras.Sequential([keras.Input((4,), dtype="int32"), keras.layers.Embedding(20, 3),
                             keras.layers.Flatten(), keras.layers.Dense(1)])


data = np.random.RandomState(5)
ids = data.randint(0, 20, size=(6, 16, 4)).astype(np.int32)
targets = data.normal(size=(6, 16, 1)).astype(np.float32)
reference = embedding_model()
reference.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.5), loss="mse",
                  jit_compile=False)
for step in range(len(ids)):
    reference.train_on_batch(ids[step], targets[step])
with tf.GradientTape() as tape:
    m = embedding_model()
    loss = tf.reduce_mean(m(ids[0][rank::size]))
grads = hvd.DistributedGradientTape(tape).gradient(loss, m.trainable_variables)
expect(isinstance(grads[0], tf.IndexedSlices), "the Embedding's gradient is an IndexedSlices")
for sparse_as_dense in (False, True):
    model = embedding_model()
    model.compile(optimizer=hvd_keras.DistributedOptimizer(
        keras.optimizers.SGD(0.1, momentum=0.5), sparse_as_dense=sparse_as_dense),
        loss="mse", jit_compile=False)
    for step in range(len(ids)):
        model.train_on_batch(ids[step][rank::size], targets[step][rank::size])
    weights = np.concatenate([w.ravel() for w in model.get_weights()])
    want = np.concatenate([w.ravel() for w in reference.get_weights()])
    same_on_all_ranks(weights, "Embedding weights (sparse_as_dense=%s)" % sparse_as_dense)
    gap = float(np.max(np.abs(weights - want)))
    expect(gap < 1e-5, "Embedding model (sparse_as_dense=%s) matches the single-process run on "
           "the concatenated batch (max gap %.2g)" % (sparse_as_dense, gap))

# ---- 3. the small API.
for mode in ("eager", "tf.function"):
    run = (lambda f: f()) if mode == "eager" else (lambda f: tf.function(f)())
    values = run(lambda: tf.stack([hvd.rank_op(), hvd.size_op(), hvd.local_rank_op(),
                                   hvd.local_size_op(), hvd.process_set_included_op()]))
    expect(list(values.numpy()) == [rank, size, hvd.local_rank(), hvd.local_size(), 1],
           "rank_op etc. (%s): %s" % (mode, values.numpy()))
    expect(int(run(hvd.join).numpy()) == -1, "join returns -1 (%s)" % mode)
backend = mlfabric.reducer().backend
expect(hvd.mpi_built() is True and hvd.mpi_enabled() == (backend == "mpi"), "mpi flags")
expect(not any(f() for f in (hvd.gloo_built, hvd.gloo_enabled, hvd.cuda_built, hvd.rocm_built,
                             hvd.ddl_built, hvd.ccl_built)), "absent backends report False")
expect((hvd.nccl_built() > 0) == (backend == "nccl"), "nccl_built")
g1, g2 = hvd.grouped_allgather([tf.fill([rank + 1], rank), tf.constant([[rank * 1.5]])])
expect(list(g1.numpy()) == [0, 1, 1] and g2.numpy().ravel().tolist() == [0.0, 1.5],
       "grouped_allgather")
objects = hvd.allgather_object({"rank": rank, "text": "x" * (rank * 9)})
expect(objects == [{"rank": r, "text": "x" * (r * 9)} for r in range(size)], "allgather_object")
got = hvd.broadcast_object({"from": rank, "list": list(range(rank + 3))} if rank == 1 else None,
                           root_rank=1)
expect(got == {"from": 1, "list": [0, 1, 2, 3]}, "broadcast_object: %r" % (got,))
expect(hvd.broadcast_object_fn(root_rank=0)(("t", rank)) == ("t", 0), "broadcast_object_fn")
v1, v2 = tf.Variable([float(rank), 2.0]), tf.Variable([rank * 10], dtype=tf.int64)
values = hvd.broadcast_([v1, v2], root_rank=1)
expect(v1.numpy().tolist() == [1.0, 2.0] and v2.numpy().tolist() == [10]
       and values[0].numpy().tolist() == [1.0, 2.0], "broadcast_ assigns in place")
v3 = tf.Variable([float(rank)])
tf.function(lambda: hvd.broadcast_variables([v3], root_rank=1))()
expect(v3.numpy().tolist() == [1.0], "broadcast_variables in a tf.function")
# A TF1 graph and session: broadcast_global_variables' op sets every global
# variable to rank 1's value; eagerly it refuses, as Horovod's.
with tf.Graph().as_default():
    g1 = tf.compat.v1.Variable([float(rank), 5.0 * rank])
    g2 = tf.compat.v1.Variable(rank + 7, dtype=tf.int32)
    bcast_op = hvd.broadcast_global_variables(1)
    with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        session.run(bcast_op)
        got = session.run([g1, g2])
expect(got[0].tolist() == [1.0, 5.0] and int(got[1]) == 8,
       "broadcast_global_variables in a TF1 session: %r" % (got,))
# The object collectives in graphs, as Horovod's. In a tf.function the
# objects cross the ranks at trace time and the trace keeps them (a second
# call does not retrace). In a TF1 graph they run at once in the default or
# the given session, outside the graph's order of collectives: a collective
# op created later does not depend on them (or every later step would run
# them again).
traced = []


@tf.function(autograph=False)
def objects_in_function(x):
    traced.append((hvd.allgather_object({"r": rank}),
                   hvd.broadcast_object(("root", rank), root_rank=1)))
    return hvd.allreduce(x, op=hvd.Sum)


for _ in range(2):
    out = objects_in_function(tf.constant([1.0, 2.0]))
expect(traced == [([{"r": 0}, {"r": 1}], ("root", 1))] and out.numpy().tolist() == [2.0, 4.0],
       "object collectives in a tf.function: %r, %r" % (traced, out))
with tf.Graph().as_default() as graph:
    x = tf.compat.v1.placeholder(tf.float32, [2])
    total = hvd.allreduce(x, op=hvd.Sum)
    with tf.compat.v1.Session() as session:
        before = len(graph.get_operations())
        gathered = hvd.allgather_object({"r": rank, "pad": "y" * rank})
        sent = hvd.broadcast_object(("root", rank), root_rank=1, session=session)
        objects_ops = set(graph.get_operations()[before:])
        after = hvd.allreduce(x * 2.0, op=hvd.Sum)
        got = session.run([total, after], {x: [1.0, 2.0]})
expect(gathered == [{"r": 0, "pad": ""}, {"r": 1, "pad": "y"}] and sent == ("root", 1),
       "object collectives in a TF1 session: %r, %r" % (gathered, sent))
expect(got[0].tolist() == [2.0, 4.0] and got[1].tolist() == [4.0, 8.0],
       "collectives around the object collectives in a TF1 session: %r" % (got,))
later = [op for op in graph.get_operations() if op.type == "MlfabricAllreduce"][-1]
expect(not objects_ops.intersection(later.control_inputs),
       "a later collective depends on the object collectives: %r" % (later.control_inputs,))
with tf.Graph().as_default():
    try:
        hvd.broadcast_object(1)
        expect(False, "broadcast_object in a graph without a session: nothing raised")
    except RuntimeError as e:
        expect("session" in str(e), "no session: %s" % e)
for module in (hvd, hvd_keras):
    try:
        module.broadcast_global_variables(0)
        expect(False, "broadcast_global_variables eagerly: nothing raised")
    except RuntimeError as e:
        expect("broadcast_variables" in str(e), "eager broadcast_global_variables: %s" % e)
for fn, arg, text in ((hvd.add_process_set, [0], "ranks [0]"),
                      (hvd.remove_process_set, hvd.global_process_set, "cannot be removed")):
    try:
        fn(arg)
        expect(False, "%s: nothing raised" % fn.__name__)
    except ValueError as e:
        expect(text in str(e) and "only the global process set" in str(e),
               "%s: %s" % (fn.__name__, e))

w = tf.Variable([1.0, 2.0])
x_local = tf.constant([1.0 + rank, 3.0 * rank])
for factor in (1.0, 4.0):
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * x_local)
    g = hvd.DistributedGradientTape(tape, gradient_predivide_factor=factor).gradient(loss, w)
    expect(np.allclose(g.numpy(), [(1 + 2) / 2, 3 / 2]),
           "gradient_predivide_factor=%g averages: %s" % (factor, g.numpy()))

dense1, dense2 = keras.layers.Dense(2), keras.layers.Dense(1)
net = keras.Sequential([keras.Input((3,)), dense1, dense2])
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(net(tf.ones([1, 3]) * (rank + 1)))
raw = tape.gradient(loss, net.trainable_variables)
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(net(tf.ones([1, 3]) * (rank + 1)))
partial = hvd.PartialDistributedGradientTape(tape, local_layers=[dense2]).gradient(
    loss, net.trainable_variables)
local_refs = {id(v) for v in dense2.trainable_weights}
for v, r, p in zip(net.trainable_variables, raw, partial):
    want = r.numpy() / size if id(v) in local_refs else hvd.allreduce(r).numpy()
    expect(np.allclose(p.numpy(), want, atol=1e-6),
           "PartialDistributedGradientTape %s (local %s)" % (v.name, id(v) in local_refs))

keras.utils.set_random_seed(3)
head = keras.layers.Dense(1, name="local_head")
pnet = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="shared"), head])
pnet.compile(optimizer=hvd_keras.PartialDistributedOptimizer(keras.optimizers.SGD(0.1),
                                                             local_layers=[head]),
             loss="mse", jit_compile=False)
xs = np.random.RandomState(20 + rank).normal(size=(8, 4)).astype(np.float32)
pnet.fit(xs, xs[:, :1] * (rank + 1), epochs=2, batch_size=4, verbose=0,
         callbacks=[hvd_keras.callbacks.BroadcastGlobalVariablesCallback(
             0, local_variables=head.trainable_weights)])
same_on_all_ranks(pnet.get_layer("shared").get_weights()[0], "shared layer (partial optimizer)")
theirs = hvd.allgather(tf.constant(head.get_weights()[0][None])).numpy()[1 - rank]
expect(not np.array_equal(theirs, head.get_weights()[0]),
       "a local layer keeps each rank's own weights")

path = os.path.join(tempfile.gettempdir(), "horovod_tf_check_%d.keras" % rank)
saved = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
saved.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse", jit_compile=False)
saved.train_on_batch(np.ones((2, 2), np.float32), np.ones((2, 1), np.float32))
hvd.broadcast_variables(saved.variables + saved.optimizer.variables, root_rank=0)
saved.save(path)
loaded = hvd_keras.load_model(path)
expect(type(loaded.optimizer).__name__ == "DistributedSGD", "load_model wraps the optimizer "
       "(%s)" % type(loaded.optimizer).__name__)
expect(int(loaded.optimizer.iterations.numpy()) == 1, "load_model keeps the optimizer state")
loaded.train_on_batch(np.full((2, 2), rank + 1.0, np.float32), np.zeros((2, 1), np.float32))
same_on_all_ranks(np.concatenate([w.ravel() for w in loaded.get_weights()]),
                  "a loaded model's weights after a distributed step")
os.remove(path)

for bad in (lambda: hvd.allreduce(tf.ones([1]), process_set=object()),
            lambda: hvd.allgather(tf.ones([1]), process_set="odd ranks"),
            lambda: hvd.size_op(process_set_id=1)):
    try:
        bad()
        expect(False, "a process set other than the global one raises")
    except ValueError as e:
        expect("process_set" in str(e), "the error names the process set: %s" % e)
expect(hvd.allreduce(tf.ones([1]), process_set=hvd.global_process_set).numpy()[0] == 1.0,
       "the global process set is accepted")

hvd.allreduce(tf.zeros([1]))  # every rank is done before any leaves
if failures:
    sys.exit("horovod_tf_check rank %d: %d failures" % (rank, len(failures)))
print("horovod_tf_check rank %d: OK" % rank, flush=True)
