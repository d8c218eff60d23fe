"""Per-rank performance models: seconds per step as a function of the local batch.

A step costs a fixed part (framework, kernel launches, input pipeline, exchange start) plus a
part that grows with the batch, so the model is affine, ``t(b) = a + b / s``, fitted by least
squares to the probe's points. Where the affine fit is off by more than
:data:`PIECEWISE_ABOVE` at some point, and by more than that point's own noise explains, the model
is the piecewise-linear curve through the points (FuPerMod's functional model), extended by its
end segments. A constant speed is ``a = 0``.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Sequence

PIECEWISE_ABOVE = 0.10  # largest relative error of the affine fit before going piecewise


@dataclass
class StepModel:
    """``t(b) = scale * (fixed_s + b / samples_per_s)`` (affine) or ``scale *`` the
    piecewise-linear curve through ``points`` (``kind == "piecewise"``)."""

    fixed_s: float
    samples_per_s: float
    kind: str = "affine"
    points: list[list[float]] = field(default_factory=list)   # [batch, seconds per step]
    fit_error: float = 0.0                                      # max |fit - t| / t on points
    scale: float = 1.0                                          # online correction (rebalancer)

    def time(self, b: float) -> float:
        """Predicted seconds per step at local batch ``b``."""
        if self.kind == "piecewise":
            return self.scale * _interpolate(self.points, b)
        return self.scale * (self.fixed_s + b / self.samples_per_s)

    def scaled(self, factor: float) -> "StepModel":
        """This model with its times multiplied by ``factor`` (on top of its own scale)."""
        return StepModel(**{**asdict(self), "scale": self.scale * float(factor)})

    def to_dict(self) -> dict:
        return asdict(self)


def constant(samples_per_s: float) -> StepModel:
    """The constant-speed model (no fixed cost): the old plans' special case."""
    return StepModel(fixed_s=0.0, samples_per_s=float(samples_per_s), kind="constant")


def throughput(model: StepModel) -> StepModel:
    """The constant-speed model of ``model``'s samples/s at its largest probed batch."""
    if model.kind == "constant" or not model.points:
        return model
    top = max(b for b, _ in model.points)
    return constant(top / model.time(top))


def fit(points: Sequence[Sequence[float]], noise: Sequence[float] | None = None) -> StepModel:
    """Least-squares ``t = a + b / s`` through ``points`` (``[batch, seconds]``, >= 1 point),
    with ``a >= 0``; piecewise-linear instead where the affine fit misses a point by more than
    10 % and by more than twice that point's relative standard error ``noise`` (see
    :func:`relative_noise`), so that noisy timings do not bend the model."""
    noise = list(noise) if noise is not None else [0.0] * len(points)
    if len(noise) != len(points):
        raise ValueError(f"{len(noise)} noise values for {len(points)} points")
    rows = sorted(zip(([float(b), float(t)] for b, t in points), noise))
    pts = [p for p, _ in rows]
    if not pts or any(b <= 0 or not t > 0 for b, t in pts):
        raise ValueError(f"probe points must have batch > 0 and time > 0, got {points}")
    a, c = _least_squares(pts)
    if a < 0 or c <= 0:  # through the origin instead (a = 0)
        a, c = 0.0, sum(b * t for b, t in pts) / sum(b * b for b, _ in pts)
    model = StepModel(fixed_s=a, samples_per_s=1.0 / c, points=pts)
    misses = [abs(model.time(b) - t) / t for b, t in pts]
    model.fit_error = max(misses)
    if len(pts) >= 2 and any(m > max(PIECEWISE_ABOVE, 2 * e) for m, (_, e) in zip(misses, rows)):
        model.kind = "piecewise"
    return model


def scale_through(model: StepModel, points: Sequence[Sequence[float]],
                  weights: Sequence[float] | None = None) -> float:
    """The factor ``k`` that best fits ``k * model.time(b)`` to ``points`` (``[batch,
    seconds]``) by weighted least squares: how far the model is off where it was measured."""
    weights = list(weights) if weights is not None else [1.0] * len(points)
    if not points:
        return 1.0
    num = sum(w * t * model.time(b) for w, (b, t) in zip(weights, points))
    return num / sum(w * model.time(b) ** 2 for w, (b, _) in zip(weights, points))


