"""Partitioner: per-rank step-time models (or speeds) -> local batch sizes that finish a step
together, and data shards with identical steps per epoch.

The plan is a pure function of its inputs, so every rank computes (or loads) the same one.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from .errors import ConfigError, HetgradError, InputFileError
from .goodput import full_tail, thin
from .io import read_json, typed, write_json
from .perfmodel import StepModel, constant, equal_time_batches, equal_time_or_proportional


@dataclass(frozen=True)
class Plan:
    """Who gets how much: batch ``batches[r]`` and shard ``[shard_starts[r], +shard_sizes[r])``."""

    speeds: list[float]
    global_batch: int
    dataset_size: int
    batches: list[int]
    shard_starts: list[int]
    shard_sizes: list[int]
    steps_per_epoch: int
    dropped: int = 0
    meta: dict = field(default_factory=dict)
    fixed_s: list[float] | None = None           # the models' fixed cost per step (a_i)
    predicted_step_s: float | None = None        # max_i t_i(b_i): the predicted step time
    predicted_times_s: list[float] | None = None  # t_i(b_i) of every rank

    @property
    def world_size(self) -> int:
        return len(self.batches)

    def weights(self) -> list[float]:
        """Each rank's share b_i / B of the global batch."""
        return [b / self.global_batch for b in self.batches]

    def last_batches(self) -> list[int]:
        """Samples each rank holds in the final (possibly partial) step."""
        return [n - (self.steps_per_epoch - 1) * b for n, b in zip(self.shard_sizes, self.batches)]

    def thin_tail(self, drop: str = "--drop-remainder") -> str | None:
        """A warning when each epoch's last step holds under a tenth of the global batch
        (None otherwise); ``drop``: what leaves the tail out, as the user gives it."""
        samples, batch = self.dataset_size - self.dropped, self.global_batch
        if self.steps_per_epoch < 2 or not thin(batch, samples):
            return None
        tail, better = samples % batch, full_tail(batch, samples)
        return (f"the last step of every epoch holds {tail} of {batch} samples, a "
                f"mean gradient over {tail} taken at the full rate; global batch {better} "
                f"gives as many steps with a full last one (or {drop} leaves it out)")

    def to_dict(self) -> dict:
        return asdict(self)

    def save(self, path: str | Path) -> None:
        write_json(self.to_dict(), path)

    @classmethod
    def load(cls, path: str | Path, *, world_size: int | None = None, field: str = "plan") -> "Plan":
        """Read a plan saved by :meth:`save`; check it fits ``world_size`` ranks."""
        data = read_json(path, field=field, what="plan file")
        try:
            plan = cls(**typed(cls, data, "plan file"))
        except (TypeError, ValueError) as exc:
            raise InputFileError(f"cannot read plan file {path}: {exc}", field=field) from None
        if world_size is not None and plan.world_size != world_size:
            raise InputFileError(
                f"plan file {path} is for {plan.world_size} ranks but this job has {world_size}",
                field=field)
        try:
            plan.validate()
        except HetgradError as exc:
            raise InputFileError(f"plan file {path}: {exc.message}", field=field) from None
        return plan

    def validate(self) -> None:
        """Invariants every plan must keep; raises HetgradError if one is broken."""
        p = self.world_size
        if not (len(self.speeds) == len(self.shard_starts) == len(self.shard_sizes) == p):
            raise HetgradError("plan lists have different lengths")
        if sum(self.batches) != self.global_batch:
            raise HetgradError(f"plan batches sum to {sum(self.batches)}, not {self.global_batch}")
        if sum(self.shard_sizes) + self.dropped != self.dataset_size:
            raise HetgradError("plan shards do not cover the dataset")
        pos = 0
        for r in range(p):
            if self.shard_starts[r] != pos:
                raise HetgradError(f"shard of rank {r} does not start where rank {r - 1}'s ends")
            pos += self.shard_sizes[r]
        lasts = self.last_batches()
        for r, (last, b) in enumerate(zip(lasts, self.batches)):
            if not 0 <= last <= b:
                raise HetgradError(f"rank {r}'s shard does not make {self.steps_per_epoch} "
                                   f"steps of {b} samples (the last of 0..{b})")
        if sum(lasts) < 1:
            raise HetgradError("the final step of the plan has no samples")


def _caps(max_batch: Sequence[int] | int | None, p: int, min_batch: int,
          global_batch: int) -> list[int]:
    """Per-rank batch caps from one cap for all, one per rank, or none (``global_batch``)."""
    if max_batch is None:
        caps = [global_batch] * p
    elif isinstance(max_batch, int):
        caps = [max_batch] * p
    else:
        caps = [int(c) for c in max_batch]
        if len(caps) != p:
            raise ConfigError(f"{len(caps)} caps given for {p} ranks", field="max_batch")
    for r, c in enumerate(caps):
        if c < min_batch:
            raise ConfigError(f"cap {c} of rank {r} is below min batch {min_batch}",
                              field="max_batch")
    if sum(caps) < global_batch:
        raise ConfigError(f"per-rank caps sum to {sum(caps)} < global batch {global_batch}",
                          field="max_batch")
    return caps


