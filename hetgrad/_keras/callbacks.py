"""Keras callbacks, named like ``horovod.tensorflow.keras.callbacks`` and right under unequal
batches: the metric average is weighted by samples, and every callback makes the train step
record its batch size (what ``weight="samples"`` needs), so no extra call is required in
``fit``. Built on ``horovod.tensorflow`` collectives, so they work on every Keras flavour."""
from __future__ import annotations

from typing import Callable

import horovod.tensorflow as hvd
import tensorflow as tf

from .. import compat
from ..tensorflow import broadcast_variables
from .counting import count_samples, epoch_samples
from .optimizer import hetgrad_outermost

keras = compat.keras

__all__ = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback",
           "LearningRateScheduleCallback", "LearningRateWarmupCallback", "DensityWarmup",
           "rank_zero_only"]


class _Counting(keras.callbacks.Callback):
    """Installs :func:`hetgrad.keras.count_samples` on the model it is given, and puts a
    ``LossScaleOptimizer`` wrapped around hetgrad's inside it (:mod:`.loss_scale`)."""

    def set_model(self, model):
        super().set_model(model)
        hetgrad_outermost(model)
        count_samples(model)


class BroadcastGlobalVariablesCallback(_Counting):
    """Make every rank start from ``root_rank``'s state: its model weights before the first
    step, and model + optimizer variables (slots exist by then) after the first call into
    the train step (its first step, or first N with ``steps_per_execution`` N), as Horovod
    does. ``built_alike``: the caller's word that every rank's optimizer has its slots
    before the fit, or none has (hetgrad's loop builds them on every rank): where they
    exist, one broadcast of both before the first step. (Not by default: in Horovod's
    examples rank 0 alone loads a saved model, its optimizer built, the others' not.)
    ``local_variables`` keep each rank's own values (Horovod's); ``device`` is unused."""

    def __init__(self, root_rank: int = 0, device: str = "", local_variables=None, *,
                 built_alike: bool = False):
        super().__init__()
        self.root_rank, self.built_alike = root_rank, built_alike
        self.local = {compat.variable_key(v) for v in local_variables or ()}
        self.done = False

    def _broadcast(self, variables) -> None:
        shared = [v for v in variables if compat.variable_key(v) not in self.local]
        broadcast_variables(shared, root_rank=self.root_rank)

    def on_train_begin(self, logs=None):
        if self.done or not self.model.built:
            return
        optimizer = self.model.optimizer
        if self.built_alike and compat.optimizer_built(optimizer):
            self._broadcast([*self.model.variables, *compat.optimizer_variables(optimizer)])
            self.done = True
        else:
            self._broadcast(self.model.variables)

    def on_train_batch_end(self, batch, logs=None):
        if not self.done:
            self._broadcast([*self.model.variables,
                             *compat.optimizer_variables(self.model.optimizer)])
            self.done = True


class MetricAverageCallback(_Counting):
    """Epoch metrics averaged over ranks, weighted by each rank's samples in the epoch
    (``sum_i m_i n_i / sum_i n_i``: the metric over all data; Horovod weights ranks equally).

    ``samples``: this rank's samples per epoch (its shard size), or None to count them."""

    def __init__(self, samples: int | None = None):
        super().__init__()
        self.samples = samples

    def on_epoch_begin(self, epoch, logs=None):
        epoch_samples(self.model).assign(0.0)

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or hvd.size() == 1:
            return
        n = float(self.samples if self.samples is not None
                  else epoch_samples(self.model).numpy())
        keys = sorted(k for k in logs if not k.startswith("val_"))
        local = tf.constant([float(logs[k]) * n for k in keys] + [n], tf.float64)
        total = hvd.allreduce(local, op=hvd.Sum, name=f"hetgrad.metrics.{epoch}").numpy()
        for k, v in zip(keys, total[:-1]):
            logs[k] = float(v / total[-1])


