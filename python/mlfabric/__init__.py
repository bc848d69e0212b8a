"""MLfabric for Python: push/get to parameter servers and AllReduce.

Horovod-like use (launch with `mlfabric-run -np 4 python3 train.py`):

    import mlfabric
    mlfabric.init()                     # backend "auto": mpi under mlfabric-run
    print(mlfabric.rank(), mlfabric.size())
    total = mlfabric.allreduce(np.ones(3, np.float32))

Classes (pybind11 binding of the C++ API in api/):
    AllReducer(backend="auto"|"mlfabric"|"mpi"|"nccl", socket="", job="", token="")
    Worker(socket="", job="", token="", name="", delay_bound=-1): push, push_nowait, get
    SumServer(name, initial_float32): a parameter server applying model += update
Empty socket/job/token come from MLFABRIC_DAEMON_SOCKET/MLFABRIC_JOB/...
which mlfabric-run sets. Errors raise ValueError (bad input, e.g. shapes
that differ across ranks), TypeError (unsupported dtype) or RuntimeError.
"""
import os

from mlfabric import _lib

_ext = _lib.load_extension()
AllReducer = _ext.AllReducer
Worker = _ext.Worker
SumServer = _ext.SumServer
PendingPush = _ext.PendingPush

_reducer = None


def init(backend=None, timeout_s=300.0):
    """Creates the process-wide AllReducer (idempotent); returns it."""
    global _reducer
    if _reducer is None:
        backend = backend or os.environ.get("MLFABRIC_ALLREDUCE_BACKEND", "auto")
        _reducer = AllReducer(backend=backend, timeout_s=timeout_s)
    return _reducer


def reducer():
    if _reducer is None:
        raise RuntimeError("call mlfabric.init() first")
    return _reducer


def shutdown():
    global _reducer
    if _reducer is not None:
        _reducer.close()
        _reducer = None


def rank():
    return reducer().rank


def size():
    return reducer().size


def allreduce(array, average=False):
    out = reducer().allreduce(array)
    return out / reducer().size if average else out


def broadcast(array, root=0):
    return reducer().broadcast(array, root)
