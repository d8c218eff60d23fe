"""The epoch loop, apart from what happens around it: every epoch is one ``model.fit`` call on
the plan in effect, with the actions' hooks before, inside (Keras callbacks) and after it."""
from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from . import preempt
from .compat import keras
from .errors import NonFiniteGradientError
from .runtime import quiet_on_sigterm
from .aggregate import NONFINITE
from ._keras import callbacks as hk_callbacks

if TYPE_CHECKING:
    from .run import Run


class _EpochClock(keras.callbacks.Callback):
    """Seconds of ``model.fit``'s epoch: ``seconds`` its training steps, ``validation`` the
    validation after them (``validation_data``), if any. The rest of a split epoch
    (``progress.continued``) goes on counting from its first fit's start: the decision
    between the fits is the epoch's time too."""

    def __init__(self, progress):
        super().__init__()
        self.progress = progress
        self.t0, self.trained, self.seconds, self.validation = time.perf_counter(), None, 0, 0

    def on_epoch_begin(self, epoch, logs=None):
        if not self.progress.continued:
            self.t0 = time.perf_counter()
        self.trained = None

    def on_test_begin(self, logs=None):
        if self.trained is None:
            self.trained = time.perf_counter() - self.t0

    def on_epoch_end(self, epoch, logs=None):
        total = time.perf_counter() - self.t0
        self.seconds = total if self.trained is None else self.trained
        self.validation = total - self.seconds


class _StopCheck(keras.callbacks.Callback):
    """After every ``every`` steps, one allreduce of a flag: whether any rank was asked to stop
    (:mod:`hetgrad.preempt`); if one was, every rank ends the epoch there, together
    (``steps``: the steps this ``model.fit`` ran)."""

    def __init__(self, comm, every: int):
        super().__init__()
        self.comm, self.every, self.steps = comm, every, None

    def on_train_begin(self, logs=None):
        self.steps = None

    def on_train_batch_end(self, batch, logs=None):
        if (batch + 1) % self.every == 0 and self.comm.allreduce_sum(
                np.array([float(preempt.requested())]))[0] > 0:
            self.steps = batch + 1
            self.model.stop_training = True


# steps between stop checks: an MPI allreduce of one number costs microseconds; Horovod's
# own collectives (gloo launches) a cycle of its background loop
STOP_CHECK_EVERY = {"mpi": 1, "local": 1}


def run_epochs(job: "Run") -> float:
    """Train from ``job.start_epoch`` (step ``job.start_step``) to the spec's epochs (or until
    a callback sets ``model.stop_training``, e.g. early stopping), with the run's actions
    around every epoch; returns the wall time. A stop request (:mod:`hetgrad.preempt`) ends it
    after the step where the ranks agree on it (or the epoch's end), with its checkpoint, by
    :class:`~hetgrad.preempt.Preempted` on every rank. An epoch an action splits
    (``progress.split_at``) is two fits, its row one."""
    actions, progress = job.actions, job.progress
    own = _Own(clock=_EpochClock(progress), split=_Split(progress),
               broadcast=hk_callbacks.BroadcastGlobalVariablesCallback(0, built_alike=True),
               check=_StopCheck(job.comm, STOP_CHECK_EVERY.get(job.comm.kind, 10))
               if job.checkpointer.dir is not None else None)
    t0 = time.perf_counter()
    with preempt.listening():
        for epoch in range(job.start_epoch, job.spec.epochs):
            first, part = (job.start_step if epoch == job.start_epoch else 0), None
            progress.continued, progress.shift = False, progress.shift if first else 0
            while True:
                row, early = _epoch_part(job, epoch, first, part, own)
                if not progress.split_step:
                    break
                part, first = row, progress.go_on()
            row["elapsed_s"] = time.perf_counter() - t0   # all of it: the actions' too
            progress.epochs.append(row)
            if early or progress.stop_requested:
                break
            job.comm.barrier()   # the next epoch starts together: rank 0's checkpoint is
            # not counted as the other ranks' waiting in its first step
    for action in actions:
        action.on_train_end(job)
    if progress.stop_requested:
        _stopped(job)
    return time.perf_counter() - t0


@dataclass
class _Own:
    """The loop's own Keras callbacks: the same objects in every fit of the run."""

    clock: _EpochClock
    split: "_Split"
    broadcast: Any
    check: _StopCheck | None

    def around(self, theirs: list) -> list:
        """Every fit's callbacks but the clock and the metric average, ``theirs`` the
        actions'."""
        return [self.broadcast, *theirs, self.split, *([self.check] if self.check else [])]


