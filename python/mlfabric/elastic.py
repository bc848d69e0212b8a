"""Horovod's elastic state API (`hvd.elastic`) for MLfabric.

A Horovod elastic training script runs with its import line changed
(`mlfabric.tensorflow.elastic` and `mlfabric.keras.elastic` add the
TensorFlow and Keras states to what is here):

    state = hvd.elastic.TensorFlowKerasState(model, optimizer, batch=0, epoch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...                       # collectives; one may raise MembershipChangedError
            state.commit()            # the point training goes back to

    train(state)

`run(func)` syncs the state from rank 0 and calls `func(state)`. When a
collective fails because a worker left the job (the scheduler fails the
round with "... left the job ... at membership generation G", see
docs/user-guide/sync-training.md "Job membership"), the collective raises
`MembershipChangedError` (Horovod's name: `HostsUpdatedInterrupt`); `run`
then restores the last commit, calls the reset callbacks, syncs and calls
`func` again. The recovery is in-process, with the ranks that are still
running: `mlfabric-run --host-discovery-script` stops the ranks of hosts
that vanish and starts replacements, but a rank started later is not
announced to the running ones (docs/operations/many-hosts.md).

State objects keep their commit in host memory (a copy per rank):
    commit()   save() then check_host_updates()
    restore()  back to the last commit
    sync()     every rank takes rank 0's state (a collective: every rank calls it)
"""
import functools
import pickle
import sys

import numpy as np

import mlfabric
from mlfabric._elastic_errors import (HostsUpdatedInterrupt, MembershipChangedError,  # noqa: F401
                                      is_membership_change, membership_error,
                                      raises_membership_changed)


def broadcast_object(obj, root_rank=0):
    """Rank `root_rank`'s picklable `obj` on every rank, through the numpy
    broadcast (mlfabric.broadcast); the default bcast_object of the states
    here."""
    data = pickle.dumps(obj) if mlfabric.rank() == root_rank else b""
    length = int(mlfabric.broadcast(np.array([len(data)], np.int64), root_rank)[0])
    payload = np.frombuffer(data, np.uint8) if data else np.zeros(length, np.uint8)
    received = mlfabric.broadcast(payload, root_rank)
    return pickle.loads(received.tobytes()[:length])


class State:
    """Horovod's elastic State: what training goes back to when the job's
    membership changes. Subclasses implement save(), restore() and sync().

    bcast_object(obj) -> rank 0's obj (default: broadcast_object here);
    get_rank() -> this rank (default: mlfabric.rank)."""

    def __init__(self, bcast_object=None, get_rank=None):
        self._bcast_object = bcast_object or broadcast_object
        self._rank = get_rank or mlfabric.rank
        self._host_updates = []
        self._last_updated_timestamp = 0
        self._reset_callbacks = []
        # Whether this rank's state is the job's: it committed or synced
        # once (a rank that joined a job in progress has not).
        self._has_state = False

    def register_reset_callbacks(self, callbacks):
        """Functions (no arguments) that on_reset() calls, in order, after
        a membership change: e.g. one that rescales the learning rate."""
        callbacks = list(callbacks)
        for callback in callbacks:
            if not callable(callback):
                raise TypeError("register_reset_callbacks: %r is not callable" % (callback,))
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        """Called by run() after a membership change: forgets pending host
        updates and calls the reset callbacks."""
        self._host_updates = []
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp):
        """Records a host update (Horovod's driver calls it; MLfabric's
        launcher does not send any yet). The next commit() raises."""
        self._host_updates.append(timestamp)

    def commit(self):
        """Saves the state in host memory (the point restore() returns to),
        then check_host_updates(). Committing copies every tracked value,
        so commit less often than every batch when batches are cheap."""
        self.save()
        self._has_state = True
        self.check_host_updates()

    def check_host_updates(self):
        """Raises MembershipChangedError on every rank if rank 0 recorded a
        host update since the last check, or (elastic mode,
        MLFABRIC_ELASTIC=1) rank 0 finds the job's membership generation
        (mlfabric.membership()) other than the one this rank's AllReducer
        was built for. A collective: rank 0's timestamp and membership are
        broadcast, so all ranks agree; the error carries that membership
        (`.membership`), which run() rebuilds the AllReducer for."""
        previous = self._last_updated_timestamp
        latest = max([previous] + self._host_updates)
        self._host_updates = []
        members = None
        if _membership_checked() and self._rank() == 0:
            members = mlfabric.membership()
        latest, members = self._bcast_object((latest, members))
        self._last_updated_timestamp = latest
        if latest > previous:
            raise MembershipChangedError(
                "hosts were updated (timestamp %r after %r)" % (latest, previous),
                skip_sync=False, membership=members)
        if members is not None and members[0] != mlfabric._generation:
            raise MembershipChangedError(
                "the job's membership changed: generation %d, %d member(s) (%s), after "
                "generation %d" % (members[0], len(members[1]), ", ".join(members[1]),
                                   mlfabric._generation),
                skip_sync=False, membership=members)

    def save(self):
        """Saves the state in host memory."""
        raise NotImplementedError("%s.save()" % type(self).__name__)

    def restore(self):
        """Restores the last saved state, undoing later changes."""
        raise NotImplementedError("%s.restore()" % type(self).__name__)

    def sync(self):
        """Makes every rank's state rank 0's (and saves it); in elastic
        mode that of the lowest rank that has the job's state (see
        sync_root)."""
        raise NotImplementedError("%s.sync()" % type(self).__name__)

    def sync_root(self):
        """The rank sync() takes the state from. Rank 0, except in elastic
        mode (MLFABRIC_ELASTIC=1), where ranks are the sorted worker names
        and a rank that joined a job in progress (a replacement for rank 0
        takes its name) may sort first: there the lowest rank that
        committed or synced before, found with one small allreduce (a
        collective); rank 0 if none has (the job's start)."""
        if not _membership_checked() or self._bcast_object is not broadcast_object:
            return 0
        size = mlfabric.size()
        if size <= 1:
            return 0
        flags = np.zeros(size, np.float64)
        flags[self._rank()] = 1.0 if self._has_state else 0.0
        have = np.flatnonzero(mlfabric.allreduce(flags) > 0)
        return int(have[0]) if have.size else 0


