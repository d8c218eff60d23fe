"""The actions that only observe a run (:mod:`hetgrad.actions`): TensorBoard's scalars
(:mod:`hetgrad.scalars`) and the step timeline (:mod:`hetgrad.timeline`), written by rank 0."""
from __future__ import annotations

import math
import socket
import sys
import time

from . import compat
from .actions import Action
from .compat import keras


class Noise(Action):
    """Every epoch: the mean ``S`` and ``|G|^2`` of its steps (:mod:`hetgrad.noise`; the
    ranks' numbers summed here, once),
    ``b_noise`` from them, and ``b_noise_smoothed`` (bias-corrected moving averages,
    :class:`hetgrad.gns.NoiseScale`, ``decay`` per step of the run's first global batch: an
    epoch weighs as many such steps as its measured steps stand for, as Pollux weighs its
    steps by their batch) and ``b_noise_interval``, one standard error down and up
    (:meth:`~hetgrad.gns.NoiseScale.interval`; its upper end None: unbounded) into the row."""

    def __init__(self, decay: float = 0.998):
        from .gns import NoiseScale
        self.smooth = NoiseScale(decay=decay)

    def on_epoch_begin(self, job, epoch):   # (what steps outside the epochs wrote dropped)
        job.aggregation.noise.reserve(job.plan.steps_per_epoch)

    def on_epoch_end(self, job, epoch, row):
        noise = job.aggregation.noise
        got = noise.take(job.comm.allreduce_sum)
        if not got.steps:
            return
        b0 = job.spec.global_batch   # the run's first (a resumed adaptive run's too)
        every = int(noise.every)   # this fit's steps' (changed at a fit's begin only)
        self.smooth.add(got.s, got.g2, weight=got.steps * every * job.plan.global_batch / b0,
                        spread=(got.var_s, got.var_g2, got.cov))
        interval = self.smooth.interval()
        row.update(gns_noise=got.s, gns_signal=got.g2, gns_steps=got.steps, gns_every=every,
                   b_noise=got.s / got.g2 if got.g2 > 0 else None,
                   b_noise_smoothed=self.smooth.b_noise,
                   b_noise_interval=None if interval is None else [   # high None: unbounded
                       interval[0], None if math.isinf(interval[1]) else interval[1]],
                   gns_preconditioned=noise.precondition is not None)

    on_split = on_epoch_end   # the first fit's steps: what the choice inside it goes by


class Scalars(Action):
    """Rank 0 writes each epoch's scalars, the run's and every rank's, for TensorBoard
    (:mod:`hetgrad.scalars`), in a new run directory under ``base``. A write that fails
    (disk full, a file system gone) is reported once and ends the scalars, not the run."""

    def __init__(self, base: str, rebalancer):
        self.base, self.rebalancer, self.writer = base, rebalancer, None
        self.failed = False

    def on_epoch_begin(self, job, epoch):
        if job.rank == 0 and self.writer is None and not self.failed:
            from .scalars import ScalarWriter
            self.writer = _guarded(self, "TensorBoard scalars", ScalarWriter, self.base,
                                   job.size)
            if self.writer is not None and job.spec.verbose:
                print(f"hetgrad: TensorBoard scalars -> {self.writer.dir}", flush=True)

    def on_epoch_end(self, job, epoch, row):
        if self.writer is None or self.failed:
            return
        from .scalars import epoch_scalars
        lr = row.get("lr")   # the adaptive batch's scaled one
        try:
            lr = lr if lr is not None else compat.learning_rate(job.optimizer)
        except (AttributeError, TypeError, ValueError):   # an optimizer without one
            lr = None
        run, ranks = epoch_scalars(row, _measured(self.rebalancer, epoch),
                                   row.get("global_batch", job.plan.global_batch), lr)
        _guarded(self, "TensorBoard scalars", self.writer.write, epoch + 1, run, ranks)

    def on_train_end(self, job):
        if self.writer is not None:
            _guarded(self, "TensorBoard scalars", self.writer.close)


def _guarded(observer, what: str, write, *args):
    """``write(*args)``; an OSError is printed once (rank 0 writes) and sets
    ``observer.failed``: observing never ends a run."""
    try:
        return write(*args)
    except OSError as exc:
        if not observer.failed:
            print(f"hetgrad: warning: {what} no longer written: {exc}", file=sys.stderr,
                  flush=True)
        observer.failed = True
        return None


