"""The epoch loop, apart from what happens around it: every epoch is one ``model.fit`` call on
the plan in effect, with the actions' hooks before, inside (Keras callbacks) and after it."""
from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

import tensorflow as tf

from . import preempt
from .compat import keras
from .errors import NonFiniteGradientError
from .aggregate import NONFINITE
from ._keras import callbacks as hk_callbacks

if TYPE_CHECKING:
    from .run import Run


class _EpochClock(keras.callbacks.Callback):
    """Seconds from ``model.fit``'s epoch start to its end (before metric averaging)."""

    def on_epoch_begin(self, epoch, logs=None):
        self.t0 = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds = time.perf_counter() - self.t0


def run_epochs(job: "Run") -> float:
    """Train from ``job.start_epoch`` to the spec's epochs (or until a callback sets
    ``model.stop_training``, e.g. early stopping), with the run's actions around every epoch;
    returns the wall time. A stop request (:mod:`hetgrad.preempt`) ends it after the epoch's
    checkpoint with :class:`~hetgrad.preempt.Preempted` on every rank."""
    broadcast = hk_callbacks.BroadcastGlobalVariablesCallback(0)  # once, at the start
    actions, progress, epochs = job.actions, job.progress, job.spec.epochs
    t0 = time.perf_counter()
    with preempt.listening():
        for epoch in range(job.start_epoch, epochs):
            for action in actions:
                action.on_epoch_begin(job, epoch)
            callbacks = [broadcast, *(c for a in actions for c in a.callbacks(job))]
            row = _fit_epoch(job, epoch, callbacks)
            early, asked = _agree_on_stopping(job)
            progress.stop_requested = asked and not early and epoch + 1 < epochs
            for action in actions:
                action.on_epoch_end(job, epoch, row)
            progress.epochs.append(row)
            if early or progress.stop_requested:
                break
            job.comm.barrier()   # the next epoch starts together: rank 0's checkpoint is
            # not counted as the other ranks' waiting in its first step
    for action in actions:
        action.on_train_end(job)
    if progress.stop_requested:
        preempt.stop(progress.epochs[-1]["epoch"], epochs, str(job.checkpointer.dir), job.rank)
    return time.perf_counter() - t0


def _agree_on_stopping(job: "Run") -> tuple[bool, bool]:
    """One allgather per epoch, so every rank stops together: whether any rank's model set
    ``stop_training`` (early stopping) and whether any rank was asked to stop. A request with
    no checkpoint directory to save to is ignored (rank 0 says so)."""
    flags = job.comm.allgather((bool(job.model.stop_training), preempt.requested()))
    early, asked = any(f[0] for f in flags), any(f[1] for f in flags)
    if asked and (job.checkpointer is None or job.checkpointer.dir is None):
        preempt.clear()
        if job.rank == 0:
            print(f"hetgrad: warning: {preempt.STOP_SIGNAL.name} ignored: no checkpoint "
                  "directory to save to", file=sys.stderr, flush=True)
        asked = False
    return early, asked


def _fit_epoch(job: "Run", epoch: int, callbacks: list) -> dict:
    """One ``model.fit`` epoch on the plan in effect; the epoch's row (metrics over all ranks,
    averaged before the actions' callbacks see them)."""
    clock = _EpochClock()
    batches = job.batches(epoch)
    metrics = hk_callbacks.MetricAverageCallback(job.plan.shard_sizes[job.rank])
    try:
        with tf.device(job.device):
            history = job.model.fit(batches, epochs=epoch + 1, initial_epoch=epoch,
                                    steps_per_epoch=job.plan.steps_per_epoch, verbose=0,
                                    validation_data=job.spec.validation,
                                    shuffle=False,  # the pipeline orders each epoch itself
                                    callbacks=[clock, metrics, *callbacks])
    except tf.errors.InvalidArgumentError as exc:
        if NONFINITE in str(exc):
            raise _nonfinite(job, epoch) from None
        raise
    logs = {k: float(v[-1]) for k, v in history.history.items()}
    return {"epoch": epoch + 1, **logs, "time_s": clock.seconds}


def _nonfinite(job: "Run", epoch: int) -> NonFiniteGradientError:
    """The error of a step that met NaN/Inf, naming the ranks whose gradients held it."""
    check = job.aggregation.check
    culprits = [job.rank] if job.reducer.check_local else check.read()
    fix = "; lower the learning rate, check the data, or set on_nonfinite to 'ignore'"
    if job.rank in culprits:
        what = "NaN or Inf in this rank's gradients"
    elif culprits:
        what = f"NaN or Inf in the gradients of rank(s) {culprits}"
    else:
        what = "the sum of the ranks' gradients overflowed to Inf"
    return NonFiniteGradientError(f"{what} in epoch {epoch + 1}{fix}", culprits=culprits,
                                  rank=job.rank, field="on_nonfinite")
