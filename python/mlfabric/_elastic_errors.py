"""The membership-change error of MLfabric's collectives (Horovod's
`HostsUpdatedInterrupt`) and the one mapping from a collective's error to
it. Below the core API so that `mlfabric`'s numpy collectives and
`mlfabric.tensorflow`'s ops can raise it; `mlfabric.elastic` re-exports
everything here.
"""
import functools


# The scheduler's wording when a round fails because a member left
# (scheduler/service/round_tracker.cc MemberLeft: "worker 'w3' left the job
# (why) at membership generation 5"). Both parts must be present.
_LEFT_THE_JOB = "left the job"
_MEMBERSHIP_GENERATION = "membership generation"


class MembershipChangedError(RuntimeError):
    """A collective failed because the job's membership changed (a worker
    left the job), or state.check_host_updates() found a host update.
    `run` recovers from it: restore, reset callbacks, sync, call again.
    `skip_sync=True` (Horovod's HostsUpdatedInterrupt argument) skips the
    sync before the next call. `membership`: (generation, members) every
    rank agreed on (check_host_updates broadcasts rank 0's), which run()
    rebuilds the AllReducer for in elastic mode; None when unknown (a
    failed collective: the next commit finds the change)."""

    def __init__(self, message="the job's membership changed", skip_sync=False,
                 membership=None):
        super().__init__(message)
        self.skip_sync = bool(skip_sync)
        self.membership = membership


# Horovod's name (horovod.common.exceptions.HostsUpdatedInterrupt).
HostsUpdatedInterrupt = MembershipChangedError


def is_membership_change(error):
    """True if `error` (an exception or its message) says that a round
    failed because a worker left the job: MembershipChangedError, or any
    error whose text carries the scheduler's wording (a tf.errors.OpError
    raised by a tf.function, a RuntimeError of mlfabric.AllReducer)."""
    if isinstance(error, MembershipChangedError):
        return True
    text = str(error)
    return _LEFT_THE_JOB in text and _MEMBERSHIP_GENERATION in text


# Set by mlfabric (elastic mode): called with a collective's error that is
# no membership change by its wording, it returns the job's membership
# (generation, members) if the AllReducer's root left the job (rank 0's
# process died: its rounds fail as "server ... disconnected"), else None.
root_lost = None


def membership_error(error):
    """`error` as a MembershipChangedError (chained to it) if it is a
    membership change, else None. The one mapping the collectives use.
    In elastic mode an error after rank 0 (whose process serves the
    AllReducer's root) left the job is one too, carrying the membership
    that run() rebuilds for: there is no rank 0 left to agree through."""
    if isinstance(error, MembershipChangedError):
        return error
    if not is_membership_change(error):
        members = root_lost(error) if root_lost is not None else None
        if members is None:
            return None
        changed = MembershipChangedError(
            "%s; rank 0 left the job: membership generation %d, %d member(s) (%s)"
            % (error, members[0], len(members[1]), ", ".join(members[1])),
            membership=members)
        changed.__cause__ = error
        return changed
    changed = MembershipChangedError(str(error))
    changed.__cause__ = error
    return changed


def raises_membership_changed(collective):
    """Decorates a collective so that a failure caused by a worker leaving
    raises MembershipChangedError (from the original error); any other
    error passes unchanged."""
    @functools.wraps(collective)
    def wrapper(*args, **kwargs):
        try:
            return collective(*args, **kwargs)
        except MembershipChangedError:
            raise
        except Exception as e:  # noqa: BLE001 -- re-raised unless it is a membership change
            changed = membership_error(e)
            if changed is None:
                raise
            raise changed from e
    return wrapper
