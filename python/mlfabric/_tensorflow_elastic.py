"""`mlfabric.tensorflow.elastic`: Horovod's `horovod.tensorflow.elastic`.

    import mlfabric.tensorflow as hvd
    state = hvd.elastic.TensorFlowState(variables, batch=0)        # tf.Variables
    state = hvd.elastic.TensorFlowKerasState(model, optimizer, epoch=0)
    hvd.elastic.run(train)(state)

The states keep a copy of every tracked variable in host memory (numpy) on
commit(), assign it back on restore(), and on sync() broadcast rank 0's
variables and keyword attributes (through mlfabric.broadcast, the numpy
broadcast: a sync is rare and its values go through host memory anyway).
They run eagerly (TensorFlow 2), as Horovod's do with TensorFlow 2. State,
ObjectState, run and the errors are mlfabric.elastic's
(python/mlfabric/elastic.py). This module sits below mlfabric.tensorflow,
which exposes it as `elastic`, so it uses only the core API.
"""
import sys

import numpy as np
import tensorflow as tf

import mlfabric
from mlfabric.elastic import (HostsUpdatedInterrupt, MembershipChangedError,  # noqa: F401
                              ObjectState, State, is_membership_change, membership_error,
                              raises_membership_changed, run, run_fn)


def _eager_only(where):
    if not tf.executing_eagerly():
        raise RuntimeError("%s runs eagerly only (TensorFlow 2); create and use it outside a "
                           "tf.function or TF1 graph" % where)


def _variable_list(variables):
    """The optimizer's variables: a list in Keras 3, a method in tf.keras 2."""
    return list(variables() if callable(variables) else variables)


class _VariablesState(ObjectState):
    """Variables saved as numpy copies and assigned back; the keyword
    attributes as ObjectState. `_tracked()` lists the variables."""

    def __init__(self, **kwargs):
        self._saved_values = []
        self._save_variables()
        super().__init__(**kwargs)  # bcast_object: mlfabric.elastic.broadcast_object

    def _tracked(self):
        raise NotImplementedError

    def save(self):
        self._save_variables()
        super().save()

    def restore(self):
        for variable, value in self._saved_values:
            variable.assign(value)
        super().restore()

    def sync(self):
        root = self.sync_root()
        for variable in self._tracked():
            variable.assign(mlfabric.broadcast(np.asarray(variable.numpy()), root))
        self._save_variables()
        self._sync_from(root)

    def _save_variables(self):
        # Pairs, not a list of values: a variable created after the commit
        # (an optimizer's slot) is left alone by restore().
        self._saved_values = [(v, v.numpy()) for v in self._tracked()]


class TensorFlowState(_VariablesState):
    """Horovod's TensorFlowState: a list of tf.Variables plus keyword
    attributes (e.g. batch=0, epoch=0). `session` (TF1) is accepted and
    must be None: MLfabric's states run eagerly."""

    def __init__(self, variables=None, session=None, **kwargs):
        _eager_only("mlfabric.tensorflow.elastic.TensorFlowState")
        if session is not None:
            raise ValueError("mlfabric.tensorflow.elastic.TensorFlowState: session=%r: TF1 "
                             "sessions are not supported; create the state eagerly" % (session,))
        if variables is None:
            raise ValueError("mlfabric.tensorflow.elastic.TensorFlowState: give the variables "
                             "to track (TensorFlow 2 has no global variables collection)")
        self.variables = list(variables)
        super().__init__(**kwargs)

    def _tracked(self):
        return self.variables


class TensorFlowKerasState(_VariablesState):
    """Horovod's TensorFlowKerasState: a built Keras model's variables and
    its optimizer's (the model's compiled optimizer unless `optimizer` is
    given; an optimizer not built yet is built for the model's trainable
    variables, so its slots are part of the first commit), plus keyword
    attributes. `backend` (TF1) is accepted and ignored."""

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        del backend
        where = "mlfabric.tensorflow.elastic.%s" % type(self).__name__
        _eager_only(where)
        if not getattr(model, "built", True):
            raise ValueError("%s: the model must be built first: call model.build(input_shape) "
                             "or run it on a batch" % where)
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        if self.optimizer is None:
            raise ValueError("%s: no optimizer: pass optimizer= or compile the model first"
                             % where)
        if hasattr(self.optimizer, "build") and not getattr(self.optimizer, "built", True):
            self.optimizer.build(model.trainable_variables)
        super().__init__(**kwargs)

    def _tracked(self):
        # Once trained, a Keras 3 optimizer may list the model's variables
        # among its own: each variable is tracked once.
        tracked, seen = [], set()
        for variable in list(self.model.variables) + _variable_list(self.optimizer.variables):
            if id(variable) not in seen:
                seen.add(id(variable))
                tracked.append(variable)
        return tracked


# Keras 3 (`keras`), as in horovod.tensorflow.keras.elastic: the same state.
class KerasState(TensorFlowKerasState):
    """Horovod's KerasState: TensorFlowKerasState for a Keras 3 model."""


# `from mlfabric.tensorflow.elastic import ...` works as with Horovod.
sys.modules.setdefault("mlfabric.tensorflow.elastic", sys.modules[__name__])