def relative_noise(times: Sequence[float]) -> float:
    """Relative standard error of the median of ``times`` (from their interquartile range)."""
    n = len(times)
    if n < 4:
        return 0.0
    q = sorted(times)
    iqr = q[(3 * n) // 4] - q[n // 4]
    median = q[n // 2] if n % 2 else 0.5 * (q[n // 2 - 1] + q[n // 2])
    return 1.2533 * (iqr / 1.349) / (median * math.sqrt(n))


def _least_squares(pts: list[list[float]]) -> tuple[float, float]:
    """Intercept and slope of the least-squares line (slope only with one distinct batch)."""
    n = len(pts)
    mb = sum(b for b, _ in pts) / n
    mt = sum(t for _, t in pts) / n
    sbb = sum((b - mb) ** 2 for b, _ in pts)
    if sbb == 0:
        return 0.0, mt / mb
    c = sum((b - mb) * (t - mt) for b, t in pts) / sbb
    return mt - c * mb, c


def _monotone(pts: list[list[float]]) -> list[tuple[float, float]]:
    """The points with each time raised to the largest before it (a non-decreasing curve)."""
    mono, top = [], 0.0
    for pb, pt in pts:
        top = max(top, pt)
        mono.append((pb, top))
    return mono


def _segment(mono: list[tuple[float, float]], b: float) -> int:
    """The end point's index of the segment that holds ``b`` (the end ones extended)."""
    i = 1
    while i < len(mono) - 1 and b > mono[i][0]:
        i += 1
    return i


def _interpolate(pts: list[list[float]], b: float) -> float:
    """The piecewise-linear curve through ``pts``, made non-decreasing, extended linearly."""
    mono = _monotone(pts)
    if len(mono) == 1:
        return mono[0][1] * b / mono[0][0]
    (b0, t0), (b1, t1) = mono[(i := _segment(mono, b)) - 1], mono[i]
    slope = (t1 - t0) / (b1 - b0) if b1 > b0 else 0.0
    return max(t0 + slope * (b - b0), 1e-12)


def _largest_within(pts: list[list[float]], t: float) -> float:
    """The largest batch at which :func:`_interpolate` is at most ``t`` (inf: it never
    exceeds it); the curve is non-decreasing, so every batch below it is within too."""
    mono = _monotone(pts)
    if len(mono) == 1:
        return t * mono[0][0] / mono[0][1]
    for i in range(len(mono) - 1, 0, -1):   # the last segment whose start is within t
        (b0, t0), (b1, t1) = mono[i - 1], mono[i]
        flat = t1 <= t0 or b1 <= b0
        if t0 > t and (i > 1 or flat):   # (the first one also goes on to the left)
            continue
        end = math.inf if i == len(mono) - 1 else b1
        if flat:   # within all along
            return end
        return min(b0 + (t - t0) * (b1 - b0) / (t1 - t0), end)
    return 0.0


def probe_batches(top: int, global_batch: int, world_size: int, count: int = 3) -> list[int]:
    """``count`` geometric batch sizes covering the local batches a plan may give:
    from ``B / (4 P)`` up to ``top`` (the largest a rank may get or hold)."""
    hi = max(1, int(top))
    lo = max(1, min(hi, global_batch // (4 * world_size)))
    if count == 1 or lo == hi:
        return [hi]
    ratio = (hi / lo) ** (1.0 / (count - 1))
    return sorted({min(hi, max(1, round(lo * ratio ** k))) for k in range(count)})


def equal_time_batches(models: Sequence[StepModel], total: int, lo: Sequence[int],
                       hi: Sequence[int]) -> list[int]:
    """Integer batches summing to ``total`` within ``[lo, hi]`` that minimise the slowest
    predicted step ``max_i t_i(b_i)``: start at the water level found by bisection on the
    common time T, then hand out the rest one sample at a time to the rank that stays fastest."""
    if sum(lo) > total or sum(hi) < total:
        raise ValueError(f"bounds {list(lo)}..{list(hi)} cannot hold {total}")
    level = _water_level(models, total, lo, hi)
    out = [min(max(lo[i], math.floor(_batch_at(m, level))), hi[i])
           for i, m in enumerate(models)]
    while sum(out) > total:  # cannot happen for increasing t; kept as a guard
        i = max((j for j in range(len(out)) if out[j] > lo[j]), key=lambda j: models[j].time(out[j]))
        out[i] -= 1
    while sum(out) < total:
        i = min((j for j in range(len(out)) if out[j] < hi[j]),
                key=lambda j: (models[j].time(out[j] + 1), j))
        out[i] += 1
    return out


MIN_GAIN = 0.03  # smallest predicted step-time gain worth a split away from the throughputs


def equal_time_or_proportional(models, total: int, lo: list[int], hi: list[int]) -> list[int]:
    """The equal-time split, unless it is predicted less than :data:`MIN_GAIN` faster than
    the split in proportion to each rank's measured throughput at its largest probed batch:
    where step times hardly grow with the batch, noise in the fitted slopes and fixed costs
    would otherwise push whole batches onto one rank for no real gain."""
    batches = equal_time_batches(models, total, lo, hi)
    plain = equal_time_batches([throughput(m) for m in models], total, lo, hi)
    slowest = max(m.time(b) for m, b in zip(models, batches))
    if max(m.time(b) for m, b in zip(models, plain)) <= (1 + MIN_GAIN) * slowest:
        return plain
    return batches


def _batch_at(model: StepModel, level: float) -> float:
    """The largest batch (0 to :data:`BATCH_CEILING`) whose predicted time is at most
    ``level``, by inverting the model (its time does not decrease with the batch)."""
    t = level / model.scale
    if model.kind == "piecewise":
        b = _largest_within(model.points, t)
    else:
        b = (t - model.fixed_s) * model.samples_per_s
    return min(max(b, 0.0), BATCH_CEILING)


BATCH_CEILING = 1e9   # no rank's batch is larger: where a model never reaches a level


def _water_level(models, total, lo, hi, close: float = 1e-4) -> float:
    """The common step time T at which the clamped batches ``b_i(T)`` sum to ``total``
    (bisection, until the batches at both ends sum to within ``close`` of each other)."""
    def batches_at(level: float) -> float:
        return sum(min(max(l, _batch_at(m, level)), h) for m, l, h in zip(models, lo, hi))
    low, high = 0.0, max(m.time(h) for m, h in zip(models, hi))
    at_low, at_high = batches_at(low), batches_at(high)
    for _ in range(80):
        if at_high - at_low < close:
            break
        mid = (low + high) / 2
        got = batches_at(mid)
        low, high, at_low, at_high = ((mid, high, got, at_high) if got < total
                                      else (low, mid, at_low, got))
    return low
