"""Horovod's elastic training state for Keras, on every Keras flavour: the model's and the
optimizer's variables plus any attributes (``batch``, ``epoch``, ...), synchronised from rank
0 when the ranks (re)start, saved by ``commit`` and rolled back by ``restore`` when a rank
fails. Horovod's own reads the optimizer's variables in a way Keras 3 does not offer."""
from __future__ import annotations

import horovod.tensorflow as hvd
import tensorflow as tf
from horovod.common.elastic import ObjectState, run_fn
from horovod.common.exceptions import HorovodInternalError

from .. import compat
from ..runtime import forget
from ..tensorflow import broadcast_variables

keras = compat.keras


class KerasState(ObjectState):
    """``KerasState(model, optimizer=None, **attributes)`` (Horovod's): ``sync()`` sets every
    rank to rank 0's variables and attributes; ``commit()`` keeps them (and checks for added
    or removed hosts); ``restore()`` goes back to the last commit. The optimizer is the
    model's unless given; the model must be built."""

    def __init__(self, model, optimizer=None, **kwargs):
        if not model.built:
            raise ValueError("build the model first (model.build(input_shape) or one call)")
        self.model = model
        self.optimizer = optimizer if optimizer is not None else model.optimizer
        self._save_model()
        super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank, **kwargs)

    def _variables(self) -> list:
        """The model's and the optimizer's variables -- its slots created first, so a rank
        that just joined holds as many as the others."""
        if self.optimizer is None:
            return compat.tf_variables(self.model.variables)
        compat.build_optimizer(self.optimizer, self.model.trainable_variables)
        own = compat.optimizer_variables(self.optimizer)
        return compat.tf_variables([*self.model.variables, *own])

    def save(self):
        self._save_model()
        super().save()

    def restore(self):
        self._load_model()
        super().restore()

    def sync(self):
        broadcast_variables(self._variables(), root_rank=0)
        self._save_model()
        super().sync()

    def _save_model(self) -> None:
        self._saved = [tf.identity(v) for v in self._variables()]

    def _load_model(self) -> None:
        for var, saved in zip(self._variables(), self._saved):
            var.assign(saved)


TensorFlowKerasState = KerasState


def run(func):
    """Horovod's elastic ``run``: ``func(state, ...)`` again, after the state's ``sync``,
    whenever ranks join or leave (or one fails); Horovod is restarted on the new world in
    between, and hetgrad's control channel with it."""
    def wrapper(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except tf.errors.UnknownError as exc:   # a collective broken by a lost rank
            if any(op in exc.message for op in ("HorovodAllreduce", "HorovodAllgather",
                                                "HorovodBroadcast")):
                raise HorovodInternalError(exc) from exc
            raise
    return run_fn(wrapper, _reset)


def _reset() -> None:
    hvd.shutdown()
    hvd.init()
    forget()


class CommitStateCallback(keras.callbacks.Callback):
    """``state.commit()`` (a collective) every ``batches_per_commit`` batches, counted from
    each ``fit``'s start on every rank alike, and at every epoch end (Horovod's)."""

    def __init__(self, state: KerasState, batches_per_commit: int = 1):
        super().__init__()
        self.state, self.every, self.done = state, batches_per_commit, 0

    def on_train_begin(self, logs=None):
        self.done = 0   # a rank that just joined counts from where the others do

    def on_batch_end(self, batch, logs=None):
        self.done += 1
        if self.done % self.every == 0:
            self.state.commit()

    def on_epoch_end(self, epoch, logs=None):
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """``state.batch``: the index of the last batch done (0 again at the epoch end), as
    Horovod's."""

    def __init__(self, state: KerasState):
        super().__init__()
        self.state = state

    def on_batch_end(self, batch, logs=None):
        self.state.batch = batch

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """``state.epoch``: the epochs done, whether ``fit`` restarts its count (Horovod's
    ``fit(epochs=E - state.epoch)``) or goes on (``initial_epoch=state.epoch``)."""

    def __init__(self, state: KerasState):
        super().__init__()
        self.state, self.offset = state, None

    def on_train_begin(self, logs=None):
        self.offset = None

    def on_epoch_begin(self, epoch, logs=None):
        if self.offset is None:
            self.offset = self.state.epoch - epoch

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = self.offset + epoch + 1
