"""MLfabric for Python: push/get to parameter servers and AllReduce.

Horovod-like use (launch with `mlfabric-run -np 4 python3 train.py`):

    import mlfabric
    mlfabric.init()                     # backend "auto": mpi under mlfabric-run
    print(mlfabric.rank(), mlfabric.size())
    total = mlfabric.allreduce(np.ones(3, np.float32))
    rows, received = mlfabric.alltoall(x, splits=[2, 1])   # Horovod's alltoall
    mine = mlfabric.reducescatter(x, op=mlfabric.Sum)       # this rank's rows

Classes (pybind11 binding of the C++ API in api/):
    AllReducer(backend="auto"|"mlfabric"|"mpi"|"nccl", socket="", job="", token="")
    Worker(socket="", job="", token="", name="", delay_bound=None, divergence_bound=None):
        push(server, array_or_list_of_arrays, version, norm=None, priorities=None),
        push_nowait(...), get(server) -> (version, bytes)
    Server(name, update=None, request=None, ...): a parameter server whose
        update callback (Update -> new version) and request callback
        (-> (version, bytes-like)) are Python functions; serve() or start()
    Replica(server, update=None, request=None, promotion=None, ...): a replica of
        `server` (§5.3); when the server dies it is promoted: promotion(p), then request();
        install=fn(version, bytes) starts it from a snapshot of the server's model
    SumServer(name, initial_float32): a C++ parameter server applying model += update
    Shard(group, index, count, begin, end), partition(sizes, count): server groups,
        a model split across several servers (both server classes take shard=...)
Empty socket/job/token come from MLFABRIC_DAEMON_SOCKET/MLFABRIC_JOB/...
which mlfabric-run sets; bounds None = the job's (mlfabric-run --delay_bound).
Errors raise ValueError (bad input, e.g. shapes that differ across ranks, a
negative delay bound), TypeError (unsupported dtype), PermissionError (a
push to another job's server), PushFailedError (a push that failed) or
RuntimeError. A collective whose round failed because a worker left the
job raises mlfabric.elastic.MembershipChangedError (a RuntimeError), which
mlfabric.elastic.run recovers from.
"""
import atexit
import collections
import os
import re
import threading
import time
import weakref

import numpy as np

from mlfabric import _lib
from mlfabric import _elastic_errors  # a worker leaving: MembershipChangedError

_ext = _lib.load_extension()
AllReducer = _ext.AllReducer
Worker = _ext.Worker


class SumServer(_ext.SumServer):
    """A C++ parameter server applying model += update (float32), serving on
    its own thread from construction; shard=mlfabric.Shard(...) makes it one
    shard of a server group, `initial` then being its part of the model."""

    def __init__(self, name, initial, socket="", job="", token="", shard=None):
        _ext.SumServer.__init__(self, name, initial, socket=socket, job=job, token=token,
                                shard=_shard_tuple(shard))

PendingPush = _ext.PendingPush
Update = _ext.Update
Promotion = _ext.Promotion
PushFailedError = _ext.PushFailedError

_serving = weakref.WeakSet()

Shard = collections.namedtuple("Shard", "group index count begin end")
Shard.__doc__ = """One shard of a server group (docs/user-guide/sharded-servers.md): the server
holding bytes [begin, end) of the model that workers push to and get from by
the group's name. Shard 0 begins at 0; each begins where the one before ends."""


def _shard_tuple(shard):
    """`shard` as the (group, index, count, begin, end) the binding takes."""
    if shard is None:
        return None
    try:
        group, index, count, begin, end = shard
        return (str(group), int(index), int(count), int(begin), int(end))
    except (TypeError, ValueError):
        raise ValueError("shard: expected mlfabric.Shard(group, index, count, begin, end), "
                         "got %r" % (shard,)) from None