def _measured(rebalancer, epoch: int):
    """What the ranks measured in ``epoch`` (0-based), None if it was not measured (partial)."""
    history = rebalancer.history
    return history[-1] if history and history[-1].epoch == epoch + 1 else None


class _Spans(keras.callbacks.Callback):
    """After each call into the train step (one step, or ``steps_per_execution``): the last
    step's times, when the sampler wants a step of the call."""

    def __init__(self, timeline: "Timeline", timer, first: int):
        super().__init__()
        self.timeline, self.timer, self.first = timeline, timer, first
        self.per_call, self.end, self.next = 1, None, first

    def on_epoch_begin(self, epoch, logs=None):
        self.per_call = compat.steps_per_execution(self.model)
        steps = (self.params or {}).get("steps")
        self.end, self.next = (self.first + steps if steps else None), self.first

    def on_train_batch_end(self, batch, logs=None):
        end = self.next + self.per_call
        ran, self.next = range(self.next, min(end, self.end or end)), end
        if self.timeline.sampler.wants(ran):
            self.timeline.spans.append((self.timeline.epoch + 1, ran[-1], *self.timer.span()))


class Timeline(Action):
    """Every rank keeps the spans of the steps ``sampler`` picks (:mod:`hetgrad.timeline`); at
    each epoch's end rank 0 gathers them, marks re-plans and checkpoints, and writes the
    trace to ``path`` (at most every 30 s, and at the end; a failed write is reported once and
    ends the writing, not the run)."""

    def __init__(self, path: str, sampler, rebalancer, checkpointer):
        self.path, self.sampler = path, sampler
        self.rebalancer, self.checkpointer = rebalancer, checkpointer
        self.spans: list = []
        self.trace = None
        self.epoch, self.begun, self.failed = 0, 0.0, False

    def on_epoch_begin(self, job, epoch):
        rest = job.progress.continued   # a split epoch's: begun with its first fit
        if not rest:
            self.epoch, self.begun = epoch, time.time()
        self.sampler.begin_epoch(*job.progress.counted(job.plan.steps_per_epoch), rest=rest)

    def callbacks(self, job):
        first, _ = job.progress.counted(job.plan.steps_per_epoch)
        return [_Spans(self, job.aggregation.timer, first)]

    def on_epoch_end(self, job, epoch, row):
        mine = (self.spans, (epoch + 1, self.begun, time.time()), socket.gethostname())
        gathered, self.spans = job.comm.gather(mine, root=0), []
        if job.rank != 0 or self.failed:
            return
        if self.trace is None:
            from .timeline import Trace
            self.trace = Trace(self.path, job.size)
        for r, (spans, epoch_span, host) in enumerate(gathered):
            self.trace.add(r, spans, epoch_span)
            self.trace.hosts[r] = host
        self._mark(epoch, row)
        _guarded(self, "the timeline", self.trace.write)

    def _mark(self, epoch: int, row: dict) -> None:
        """A re-plan decided by this epoch's timings or a new global batch (marked at its
        end), a checkpoint saved in it."""
        measured = _measured(self.rebalancer, epoch)
        if measured is not None and measured.replanned:
            self.trace.mark("re-plan", time.time(), epoch=epoch + 1, batches=measured.batches,
                            new_batches=measured.new_batches,
                            predicted_gain=round(measured.predicted_gain, 4))
        if row.get("batch_changed"):
            self.trace.mark("global batch", time.time(), epoch=epoch + 1,
                            batch=row["global_batch"], new_batch=row["batch_next"])
        save = self.checkpointer.last_save
        if save is not None and save[0] >= self.begun:
            self.trace.mark("checkpoint", save[0], dur=save[1] - save[0], epoch=epoch + 1)

    def on_train_end(self, job):
        if self.trace is not None and not self.failed:
            _guarded(self, "the timeline", self.trace.write, True)
            if not self.failed and job.spec.verbose:
                print(f"hetgrad: timeline -> {self.path}", flush=True)

    def summary(self) -> dict | None:
        """Rank 0's summary of the trace for the record (None elsewhere)."""
        return self.trace.summary() if self.trace is not None else None
