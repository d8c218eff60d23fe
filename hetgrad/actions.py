"""What a training run does around its epochs, each an :class:`Action` with one small
interface (orbit-style: the loop in :func:`hetgrad.loop.run_epochs` knows none of them;
:mod:`hetgrad.assembly` makes them, in one order).

An action may add Keras callbacks to every epoch's ``model.fit`` (per-step work) and acts at
epoch boundaries on the :class:`~hetgrad.run.Run` (its ``progress``) and the epoch's record
row. Every rank runs every action (collectives inside them stay matched); printing is rank
0's.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Sequence

from .compat import keras
from .emulate import SpeedEmulator, speed_at
from ._keras.callbacks import DensityWarmup
from ._keras.optimizer import set_plan
from ._keras.user_callbacks import OneFit
from .data.order import step_span

if TYPE_CHECKING:
    from .data.sources import Source
    from .run import Run as Job


class Action:
    """Hooks with no effect; subclasses override what they need."""

    def callbacks(self, job: "Job") -> list:
        """Keras callbacks for this epoch's ``model.fit``."""
        return []

    def on_epoch_begin(self, job: "Job", epoch: int) -> None:
        pass

    def on_epoch_end(self, job: "Job", epoch: int, row: dict) -> None:
        """``row`` is the epoch's record entry (loss, accuracy, time_s, ...); add to it."""

    def on_split(self, job: "Job", epoch: int, row: dict) -> None:
        """The first fit of an epoch split to decide inside it (``progress.split_step``)
        ended, ``row`` its own; the epoch goes on (the loop: its hooks again, a second fit,
        then ``on_epoch_end`` with the epoch's row)."""

    def on_train_end(self, job: "Job") -> None:
        pass

    def on_error(self, job: "Job") -> None:
        """An epoch raised (this rank only: undo local state, no collective)."""


class Emulation(Action):
    """Emulated speeds: the schedule's speed from each epoch on, a sleep before each call into
    the train step for all its samples."""

    def __init__(self, schedule: dict[int, list[float]], emulator: SpeedEmulator):
        self.schedule, self.emulator = schedule, emulator

    @classmethod
    def of(cls, schedule: dict[int, list[float]], unit_s: float, rank: int) -> "Emulation":
        return cls(schedule, SpeedEmulator(schedule[0][rank], unit_s))

    def callbacks(self, job):
        return [self.emulator.callback(
            lambda step: step_span(job.plan, job.rank, job.progress.first_step + step)[1])]

    def on_epoch_begin(self, job, epoch):
        self.emulator.set_speed(speed_at(self.schedule, epoch, job.rank))


class Evaluation(Action):
    """Rank 0 scores the whole test set after every epoch and prints a progress line."""

    def __init__(self, test: "Source", verbose: bool):
        self.test, self.verbose = test, verbose
        self.batches = None

    def on_epoch_end(self, job, epoch, row):
        if job.rank != 0 or job.progress.stopped_at_step:   # stopping: no time to score
            return
        if self.batches is None:
            from .data.reader import in_order
            self.batches = in_order(self.test, 512)
        t0 = time.perf_counter()
        (test_loss, score), name = job.model.evaluate(self.batches, verbose=0), _metric(row)
        plan = job.plan
        row.update(test_loss=float(test_loss), **{f"test_{name}": float(score)},
                   eval_time_s=time.perf_counter() - t0,
                   samples_per_s=(plan.dataset_size - plan.dropped) / row["time_s"],
                   batches=list(plan.batches))
        if self.verbose:
            short = "acc" if name == "accuracy" else name
            print(f"epoch {epoch + 1:3d}/{job.spec.epochs}  loss {row['loss']:.4f}  "
                  f"{short} {row[name]:.4f}  test_{short} {score:.4f}  "
                  f"{row['time_s']:.2f}s  {row['samples_per_s']:.0f} samples/s", flush=True)


def _metric(row: dict) -> str:
    """The one metric ``hetgrad train`` compiles (accuracy, or mae for regression)."""
    return "accuracy" if "accuracy" in row else "mae"