def partition(sizes, count, group=None):
    """Splits a model whose tensors have `sizes` bytes, in push order, into
    `count` shards of whole tensors: contiguous runs of tensors whose byte
    totals are as even as the tensor boundaries allow. Returns the shards'
    (begin, end) byte ranges, or Shard tuples of `group` when it is given.

        sizes = [w.nbytes for w in model.get_weights()]
        shards = mlfabric.partition(sizes, 2, group="ps")   # shards[i] for server i
    """
    sizes = [int(s) for s in sizes]
    count = int(count)
    if any(s <= 0 for s in sizes):
        raise ValueError("partition: every tensor size must be positive, got %r" % (sizes,))
    if not 1 <= count <= min(64, len(sizes)):
        raise ValueError("partition: count must be in [1, min(64, %d tensors)], got %d"
                         % (len(sizes), count))
    ends = list(np.cumsum(sizes))
    total = ends[-1]
    cuts, last = [], 0  # cuts[k]: how many tensors shards 0..k hold
    for k in range(1, count):
        # The boundary nearest the ideal, leaving a tensor for each later shard.
        lo, hi = last + 1, len(sizes) - (count - k)
        best = min(range(lo, hi + 1), key=lambda i: abs(ends[i - 1] - total * k / count))
        cuts.append(best)
        last = best
    cuts.append(len(sizes))
    ranges, begin = [], 0
    for c in cuts:
        ranges.append((begin, int(ends[c - 1])))
        begin = int(ends[c - 1])
    if group is None:
        return ranges
    return [Shard(group, i, count, b, e) for i, (b, e) in enumerate(ranges)]


class _Serving:
    """start()/stop() and `with` for servers and replicas: serve() runs on a
    background thread (the GIL is released while it waits; callbacks take
    it). An error that ends serving is kept in `.error` and raised by stop()."""

    def _init_serving(self, update, request):
        """What a server's and a replica's __init__ share: not serving yet,
        and the update and request callbacks when given."""
        self._thread = None
        self.error = None
        if update is not None:
            self.register_update_callback(update)
        if request is not None:
            self.register_request_callback(request)

    def start(self):
        if getattr(self, "_thread", None) is not None:
            raise RuntimeError("%r is already serving" % self)
        self.error = None

        def run():
            try:
                self.serve()
            except BaseException as e:  # kept for stop(); the thread must not die noisily
                self.error = e

        self._thread = threading.Thread(target=run, name="mlfabric-serve", daemon=True)
        self._thread.start()
        _serving.add(self)
        return self

    def stop(self, timeout=30.0):
        """Stops serving (pending updates fail or are re-planned by the
        scheduler) and waits for the serving thread; raises its error."""
        super().stop()
        thread, self._thread = getattr(self, "_thread", None), None
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                raise RuntimeError("%r did not stop within %.0f s" % (self, timeout))
        _serving.discard(self)
        if getattr(self, "error", None) is not None:
            error, self.error = self.error, None
            raise error

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        self.close()


class Server(_Serving, _ext.Server):
    """A parameter server whose model lives in Python.

        model = np.zeros(n, np.float32); version = [0]
        def apply(u):                    # u: mlfabric.Update, in commit order
            model[:] += u.array(np.float32)   # a view valid during the call
            version[0] += u.count        # an aggregate of `count` pushes (§5.2)
            return version[0]
        with mlfabric.Server("ps0", apply, lambda: (version[0], model)):
            ...                          # serving on a background thread

    An exception in a callback fails that push (or get) with its text.
    shard=mlfabric.Shard(...) makes it one shard of a server group: its
    callbacks see and serve its own bytes of the model only."""

    def __init__(self, name, update=None, request=None, socket="", job="", token="",
                 delay_bound=None, divergence_bound=None, shard=None):
        _ext.Server.__init__(self, name, socket=socket, job=job, token=token,
                             delay_bound=delay_bound, divergence_bound=divergence_bound,
                             shard=_shard_tuple(shard))
        self._init_serving(update, request)

    def __repr__(self):
        return "<mlfabric.Server %r>" % self.name