class LearningRateScheduleCallback(_Counting):
    """``lr = initial_lr * multiplier(epoch)`` from ``start_epoch`` to ``end_epoch``
    (exclusive); ``multiplier`` a function of the (fractional) epoch, or a number ``m`` for
    ``m ** (epoch - start_epoch)``. ``staircase``: change once per epoch, else before every
    call into the train step (every step, or every N with ``steps_per_execution`` N; then
    ``steps_per_epoch`` is needed, or read from ``fit``)."""

    def __init__(self, initial_lr: float, multiplier: Callable[[float], float] | float,
                 start_epoch: int = 0, end_epoch: int | None = None, staircase: bool = True,
                 steps_per_epoch: int | None = None):
        super().__init__()
        self.initial_lr = float(initial_lr)
        self.multiplier = multiplier if callable(multiplier) else (
            lambda epoch: multiplier ** (epoch - start_epoch))
        self.start_epoch, self.end_epoch = start_epoch, end_epoch
        self.staircase, self.steps_per_epoch = staircase, steps_per_epoch
        self.epoch = 0

    def on_train_begin(self, logs=None):
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = (self.params or {}).get("steps")
            if not self.steps_per_epoch:
                raise ValueError(f"{type(self).__name__}: give steps_per_epoch (fit did not "
                                 "say how many steps an epoch has)")

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.epoch < self.start_epoch or (self.end_epoch is not None
                                             and self.epoch >= self.end_epoch):
            return
        if self.staircase and batch == 0:
            compat.set_learning_rate(self.model.optimizer,
                                     self.initial_lr * self.multiplier(self.epoch))
        elif not self.staircase:
            at = self.epoch + batch / self.steps_per_epoch
            compat.set_learning_rate(self.model.optimizer, self.initial_lr * self.multiplier(at))

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = compat.learning_rate(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Gradual warm-up (Goyal et al.): from ``initial_lr / size`` to ``initial_lr`` over
    ``warmup_epochs``, adjusted every step, as Horovod's."""

    def __init__(self, initial_lr: float, warmup_epochs: int = 5,
                 steps_per_epoch: int | None = None, verbose: int = 0):
        def multiplier(epoch: float) -> float:
            epoch += 1.0 / self.steps_per_epoch  # reach round values at the ends of epochs
            return (epoch * (hvd.size() - 1) / warmup_epochs + 1) / hvd.size()
        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose and hvd.rank() == 0:
            print(f"Epoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{compat.learning_rate(self.model.optimizer):g}.", flush=True)


FILE_WRITERS = tuple(getattr(keras.callbacks, name) for name in
                     ("ModelCheckpoint", "BackupAndRestore", "CSVLogger", "TensorBoard")
                     if hasattr(keras.callbacks, name))


def rank_zero_only(callback):
    """Mark ``callback`` to run on rank 0 only in :func:`hetgrad.keras.fit` (as Keras' file
    writers do there: ModelCheckpoint, BackupAndRestore, CSVLogger, TensorBoard); returns it."""
    callback._hetgrad_rank_zero_only = True
    return callback


def on_this_rank(callbacks, rank: int) -> list:
    """The ``callbacks`` that run on ``rank``: all on rank 0; elsewhere all but those that
    write files (every rank would write the same path) or are marked
    :func:`rank_zero_only`. The others (early stopping, learning-rate schedules) see the
    metrics averaged over the ranks, so they decide alike everywhere."""
    return [cb for cb in callbacks if rank == 0 or not (
        isinstance(cb, FILE_WRITERS) or getattr(cb, "_hetgrad_rank_zero_only", False))]


class DensityWarmup(keras.callbacks.Callback):
    """DGC's density warm-up for a sparse hetgrad optimizer in your own ``model.fit``: each
    epoch sends the density its ``Sparsify(warmup_epochs=...)`` gives for that epoch."""

    def on_epoch_begin(self, epoch, logs=None):
        reducer = getattr(getattr(self.model.optimizer, "hetgrad", None), "reducer", None)
        settings = getattr(reducer, "settings", None)
        if settings is None or not hasattr(reducer, "set_density"):
            raise ValueError("DensityWarmup needs a hetgrad DistributedOptimizer(sparsify=...)")
        reducer.set_density(settings.density_at(epoch))