class Balance(Action):
    """Every epoch: each rank's busy/wait seconds from the aggregation's timer into the row
    and the rebalancer; a new plan from it (with ``--rebalance``) takes effect at once. An
    epoch that traced the step (the aggregation counts its traces) is recorded, not acted on."""

    def __init__(self, rebalancer, verbose: bool):
        self.rebalancer, self.verbose = rebalancer, verbose
        self.traces = 0   # the aggregation's trace count at the epoch's start

    def callbacks(self, job):
        timer = job.aggregation.timer
        return [keras.callbacks.LambdaCallback(on_epoch_begin=lambda e, logs: timer.start())]

    def on_epoch_begin(self, job, epoch):
        self.traces = job.aggregation.traces   # (a split epoch's rest: never recorded)

    def on_split(self, job, epoch, row):   # the fit's timings (the choice's exchange time)
        row.update(zip(("busy_s", "wait_s"), job.aggregation.timer.read()))

    def on_epoch_end(self, job, epoch, row):
        self.on_split(job, epoch, row)
        if job.progress.stopped_at_step or job.progress.first_step:
            return   # a partial epoch: its timings are not an epoch's
        traced = job.aggregation.traces != self.traces   # its times hold a trace's
        new = self.rebalancer.after_epoch(epoch, job.plan, row["busy_s"], row["wait_s"], traced)
        if new is job.plan:
            return
        if job.rank == 0 and self.verbose:
            e = self.rebalancer.history[-1]
            print(f"hetgrad: rebalance after epoch {epoch + 1}: busy "
                  f"{[round(b, 2) for b in e.busy_s]} s, predicted {100 * e.predicted_gain:.0f}% "
                  f"faster epochs, batches {job.plan.batches} -> {new.batches}", flush=True)
        job.progress.plan = new
        set_plan(job.optimizer, new)


class Sparse(Action):
    """The sparse exchange's density for each epoch (DGC's warm-up) and its per-step
    statistics (k, |U|, bytes), tagged with epoch and step, into the progress'
    ``sparse_steps``."""

    def callbacks(self, job):
        return [DensityWarmup()]

    def on_epoch_end(self, job, epoch, row):
        steps = job.reducer.take_log()
        row["density"] = job.reducer.density
        if steps:
            row["buildup"] = sum(s["buildup"] for s in steps) / len(steps)
        first, _ = job.progress.counted(job.plan.steps_per_epoch)
        job.progress.sparse_steps += [{"epoch": epoch + 1, "step": first + i, **s}
                                      for i, s in enumerate(steps)]

    on_split = on_epoch_end   # the first fit's steps


class Checkpointing(Action):
    """Rank 0 saves model, optimizer, plan in effect and every rank's exchange state (the
    sparse memory of the optimizer's reducer, gathered to rank 0): when due, after the last
    epoch, and when the ranks were asked to stop (:mod:`hetgrad.preempt`) -- then at the step
    where they stopped."""

    def __init__(self, checkpointer):
        self.checkpointer = checkpointer

    def on_epoch_end(self, job, epoch, row):
        step = job.progress.stopped_at_step     # stopped in the middle of the epoch
        last = epoch + 1 == job.spec.epochs or job.progress.stop_requested
        if not (step or self.checkpointer.due(epoch + 1, last)):
            return
        states = job.comm.gather(job.reducer.state_dict(), root=0)
        per_rank = states if job.rank == 0 and any(states) else None
        self.checkpointer.save(epoch if step else epoch + 1, per_rank, step=step,
                               plan=job.plan.to_dict(), shift=job.progress.shift if step else 0)

    def on_train_end(self, job):
        if not job.progress.stop_requested:
            self.checkpointer.save_final_weights()


class Watchdog(Action):
    """Ends every rank when this one makes no progress for ``timeout`` seconds
    (:class:`hetgrad.watchdog.StepWatchdog`): steps, evaluation and epoch boundaries count."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.dog = None

    def on_epoch_begin(self, job: "Job", epoch: int) -> None:
        if self.dog is None:
            from .watchdog import StepWatchdog, abort_all
            self.dog = StepWatchdog(self.timeout, abort_all(job.rank, job.size))
        self.dog.beat(f"epoch {epoch + 1}")

    def callbacks(self, job: "Job") -> list:
        return [self.dog]

    def on_epoch_end(self, job: "Job", epoch: int, row: dict) -> None:
        self.dog.beat(f"the end of epoch {epoch + 1}")

    def on_train_end(self, job: "Job") -> None:
        if self.dog is not None:
            self.dog.close()


class UserCallbacks(Action):
    """The user's Keras callbacks (those that run on this rank), shown the loop's per-epoch
    ``model.fit`` calls as one (:class:`hetgrad._keras.user_callbacks.OneFit`)."""

    def __init__(self, callbacks: Sequence, epochs: int):
        self.adapter = OneFit(callbacks, epochs)

    def callbacks(self, job):
        return [self.adapter]

    def on_epoch_begin(self, job, epoch):
        progress = job.progress
        self.adapter.first, self.adapter.steps = progress.counted(job.plan.steps_per_epoch)
        self.adapter.progress = progress

    def on_train_end(self, job):
        self.adapter.finish()