class ObjectState(State):
    """Horovod's ObjectState: every keyword argument becomes an attribute;
    commit() saves the attributes' current values, restore() sets them back,
    sync() broadcasts rank 0's saved values (with bcast_object) and sets
    them. Values must be picklable."""

    def __init__(self, bcast_object=None, get_rank=None, **kwargs):
        self._saved_state = dict(kwargs)
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        """Keeps the current values of the attributes for restore()."""
        self._saved_state = {name: getattr(self, name) for name in self._saved_state}

    def restore(self):
        """Sets the attributes back to the values last saved."""
        self._set_attrs()

    def sync(self):
        """Sets every rank's attributes to rank 0's saved values (see
        State.sync_root)."""
        self._sync_from(self.sync_root())

    def _sync_from(self, root):
        if self._saved_state:
            self._saved_state = (self._bcast_object(self._saved_state) if root == 0 else
                                 self._bcast_object(self._saved_state, root))
            self._set_attrs()
        self._has_state = True

    def _set_attrs(self):
        for name, value in self._saved_state.items():
            setattr(self, name, value)


def _membership_checked():
    """Whether commits look at the job's membership: in elastic mode, once
    init() built the AllReducer for a membership generation."""
    return mlfabric._elastic() and mlfabric._generation is not None


def run_fn(func, reset=None):
    """run() with a `reset()` called before the reset callbacks on each
    retry (Horovod's horovod.common.elastic.run_fn)."""
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        if not isinstance(state, State):
            raise TypeError("%s: the first argument must be an elastic State, got %r"
                            % (getattr(func, "__name__", "run"), state))
        retry, skip_sync, members = False, False, None
        while True:
            if retry:
                if members is not None and _membership_checked():
                    # Re-rendezvous: every rank got rank 0's membership.
                    mlfabric._rendezvous(*members)
                if reset is not None:
                    reset()
                state.on_reset()
            if not skip_sync:
                state.sync()
            try:
                return func(state, *args, **kwargs)
            except Exception as e:  # noqa: BLE001 -- re-raised unless a membership change
                changed = membership_error(e)
                if changed is None:
                    raise
                _report(changed)
                state.restore()
                skip_sync = changed.skip_sync
                members = changed.membership
            retry = True
    return wrapper


def run(func):
    """Horovod's `hvd.elastic.run` decorator: `func(state, ...)` runs after
    state.sync(); a MembershipChangedError (or an error with the
    scheduler's "left the job ... membership generation" wording) from it
    restores the last commit, calls the reset callbacks, syncs and calls
    `func` again. Any other error propagates."""
    return run_fn(func)


def _report(error):
    try:
        where = "rank %d" % mlfabric.rank()
    except RuntimeError:
        where = "this rank"
    sys.stderr.write("mlfabric.elastic: %s: %s; restoring the last commit and running again\n"
                     % (where, error))
    sys.stderr.flush()