class Replica(_Serving, _ext.Replica):
    """A replica of server `server` (mlfabric.md §5.3): its update callback
    applies the updates the scheduler replicates to it, in order.

    Failover (§3.3): when the server dies the scheduler promotes the replica:
    promotion(p) runs once, then the replica serves the workers' gets via
    request() and keeps applying updates; continue version numbers from
    p.model_version. `p` is a Promotion (server, old_host, reason,
    model_version); `.promoted` turns True. request has the contract of a
    Server's: it returns (version, bytes-like). Without it, gets to a
    promoted replica fail; an exception in promotion is reported and serving
    goes on.

        def promote(p):
            version[0] = max(version[0], p.model_version)
        mlfabric.Replica("ps0", apply, lambda: (version[0], model), promote).start()

    A replica started while its server already holds a model (mid-training,
    or a new standby after a failover) passes install: the scheduler has
    the server's daemon send a snapshot of the model at a cut in its commit
    order, install(version, data) replaces the replica's model with it
    (data: bytes), and the copies of every update after the cut follow.
    The replica is not promoted before it installed one.

        def install(v, data):
            model[:] = np.frombuffer(data, np.float32); version[0] = v
        mlfabric.Replica("ps0", apply, lambda: (version[0], model), install=install)
    """

    def __init__(self, server, update=None, request=None, promotion=None, name="", socket="",
                 job="", token="", delay_bound=None, divergence_bound=None, install=None):
        _ext.Replica.__init__(self, server, name=name, socket=socket, job=job, token=token,
                              delay_bound=delay_bound, divergence_bound=divergence_bound,
                              snapshot=install is not None)
        if install is not None:
            self.register_install_callback(install)
        self._init_serving(update, request)
        if promotion is not None:
            self.register_promotion_callback(promotion)

    def __repr__(self):
        return "<mlfabric.Replica of %r>" % self.server


@atexit.register
def _stop_serving():
    # Serving threads must not run Python callbacks while the interpreter
    # finalises.
    for s in list(_serving):
        try:
            s.stop(timeout=5)
        except Exception:
            pass

_reducer = None


def _abort_on_uncaught(previous):
    """An excepthook for a rank of a multi-rank job: after the traceback,
    the process exits at once. A normal exit would run MPI_Finalize, which
    waits for the other ranks, who wait in their next collective for this
    one: the job would hang instead of failing. mpirun sees a rank that
    ended without finalizing and stops the others."""
    def hook(kind, value, traceback):
        previous(kind, value, traceback)
        try:
            import sys
            sys.stdout.flush()
            sys.stderr.write("mlfabric: rank %d of %d ends on an uncaught %s; "
                             "the job is stopped\n" % (rank(), size(), kind.__name__))
            sys.stderr.flush()
        finally:
            os._exit(1)
    return hook


def init(backend=None, timeout_s=300.0):
    """Creates the process-wide AllReducer (idempotent); returns it. In a job
    of several ranks, an exception no code catches then ends the job (every
    rank) instead of leaving the others waiting.

    Elastic mode (MLFABRIC_ELASTIC=1, which mlfabric-run's elastic mode
    sets): the rank and size come from the job's membership instead of
    MLFABRIC_RANK/MLFABRIC_SIZE (see _elastic_reducer), once at least
    MLFABRIC_SIZE workers are members (waiting up to timeout_s), and the
    backend "auto" is "mlfabric"."""
    global _reducer
    if _reducer is None:
        backend = backend or os.environ.get("MLFABRIC_ALLREDUCE_BACKEND", "auto")
        if _elastic():
            # Ranks sharing a host would sum in shared memory first, where a
            # rank that dies mid-sum leaves the others waiting: through the
            # daemons only, unless asked for.
            os.environ.setdefault("MLFABRIC_LOCAL_REDUCE", "0")
            _elastic_settings.update(backend="mlfabric" if backend == "auto" else backend,
                                     timeout_s=timeout_s)
            generation, members = _await_members(_env_int(("MLFABRIC_SIZE",)) or 1, timeout_s)
            _reducer = _elastic_reducer(generation, members)
        else:
            _reducer = AllReducer(backend=backend, timeout_s=timeout_s)
        if _reducer.size > 1 or _elastic():
            import sys
            sys.excepthook = _abort_on_uncaught(sys.excepthook)
        _learn_cross(_reducer, collective=_elastic())
    return _reducer


def _elastic():
    """Elastic mode: launched by mlfabric-run --host-discovery-script."""
    return os.environ.get("MLFABRIC_ELASTIC") == "1"


_membership_worker = None
_membership_lock = threading.Lock()


