"""Semi-dynamic rebalancing: measure each rank's busy time while training, re-plan between epochs.

A synchronous step on rank ``i`` is *busy* (load data, forward, backward: its own speed) and then
*waits* in the gradient exchange for the slowest rank. :class:`~hetgrad.timing.StepTimer`
splits the two inside the training graph with two ``tf.timestamp`` ops, so the measurement
costs no extra step and no probe. After an epoch :class:`Rebalancer` gathers every rank's busy
time per step, a new point of that rank's step-time model (:class:`OnlineModel`: the probe's
curve, rescaled to what training measures, recent epochs weighing more), and re-plans with
the same global batch (so the same steps per epoch and the same optimisation) only when the
new plan's predicted epoch time is shorter by more than the threshold and than the noise seen
between epochs, and, for a gain under :data:`CONFIRM_BELOW`, in two epochs running
(hysteresis: steady speeds give no churn, a real slowdown is acted on after one epoch).
Every rank computes the same plan from the same gathered numbers.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

from .errors import ConfigError
from .partition import Plan, make_plan
from .perfmodel import StepModel, constant, scale_through


@dataclass
class EpochBalance:
    """What one epoch measured and decided (one entry of the record's ``balance`` list)."""

    epoch: int                     # 1-based, the epoch just measured
    busy_s: list[float]
    wait_s: list[float]
    measured_samples_per_s: list[float]
    measured_step_s: list[float]   # busy / steps: the new point of each rank's model
    predicted_step_s: list[float] | None   # each rank's model before this epoch (None: no
    #                                        model in seconds yet, e.g. planned on --speeds)
    imbalance: float               # max(busy) / mean(busy) - 1
    batches: list[int]             # the plan used in that epoch
    warmup: bool = False           # it traced the step (a process's first epoch, unless
    #                                the probe ran the step, or a retrace): recorded only
    scales: list[float] | None = None    # each rank's model correction after this epoch
    noise: float = 0.0             # typical epoch-to-epoch change of a rank's step time
    predicted_gain: float = 0.0    # old plan's predicted epoch time / the candidate's - 1
    wanted: bool = False           # the gain cleared the bar (threshold and noise)
    replanned: bool = False
    new_batches: list[int] | None = None
    predicted_speedup: float = 1.0  # epoch time with the old plan / with the new one


CONFIRM_BELOW = 0.15  # a smaller predicted gain must show in two consecutive epochs


def imbalance(busy: Sequence[float]) -> float:
    """``max / mean - 1``: 0 when every rank is busy equally long."""
    mean = sum(busy) / len(busy)
    return max(busy) / mean - 1.0 if mean > 0 else 0.0


class OnlineModel:
    """One rank's step time: its probe model times a scale fitted to the measured points
    ``(b, seconds per step)`` (weights ``decay ** age``); a point off by more than ``jump``
    (relative) from the current fit is a change of speed, and the older points are dropped."""

    def __init__(self, base: StepModel, decay: float = 0.5, jump: float = 0.2):
        self.base, self.decay, self.jump = base, decay, jump
        self.points: list[tuple[float, float]] = []
        self.changes: list[float] = []   # relative misses of each new point (noise)

    def scale(self) -> float:
        w = [self.decay ** (len(self.points) - 1 - k) for k in range(len(self.points))]
        return scale_through(self.base, self.points, w)

    def add(self, b: float, t: float) -> None:
        if self.points:
            miss = abs(t / self.model().time(b) - 1.0)
            self.changes.append(miss)
            if miss > self.jump:
                self.points = []
        self.points.append((float(b), float(t)))

    def model(self) -> StepModel:
        return self.base.scaled(self.scale())


class Rebalancer:
    """Measure every epoch, update each rank's :class:`OnlineModel`, re-plan when it pays.

    ``comm`` needs only ``allgather``. ``models``: the probe's step models (None: constant
    models from the plan's speeds). With ``threshold=None`` it only measures. An epoch that
    traced the step (a process's first, unless the probe ran training's own step; one after
    a change that retraces it) is only recorded: its times hold the tracing, not the ranks'
    speeds.
    """

    def __init__(self, comm, *, models: Sequence[StepModel] | None = None,
                 threshold: float | None = 0.03, min_batch: int = 1,
                 max_batch: Sequence[int] | int | None = None, drop_remainder: bool = False):
        if threshold is not None and not threshold >= 0:
            raise ConfigError(f"must be >= 0, got {threshold}", field="rebalance_threshold")
        self.comm = comm
        self.threshold = threshold
        self.min_batch, self.max_batch = min_batch, max_batch
        self.drop_remainder = drop_remainder
        self.online = [OnlineModel(m) for m in models] if models is not None else None
        self.history: list[EpochBalance] = []

    def after_epoch(self, epoch: int, plan: Plan, busy_s: float, wait_s: float,
                    traced: bool = False) -> Plan:
        """Gather every rank's timing for ``epoch`` (0-based) and return the plan for the next
        (``traced``: the epoch traced the step, so it is only recorded)."""
        rows = self.comm.allgather((float(busy_s), float(wait_s)))
        busy = [max(b, 1e-9) for b, _ in rows]
        step_s = [b / plan.steps_per_epoch for b in busy]
        if self.online is None:
            self.online = [OnlineModel(constant(s)) for s in plan.speeds]
        entry = EpochBalance(epoch=epoch + 1, busy_s=busy, wait_s=[w for _, w in rows],
                             measured_samples_per_s=[n / b for n, b in zip(plan.shard_sizes,
                                                                           busy)],
                             measured_step_s=step_s, predicted_step_s=self._predicted(plan),
                             imbalance=imbalance(busy),
                             batches=list(plan.batches), warmup=traced)
        self.history.append(entry)
        if entry.warmup:
            return plan
        for model, b, t in zip(self.online, plan.batches, step_s):
            model.add(b, t)
        entry.scales = [m.scale() for m in self.online]
        entry.noise = self.noise()
        return self._decide(entry, plan)

    def in_seconds(self) -> bool:
        """Whether the ranks' step models are in seconds (probed, or fitted to an epoch)."""
        return self.online is not None and not all(
            m.base.kind == "constant" and not m.points for m in self.online)

    def _predicted(self, plan: Plan) -> list[float] | None:
        """Each rank's step time at its batch as its model predicts it, when the models are in
        seconds (probed, or fitted to a measured epoch)."""
        if not self.in_seconds():
            return None
        return [m.model().time(b) for m, b in zip(self.online, plan.batches)]

    def noise(self) -> float:
        """The median relative miss of the models' earlier predictions (not this epoch's)."""
        misses = sorted(c for m in self.online for c in m.changes[-4:-1])
        return misses[len(misses) // 2] if misses else 0.0

    def _decide(self, entry: EpochBalance, plan: Plan) -> Plan:
        """Re-plan when the gain clears the bar, and, below :data:`CONFIRM_BELOW`, did so in
        the measured epoch before too (one noisy epoch does not move work; a big change does at
        once)."""
        models = [m.model() for m in self.online]
        candidate = make_plan(models, plan.global_batch, plan.dataset_size,
                              min_batch=self.min_batch, max_batch=self.max_batch,
                              drop_remainder=self.drop_remainder)
        old_t = max(m.time(b) for m, b in zip(models, plan.batches))
        entry.predicted_gain = old_t / candidate.predicted_step_s - 1.0
        if self.threshold is None or candidate.batches == plan.batches:
            return plan
        entry.wanted = entry.predicted_gain > max(self.threshold, 2 * entry.noise)
        before = next((e for e in reversed(self.history[:-1]) if not e.warmup), None)
        confirmed = before is not None and before.wanted and not before.replanned
        if not entry.wanted or (entry.predicted_gain < CONFIRM_BELOW and not confirmed):
            return plan
        entry.replanned, entry.new_batches = True, list(candidate.batches)
        entry.predicted_speedup = entry.predicted_gain + 1.0
        return candidate

    def records(self) -> list[dict]:
        return [asdict(e) for e in self.history]