def _epoch_part(job: "Run", epoch: int, first: int, part: dict | None,
                own: _Own) -> tuple[dict, bool]:
    """One fit of ``epoch`` from step ``first`` (the rest of a split one after ``part``, its
    first fit's row), with the actions' hooks around it; its row (for a rest: the epoch's)
    and whether a callback ended the training early. After it the ranks agree whether to
    stop, or to go on with the epoch after a split (``progress.split_step``)."""
    progress, actions = job.progress, job.actions
    progress.first_step, progress.split_at, progress.split_step = first, 0, 0
    for action in actions:
        action.on_epoch_begin(job, epoch)
    check = own.check
    try:
        row = _fit_epoch(job, epoch, first, own.clock,
                         own.around([c for a in actions for c in a.callbacks(job)]))
    except BaseException:
        for action in actions:
            with contextlib.suppress(Exception):   # the epoch's error is the one to see
                action.on_error(job)
        raise
    row = _joined(part, row) if part is not None else row
    if check and check.steps and first + check.steps < job.plan.steps_per_epoch:
        progress.stopped_at_step = row["stopped_at_step"] = first + check.steps
    early, asked = _agree_on_stopping(job, bool(check and check.steps or progress.split_step))
    if progress.split_step and (asked or progress.stopped_at_step):   # a stop wins
        progress.stopped_at_step = row["stopped_at_step"] = progress.split_step
        progress.split_step = 0
    if progress.split_step:   # the epoch goes on, where it stands unless an action re-plans
        row["split_at_step"] = progress.continue_step = progress.split_step
    progress.stop_requested = bool(progress.stopped_at_step) or (
        asked and not early and epoch + 1 < job.spec.epochs)
    for action in actions:
        (action.on_split if progress.split_step else action.on_epoch_end)(job, epoch, row)
    return row, early


class _Split(keras.callbacks.Callback):
    """Ends the fit after step ``progress.split_at`` of the epoch (when an action set one),
    noting it in ``progress.split_step``; after the actions' callbacks, so that a stop of
    theirs is not taken for a split."""

    def __init__(self, progress):
        super().__init__()
        self.progress = progress

    def on_train_batch_end(self, batch, logs=None):
        p = self.progress   # (>=: with steps_per_execution the step may be passed)
        if self.model.stop_training:   # a user's callback ended the training: no split
            return
        if p.split_at and not p.split_step and p.first_step + batch + 1 >= p.split_at:
            p.split_step = p.first_step + batch + 1
            self.model.stop_training = True


def _joined(part: dict, rest: dict) -> dict:
    """An epoch's row from its two fits': the rest's (its metrics; its time counted from the
    first fit's start), the first fit's row under ``split``."""
    row = {k: v for k, v in rest.items() if k != "first_step"}
    row["split"] = {k: v for k, v in part.items() if k != "epoch"}
    return row


def _stopped(job: "Run"):
    """Raise :class:`~hetgrad.preempt.Preempted` where the ranks stopped."""
    step, done = job.progress.stopped_at_step, job.progress.epochs[-1]["epoch"]
    preempt.stop(done - 1 if step else done, job.spec.epochs, str(job.checkpointer.dir),
                 job.rank, (step, job.plan.steps_per_epoch) if step else None)


def _agree_on_stopping(job: "Run", checked: bool = False) -> tuple[bool, bool]:
    """One allgather per epoch, so every rank stops together: whether any rank's model set
    ``stop_training`` (early stopping; not the stop check's own, ``checked``) and whether any
    rank was asked to stop. A request with no checkpoint directory to save to is ignored
    (rank 0 says so)."""
    flags = job.comm.allgather((bool(job.model.stop_training) and not checked,
                                preempt.requested()))
    early, asked = any(f[0] for f in flags), any(f[1] for f in flags)
    if asked and (job.checkpointer is None or job.checkpointer.dir is None):
        preempt.clear()
        if job.rank == 0:
            print(f"hetgrad: warning: {preempt.STOP_SIGNAL.name} ignored: no checkpoint "
                  "directory to save to", file=sys.stderr, flush=True)
        asked = False
    return early, asked


def _fit_epoch(job: "Run", epoch: int, first: int, clock: _EpochClock, callbacks: list) -> dict:
    """One ``model.fit`` epoch (from step ``first``) on the plan in effect; the epoch's row
    (metrics over all ranks, averaged before the actions' callbacks see them)."""
    batches = job.batches(epoch, first)
    metrics = hk_callbacks.MetricAverageCallback(job.plan.shard_sizes[job.rank])
    job.aggregation.step.assign(first)   # where the plan's weights are in the epoch
    try:
        with tf.device(job.device):
            history = job.model.fit(batches, epochs=epoch + 1, initial_epoch=epoch,
                                    steps_per_epoch=job.plan.steps_per_epoch - first,
                                    verbose=0,
                                    validation_data=None if job.progress.split_at
                                    else job.spec.validation,   # not inside an epoch
                                    shuffle=False,  # the pipeline orders each epoch itself
                                    callbacks=[clock, metrics, *callbacks])
    except tf.errors.InvalidArgumentError as exc:
        if NONFINITE in str(exc):
            error = _nonfinite(job, epoch)
            if error.reported_elsewhere:   # the culprit's abort ends this rank, quietly
                quiet_on_sigterm()
            raise error from None
        raise
    logs = {k: float(v[-1]) for k, v in history.history.items()}
    row = {"epoch": epoch + 1, **logs, "time_s": clock.seconds,
           **({"validation_s": clock.validation} if clock.validation else {})}
    return {**row, "first_step": first} if first else row


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