def _member_name():
    """This rank's worker name in its job: the one its AllReducer registers
    (MLFABRIC_WORKER_NAME, which mlfabric-run sets; else rank<r>)."""
    name = os.environ.get("MLFABRIC_WORKER_NAME", "")
    if not name and _elastic() and _reducer is None:
        raise RuntimeError("mlfabric: elastic mode (MLFABRIC_ELASTIC=1) needs MLFABRIC_WORKER_NAME, "
                           "this rank's worker name (mlfabric-run's elastic mode sets it)")
    return name if name else "rank%d" % rank()


def _natural_order(names):
    """Worker names in rank order: their digit runs compared as numbers, so
    rank2 comes before rank10 (the scheduler sorts bytes). Every rank
    applies it to the same list, so all agree on it."""
    def key(name):
        return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]
    return sorted(names, key=key)


def membership():
    """The job's membership now, asked of the scheduler through this host's
    daemon: (generation, [live workers' names, in rank order: rank2 before
    rank10]). The generation
    grows by one whenever a worker joins (registers) or leaves (its
    application or host is gone). The first call connects to the daemon
    as this rank's worker (MLFABRIC_WORKER_NAME, else rank<r>: the name its
    AllReducer uses, so it joins nothing new) and keeps that connection
    until shutdown(). RuntimeError if the daemon or scheduler cannot
    answer (the message says why)."""
    global _membership_worker
    with _membership_lock:
        if _membership_worker is None:
            _membership_worker = Worker(name=_member_name())
        generation, members = _membership_worker.membership()
    return int(generation), _natural_order(str(m) for m in members)


# Elastic mode: how init() built the reducer (to build it again), and the
# membership generation the current one was built for.
_elastic_settings = {"backend": "mlfabric", "timeout_s": 300.0}
_generation = None
_members = None  # the sorted worker names of _generation; [0] serves the root


def _root_lost(error, wait_s=3.0):
    """_elastic_errors.root_lost: after a collective failed with `error`,
    the job's membership if the member that served this AllReducer's root
    (rank 0 of its generation) is no longer in it, or if the generation
    moved on (a root already replaced under its name), else None. Its
    leaving may reach the scheduler a moment after its rounds failed: asks
    again for up to `wait_s`. None outside elastic mode, on rank 0 itself,
    and when the membership cannot be asked by then (the original error
    stands)."""
    del error
    if not _elastic() or _generation is None or not _members:
        return None
    root_member = _members[0]
    if root_member == _member_name():
        return None
    deadline = time.monotonic() + wait_s
    while True:
        try:
            generation, members = membership()
        except RuntimeError:
            generation, members = _generation, [root_member]
        if (root_member not in members or generation != _generation) and \
                _member_name() in members:
            return generation, members
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


_elastic_errors.root_lost = _root_lost


def _await_members(count, timeout_s):
    """The membership once it has at least `count` members, or as it is
    after timeout_s (a rank that never came)."""
    deadline = time.monotonic() + timeout_s
    while True:
        generation, members = membership()
        if len(members) >= count or time.monotonic() >= deadline:
            return generation, members
        time.sleep(0.05)  # the ranks of a starting job register within moments


def _elastic_reducer(generation, members):
    """An AllReducer for membership `generation`: rank = the index of this
    rank's worker name in the sorted `members`, size = their number, root
    server "<job>-allreduce-root-g<generation>" (the rounds of two
    memberships never mix). Sets MLFABRIC_RANK/MLFABRIC_SIZE to match."""
    global _generation, _members
    name = _member_name()
    if name not in members:
        raise RuntimeError("mlfabric: worker %r is no member of its job at membership "
                           "generation %d (members: %s)" % (name, generation, ", ".join(members)))
    new_rank, new_size = members.index(name), len(members)
    job = os.environ.get("MLFABRIC_JOB", "demo")
    red = AllReducer(backend=_elastic_settings["backend"],
                     timeout_s=_elastic_settings["timeout_s"],
                     root_server="%s-allreduce-root-g%d" % (job, generation),
                     rank=new_rank, size=new_size)
    os.environ["MLFABRIC_RANK"], os.environ["MLFABRIC_SIZE"] = str(new_rank), str(new_size)
    _generation, _members = generation, list(members)
    return red


