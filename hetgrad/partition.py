"""Partitioner: speeds -> local batch sizes and data shards with identical steps per epoch.

The plan is a pure function of its inputs, so every rank computes (or loads) the same one.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from .errors import ConfigError, HetgradError, InputFileError
from .io import read_json, write_json


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

    @property
    def world_size(self) -> int:
        return len(self.batches)

    def weights(self) -> list[float]:
        """Each rank's share b_i / B of the global batch."""
        return [b / self.global_batch for b in self.batches]

    def last_batches(self) -> list[int]:
        """Samples each rank holds in the final (possibly partial) step."""
        return [n - (self.steps_per_epoch - 1) * b for n, b in zip(self.shard_sizes, self.batches)]

    def to_dict(self) -> dict:
        return asdict(self)

    def save(self, path: str | Path) -> None:
        write_json(self.to_dict(), path)

    @classmethod
    def load(cls, path: str | Path, *, world_size: int | None = None, field: str = "plan") -> "Plan":
        """Read a plan saved by :meth:`save`; check it fits ``world_size`` ranks."""
        data = read_json(path, field=field, what="plan file")
        try:
            plan = cls(**data)
        except TypeError as exc:
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
            steps = math.ceil(self.shard_sizes[r] / self.batches[r])
            if steps != self.steps_per_epoch:
                raise HetgradError(
                    f"rank {r} would run {steps} steps, not {self.steps_per_epoch}")


def _check_speeds(speeds: Sequence[float]) -> list[float]:
    out = []
    for r, s in enumerate(speeds):
        s = float(s)
        if not math.isfinite(s) or s <= 0:
            raise ConfigError(f"speed of rank {r} is {s!r}; speeds must be finite and > 0",
                              field="speeds")
        out.append(s)
    if not out:
        raise ConfigError("no speeds given", field="speeds")
    return out


def _bounded_shares(total: float, weights: Sequence[float], lo: Sequence[float],
                    hi: Sequence[float]) -> list[float]:
    """Split ``total`` proportionally to ``weights`` with each share clamped to [lo, hi].

    Water-filling: ranks that hit a bound are fixed there, the rest share what is left.
    """
    n = len(weights)
    share = [0.0] * n
    free = set(range(n))
    left = float(total)
    while free:
        wsum = sum(weights[i] for i in free)
        trial = {i: left * weights[i] / wsum for i in free}
        over = {i for i in free if trial[i] > hi[i]}
        under = {i for i in free if trial[i] < lo[i]}
        fixed = over or under  # fix one side at a time so the others can absorb it
        if not fixed:
            for i in free:
                share[i] = trial[i]
            break
        for i in fixed:
            share[i] = hi[i] if i in over else lo[i]
            left -= share[i]
        free -= fixed
    return share


def _round_preserving_sum(shares: Sequence[float], total: int, lo: Sequence[int],
                          hi: Sequence[int]) -> list[int]:
    """Largest-remainder rounding of ``shares`` to integers summing to ``total`` within bounds."""
    ints = [min(max(math.floor(s), lo[i]), hi[i]) for i, s in enumerate(shares)]
    order = sorted(range(len(shares)), key=lambda i: (-(shares[i] - math.floor(shares[i])), i))
    diff = total - sum(ints)
    while diff != 0:
        moved = False
        for i in order if diff > 0 else reversed(order):
            if diff > 0 and ints[i] < hi[i]:
                ints[i] += 1
                diff -= 1
                moved = True
            elif diff < 0 and ints[i] > lo[i]:
                ints[i] -= 1
                diff += 1
                moved = True
            if diff == 0:
                break
        if not moved:
            raise HetgradError("cannot round batch sizes within the per-rank bounds")
    return ints


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


def make_plan(speeds: Sequence[float], global_batch: int, dataset_size: int, *,
              min_batch: int = 1, max_batch: Sequence[int] | int | None = None) -> Plan:
    """Give each rank a batch proportional to its speed and a shard with equal steps per epoch.

    ``max_batch`` is a per-rank memory cap (one int for all, or one per rank); what a rank cannot
    hold goes to the others in proportion to their speed. The dataset is split into
    ``ceil(N / B)`` steps; the final step may be partial, with each rank keeping at least one
    sample in it. Samples that cannot be placed that way (fewer than one per rank) are
    reported in ``Plan.dropped``, never dropped silently.
    """
    speeds = _check_speeds(speeds)
    p = len(speeds)
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

    shares = _bounded_shares(global_batch, speeds, [min_batch] * p, caps)
    batches = _round_preserving_sum(shares, global_batch, [min_batch] * p, caps)

    steps = math.ceil(dataset_size / global_batch)
    rest = dataset_size - (steps - 1) * global_batch  # samples for the final step, 1..B
    dropped = 0
    if rest < p:  # cannot give every rank a sample in a final step: drop it, say so
        steps -= 1
        dropped, rest = rest, 0
    if rest:
        last = _round_preserving_sum(_bounded_shares(rest, batches, [1] * p, batches), rest,
                                     [1] * p, batches)
    else:
        last = list(batches)
    sizes = [(steps - 1) * b + l for b, l in zip(batches, last)]
    starts = [sum(sizes[:r]) for r in range(p)]
    plan = Plan(speeds=speeds, global_batch=int(global_batch), dataset_size=int(dataset_size),
                batches=batches, shard_starts=starts, shard_sizes=sizes,
                steps_per_epoch=steps, dropped=dropped)
    plan.validate()
    return plan


def equal_plan(world_size: int, global_batch: int, dataset_size: int) -> Plan:
    """Horovod's baseline: every rank gets the same batch whatever its speed."""
    return make_plan([1.0] * world_size, global_batch, dataset_size)
