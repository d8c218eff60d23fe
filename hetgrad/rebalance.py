"""Semi-dynamic rebalancing: measure each rank's busy time while training, re-plan between epochs.

A synchronous step on rank ``i`` is *busy* (load data, forward, backward: its own speed) and then
*waits* in the gradient exchange for the slowest rank. :class:`~hetgrad.timing.StepTimer`
splits the two inside the training graph with two ``tf.timestamp`` ops, so the measurement
costs no extra step and no probe. After an epoch :class:`Rebalancer` gathers every rank's busy
time, turns it into a measured speed ``samples_i / busy_i`` and, when the ranks' busy times
differ by more than a threshold, builds a new plan with the same global batch (so the same
steps per epoch and the same optimisation) for the next epoch. Every rank computes the same
plan from the same gathered numbers; nothing is broadcast.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

from .errors import ConfigError
from .partition import Plan, make_plan


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
            raise ConfigError(f"must be >= 0, got {threshold}", field="rebalance_threshold")
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