def _rendezvous(generation, members):
    """Elastic mode, after a membership change every rank agreed on
    (mlfabric.elastic.run's reset): closes the AllReducers and builds the
    process-wide one again for `generation` and `members`; then rank() and
    size() are the new ones. A collective: every member calls it."""
    global _reducer
    for r in _backup_reducers.values():
        r.close()
    _backup_reducers.clear()
    if _reducer is not None:
        _reducer.close()
        _reducer = None
    _reducer = _elastic_reducer(generation, members)
    _learn_cross(_reducer, collective=True)


_cross = (0, 1)  # (cross_rank, cross_size), learned by init()


def _learn_cross(red, collective=False):
    """Horovod's cross communicator: the ranks whose local rank is this
    rank's, one per host, in rank order. All ranks on one host (size ==
    local_size, which is then so on every rank): (0, 1) at once. Otherwise
    one small AllReduce at init() tells every rank each rank's local rank
    (from the launcher's environment), so hosts of different sizes count
    right. collective=True (elastic mode): always the AllReduce, since
    after a membership change size == local_size may hold on some ranks
    only."""
    global _cross
    mine = local_rank()
    if red.size == local_size() and not collective:
        _cross = (0, 1)
        return
    locals_ = np.zeros(red.size, np.int64)
    locals_[red.rank] = mine + 1  # 0 stays "no rank here" in the sum
    locals_ = red.allreduce(locals_)
    same = locals_ == mine + 1
    _cross = (int(np.count_nonzero(same[:red.rank])), int(np.count_nonzero(same)))


def is_initialized():
    """True once init() has run (and shutdown() has not)."""
    return _reducer is not None


def reducer():
    """The process-wide AllReducer that init() made; RuntimeError before init()."""
    if _reducer is None:
        raise RuntimeError("call mlfabric.init() first")
    return _reducer


_backup_reducers = {}


def backup_reducer(backup_workers, timeout_s=300.0):
    """The process-wide mlfabric-backend AllReducer whose sums leave out the
    `backup_workers` latest contributions of each round (Chen et al., 2016),
    with its own root server; created on first use (every rank must ask for
    the same ones in the same order). `.summed` is how many contributions
    each sum holds."""
    reducer()  # init() first, as for every collective
    b = int(backup_workers)
    if b not in _backup_reducers:
        job = os.environ.get("MLFABRIC_JOB", "demo")
        _backup_reducers[b] = AllReducer(backend="mlfabric", timeout_s=timeout_s,
                                         root_server="%s-allreduce-backup%d" % (job, b),
                                         backup_workers=b)
        # Every rank has joined before any round can close without it (a
        # rank that joined later would start rounds behind).
        reducer().allreduce(np.zeros(1, np.float32))
    return _backup_reducers[b]


def shutdown():
    """Closes the AllReducers init() and backup_reducer() made, and the
    connection membership() opened; init() may run again."""
    global _reducer, _membership_worker
    for r in _backup_reducers.values():
        r.close()
    _backup_reducers.clear()
    if _reducer is not None:
        _reducer.close()
        _reducer = None
    with _membership_lock:
        if _membership_worker is not None:
            _membership_worker.close()
            _membership_worker = None


def rank():
    """This process's rank (init() first)."""
    return reducer().rank


def size():
    """The number of ranks (init() first)."""
    return reducer().size


def _env_int(names):
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            return int(value)
    return None


def local_rank():
    """This process's rank among the ranks on its host (mlfabric-run and
    mpirun set it; a process started alone is local rank 0 of 1)."""
    reducer()
    value = _env_int(("MLFABRIC_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"))
    return value if value is not None else (rank() if size() == 1 else 0)


def local_size():
    """How many ranks run on this process's host."""
    reducer()
    value = _env_int(("MLFABRIC_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"))
    return value if value is not None else 1


def cross_rank():
    """This rank's host among the hosts (Horovod's cross_rank): its index
    among the ranks of the same local rank, in rank order; 0 when every
    rank runs on one host."""
    reducer()
    return _cross[0]


def cross_size():
    """The number of hosts with a rank of this rank's local rank (Horovod's
    cross_size; the number of hosts when each runs as many ranks)."""
    reducer()
    return _cross[1]