def make_plan(speeds: Sequence[float | StepModel], global_batch: int, dataset_size: int, *,
              min_batch: int = 1, max_batch: Sequence[int] | int | None = None,
              drop_remainder: bool = False) -> Plan:
    """Give each rank a batch that equalises the predicted step time, and a shard with equal
    steps per epoch.

    ``speeds`` holds one entry per rank: a samples/s number (constant model, batches in
    proportion), a probe result (``hk.probe``) or a :class:`~hetgrad.perfmodel.StepModel`
    (e.g. the probe's affine fit, whose
    fixed cost shifts work to the ranks it costs least). ``max_batch`` is a per-rank memory
    cap (one int for all, or one per rank). The dataset is split into ``ceil(N / B)`` steps;
    the final step may be partial (the tail ``N mod B``, split by the same rule, every rank
    keeping at least one sample when there are as many; a rank with none joins the step's
    exchange with weight 0). With ``drop_remainder`` the tail is left out instead and
    reported in ``Plan.dropped``. The plan records predicted step times (seconds) only when every
    entry is a model or probe result: numbers are taken as relative speeds.
    """
    models, batches, timed = plan_batches(speeds, global_batch, dataset_size,
                                          min_batch=min_batch, max_batch=max_batch)
    return _plan_of(models, batches, int(dataset_size), timed=timed, drop=drop_remainder)


def plan_batches(speeds: Sequence[float | StepModel], global_batch: int, dataset_size: int, *,
                 min_batch: int = 1, max_batch: Sequence[int] | int | None = None
                 ) -> tuple[list[StepModel], list[int], bool]:
    """:func:`make_plan`'s per-rank batches without the shards (e.g. to predict a step time),
    with the models and whether they are of seconds; its one-line errors of bad input."""
    models, timed = _models(speeds)
    p = len(models)
    if int(global_batch) != global_batch or global_batch <= 0:
        raise ConfigError(f"global batch must be a positive integer, got {global_batch!r}",
                          field="global_batch")
    if min_batch < 1:
        raise ConfigError(f"min batch must be >= 1, got {min_batch}", field="min_batch")
    if global_batch < p * min_batch:
        raise ConfigError(
            f"global batch {global_batch} < {p} ranks x min batch {min_batch}",
            field="global_batch")
    caps = _caps(max_batch, p, min_batch, global_batch)
    if dataset_size < global_batch:
        raise ConfigError(f"dataset has {dataset_size} samples, fewer than the global batch "
                          f"{global_batch}", field="global_batch")
    batches = equal_time_or_proportional(models, int(global_batch), [min_batch] * p, caps)
    return models, batches, timed


def fixed_plan(batches: Sequence[int], dataset_size: int, drop_remainder: bool = False) -> Plan:
    """The plan with exactly these per-rank ``batches`` (e.g. a hand-made or searched split)."""
    if not batches or any(int(b) != b or b < 1 for b in batches):
        raise ConfigError(f"batches must be integers >= 1, got {list(batches)}", field="plan")
    if dataset_size < sum(batches):
        raise ConfigError(f"dataset has {dataset_size} samples, fewer than the global batch "
                          f"{sum(batches)}", field="global_batch")
    return _plan_of([constant(b) for b in batches], [int(b) for b in batches], int(dataset_size),
                    drop=drop_remainder)


def _plan_of(models: list[StepModel], batches: list[int], dataset_size: int,
             timed: bool = False, drop: bool = False) -> Plan:
    """Shards with equal steps for ``batches``; with ``timed`` (models of measured seconds, not
    relative speeds) the models' predicted step times recorded; with ``drop`` no partial
    final step."""
    p, global_batch = len(batches), sum(batches)
    steps, last, dropped = _final_step(models, batches, dataset_size, drop)
    sizes = [(steps - 1) * b + l for b, l in zip(batches, last)]
    times = [m.time(b) for m, b in zip(models, batches)]
    plan = Plan(speeds=[m.samples_per_s / m.scale for m in models], global_batch=global_batch,
                dataset_size=dataset_size, batches=batches,
                shard_starts=[sum(sizes[:r]) for r in range(p)], shard_sizes=sizes,
                steps_per_epoch=steps, dropped=dropped,
                fixed_s=[m.fixed_s * m.scale for m in models],
                predicted_step_s=max(times) if timed else None,
                predicted_times_s=times if timed else None)
    plan.validate()
    return plan


def _models(speeds: Sequence[float | StepModel]) -> tuple[list[StepModel], bool]:
    """Step models from numbers (constant speeds, checked) or models (kept), and whether all
    were models (of measured seconds, not relative speeds)."""
    if not len(speeds):
        raise ConfigError("no speeds given", field="speeds")
    out, numbers = [], 0
    for r, s in enumerate(speeds):
        if isinstance(s, StepModel):
            out.append(s)
            continue
        if hasattr(s, "model"):  # a probe result (hk.probe, hetgrad.probe)
            out.append(s.model())
            continue
        s, numbers = float(s), numbers + 1
        if not math.isfinite(s) or s <= 0:
            raise ConfigError(f"speed of rank {r} is {s!r}; speeds must be finite and > 0",
                              field="speeds")
        out.append(constant(s))
    return out, not numbers


def _final_step(models, batches: list[int], dataset_size: int,
                drop: bool) -> tuple[int, list[int], int]:
    """Steps per epoch, each rank's samples in the final (maybe partial) step -- at least one
    each where the tail has as many, else 0 for some -- and the samples dropped (the tail,
    with ``drop``)."""
    p, global_batch = len(batches), sum(batches)
    steps = math.ceil(dataset_size / global_batch)
    rest = dataset_size - (steps - 1) * global_batch  # samples for the final step, 1..B
    if drop and rest < global_batch:
        return steps - 1, list(batches), rest
    least = 1 if rest >= p else 0
    return steps, equal_time_batches(models, rest, [least] * p, batches), 0


def equal_plan(world_size: int, global_batch: int, dataset_size: int,
               drop_remainder: bool = False) -> Plan:
    """Horovod's baseline: every rank gets the same batch whatever its speed."""
    return make_plan([1.0] * world_size, global_batch, dataset_size,
                     drop_remainder=drop_remainder)
