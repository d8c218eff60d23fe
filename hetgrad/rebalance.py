"""Semi-dynamic rebalancing: measure each rank's busy time while training, re-plan between epochs.

A synchronous step on rank ``i`` is *busy* (load data, forward, backward: its own speed) and then
*waits* in the gradient exchange for the slowest rank. :class:`StepTimer` splits the two inside
the training graph with two ``tf.timestamp`` ops, so the measurement costs no extra step and no
probe. After an epoch :class:`Rebalancer` gathers every rank's busy time, turns it into a
measured speed ``samples_i / busy_i`` and, when the ranks' busy times differ by more than a
threshold, builds a new plan with the same global batch (so the same steps per epoch and the
same optimisation) for the next epoch. Every rank computes the same plan from the same gathered
numbers; nothing is broadcast.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Sequence

from .errors import HetgradError
from .partition import Plan, make_plan


class StepTimer:
    """Per-rank busy and wait seconds, accumulated by the train step itself.

    busy: from the end of the previous exchange to this rank's local gradients being ready;
    wait: from then to the end of this step's exchange (idle time + communication).
    Call :meth:`start` when an epoch begins and :meth:`read` when it ends.
    """

    def __init__(self):
        import tensorflow as tf
        var = lambda name: tf.Variable(0.0, dtype=tf.float64, trainable=False,  # noqa: E731
                                       name=f"hetgrad_{name}")
        self.busy, self.wait, self.last_done = var("busy_s"), var("wait_s"), var("last_done")

    def start(self) -> None:
        self.busy.assign(0.0)
        self.wait.assign(0.0)
        self.last_done.assign(time.time())  # tf.timestamp() counts from the same Unix epoch

    def ready(self, grads):
        """In the graph, once the local gradients exist: count busy time, return the time."""
        import tensorflow as tf
        deps = [t for t in tf.nest.flatten(grads, expand_composites=True) if t is not None]
        with tf.control_dependencies(deps):
            now = tf.timestamp()
        self.busy.assign_add(now - self.last_done)
        return now

    def done(self, t_ready, reduced) -> None:
        """In the graph, once the exchanged gradients exist: count wait time."""
        import tensorflow as tf
        deps = [t for t in tf.nest.flatten(reduced, expand_composites=True) if t is not None]
        with tf.control_dependencies(deps):
            now = tf.timestamp()
        self.wait.assign_add(now - t_ready)
        self.last_done.assign(now)

    def read(self) -> tuple[float, float]:
        return float(self.busy.numpy()), float(self.wait.numpy())


class WallTimer:
    """The same split for a Python training loop (the sparse path): call :meth:`ready` when the
    local gradients are computed and :meth:`done` when the exchange returns."""

    def start(self) -> None:
        self.busy = self.wait = 0.0
        self._last = time.perf_counter()

    def ready(self) -> None:
        now = time.perf_counter()
        self.busy += now - self._last
        self._ready, self._last = now, now

    def done(self) -> None:
        now = time.perf_counter()
        self.wait += now - self._ready
        self._last = now

    def read(self) -> tuple[float, float]:
        return self.busy, self.wait


@dataclass
class EpochBalance:
    """What one epoch measured and decided (one entry of the record's ``balance`` list)."""

    epoch: int                     # 1-based, the epoch just measured
    busy_s: list[float]
    wait_s: list[float]
    measured_samples_per_s: list[float]
    imbalance: float               # max(busy) / mean(busy) - 1
    batches: list[int]             # the plan used in that epoch
    warmup: bool = False           # first epoch of a process: measured, never acted on
    replanned: bool = False
    new_batches: list[int] | None = None
    predicted_speedup: float = 1.0  # epoch time with the old plan / with the new one


def imbalance(busy: Sequence[float]) -> float:
    """``max / mean - 1``: 0 when every rank is busy equally long."""
    mean = sum(busy) / len(busy)
    return max(busy) / mean - 1.0 if mean > 0 else 0.0


class Rebalancer:
    """Re-plan at an epoch boundary when ``imbalance(busy) > threshold``.

    ``comm`` needs only ``allgather`` (mpi4py's communicator). The new plan keeps the global
    batch, the dataset size and the per-rank bounds, and is taken only if it changes a batch.
    With ``threshold=None`` it only measures (every epoch still gets an :class:`EpochBalance`).
    The first epoch it sees is only recorded: it holds the step's tracing and warm-up, which
    are not the ranks' speeds (a re-plan on it was seen to make the next epoch worse).
    """

    def __init__(self, comm, *, threshold: float | None = 0.05, min_batch: int = 1,
                 max_batch: Sequence[int] | int | None = None):
        if threshold is not None and not threshold >= 0:
            raise HetgradError(f"must be >= 0, got {threshold}", flag="--rebalance-threshold")
        self.comm = comm
        self.threshold = threshold
        self.min_batch = min_batch
        self.max_batch = max_batch
        self.history: list[EpochBalance] = []

    def after_epoch(self, epoch: int, plan: Plan, busy_s: float, wait_s: float) -> Plan:
        """Gather every rank's timing for ``epoch`` (0-based) and return the plan for the next."""
        rows = self.comm.allgather((float(busy_s), float(wait_s)))
        busy = [max(b, 1e-9) for b, _ in rows]
        speeds = [n / b for n, b in zip(plan.shard_sizes, busy)]
        entry = EpochBalance(epoch=epoch + 1, busy_s=busy, wait_s=[w for _, w in rows],
                             measured_samples_per_s=speeds, imbalance=imbalance(busy),
                             batches=list(plan.batches))
        entry.warmup = not self.history
        new = plan
        if self.threshold is not None and not entry.warmup and entry.imbalance > self.threshold:
            candidate = make_plan(speeds, plan.global_batch, plan.dataset_size,
                                  min_batch=self.min_batch, max_batch=self.max_batch)
            if candidate.batches != plan.batches:
                old_t = max(n / s for n, s in zip(plan.shard_sizes, speeds))
                new_t = max(n / s for n, s in zip(candidate.shard_sizes, speeds))
                entry.replanned, entry.new_batches = True, list(candidate.batches)
                entry.predicted_speedup = old_t / new_t
                new = candidate
        self.history.append(entry)
        return new

    def records(self) -> list[dict]:
        return [asdict(e) for e in self.history]