# Reduce ops (Horovod's names; AllReducer.allreduce and .reducescatter take
# all but Average, which is Sum divided by the size).
Average = "average"
Sum = "sum"
Min = "min"
Max = "max"
Product = "product"
_OPS = (Average, Sum, Min, Max, Product)


def _check_op(op, where):
    if op not in _OPS:
        raise ValueError("%s: unknown op %r; use mlfabric.Average, Sum, Min, Max or Product"
                         % (where, op))


@_elastic_errors.raises_membership_changed
def allreduce(array, average=False, op=Sum):
    """The element-wise sum (or op=Min, Max, Product) of `array` over all
    ranks; average=True (or op=Average) divides the sum by the size (a
    float result, also for integer arrays)."""
    _check_op(op, "mlfabric.allreduce")
    if average and op not in (Sum, Average):
        raise ValueError("mlfabric.allreduce: average=True averages a sum, not op=%r" % (op,))
    average = average or op == Average
    out = reducer().allreduce(array, Sum if op == Average else op)
    return out / reducer().size if average else out


def _alltoall_rows(arr, splits, size):
    """The rows `arr` sends each rank, or a ValueError's text naming the bad
    argument."""
    if arr.ndim == 0:
        return None, "array: a scalar cannot be split; give an array with a first dimension"
    rows = arr.shape[0]
    if splits is None:
        if rows % size:
            return None, ("array: without splits the first dimension (%d rows) must divide by "
                          "the number of ranks (%d)" % (rows, size))
        return [rows // size] * size, None
    counts = np.asarray(splits)
    if counts.ndim != 1 or len(counts) != size:
        return None, ("splits: expected %d row counts (one per rank), got %r"
                      % (size, splits))
    if counts.dtype.kind not in "iu":
        return None, "splits: expected integer row counts, got %r (%s)" % (splits, counts.dtype)
    if (counts < 0).any():
        d = int(np.flatnonzero(counts < 0)[0])
        return None, "splits: the count %d for rank %d is negative" % (counts[d], d)
    if counts.sum() != rows:
        return None, ("splits: the counts %s add up to %d rows but the array has %d rows"
                      % (counts.tolist(), counts.sum(), rows))
    return [int(c) for c in counts], None


@_elastic_errors.raises_membership_changed
def alltoall(array, splits=None):
    """Horovod's alltoall: sends splits[d] rows (first dimension) of `array`
    to rank d and returns the rows every rank sent this one, concatenated
    in rank order. Without `splits` the first dimension is divided equally
    (it must divide by the size) and only the array is returned; with
    `splits`, (array, received_splits) as Horovod, received_splits[s]
    (int32) being the rows that came from rank s. Splits may be uneven or
    zero; the other dimensions and the dtype must match on every rank.
    Bad splits raise ValueError naming them, here, and ValueError naming
    this rank on the other ranks (no rank is left waiting)."""
    red = reducer()
    arr = np.asarray(array)
    send, problem = _alltoall_rows(arr, splits, red.size)
    if problem is not None:
        red.refuse("alltoall")
        raise ValueError("mlfabric.alltoall: " + problem)
    out, received = red.alltoall(arr, send)
    return out if splits is None else (out, received)


@_elastic_errors.raises_membership_changed
def reducescatter(array, op=Average):
    """Horovod's reducescatter: reduces `array` (the same shape on every
    rank) over the ranks by `op` (Average, the default, Sum, Min, Max or
    Product) and returns this rank's rows of the result: the first
    dimension divided as evenly as possible, the earlier ranks taking one
    extra row each. Average is the sum divided by the size (a float
    result, also for integer arrays)."""
    red = reducer()
    if op not in _OPS:
        red.refuse("reducescatter")
        _check_op(op, "mlfabric.reducescatter")
    out = red.reducescatter(np.asarray(array), Sum if op == Average else op)
    return out / red.size if op == Average else out


@_elastic_errors.raises_membership_changed
def broadcast(array, root=0):
    """Every rank receives a copy of rank `root`'s numpy array (shapes, dtypes
    and root must agree across ranks)."""
    return reducer().broadcast(array, root)
