"""Goodput: the global batch that makes the most progress per second (Pollux, OSDI'21).

A step of global batch ``B`` takes ``t(B) = max_i t_i(b_i) + exchange`` (the plan's equal-time
split of ``B`` over the ranks' step models) and carries ``B`` samples; with the gradient noise
scale ``B_noise`` (:mod:`hetgrad.gns`) each sample is worth

    E(B) = (B_noise + B_0) / (B_noise + B)

of one at the starting batch ``B_0`` (McCandlish et al.: steps needed fall as
``1 + B_noise / B``), so the progress per second is ``goodput(B) = B / t(B) * E(B)``. Between
epochs :class:`BatchChooser` picks the candidate ``B`` in the user's range with the largest
goodput, moving only when it beats the current one by the hysteresis (also at the cautious
end of the noise scale's interval), at most by a factor 4, and never to a batch whose
samples are worth less than half one at ``B_0`` (``E(B) >= 0.5``); the learning rate
follows by AdaScale's gain ``r = (B / B_0) E(B)`` -- the progress of one step at ``B`` in
steps at ``B_0`` -- linearly for SGD; for Adam by ``sqrt(B / B_0)``, or by another rule of
:data:`LR_RULES` (:func:`lr_factor`).
No TensorFlow here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from .errors import ConfigError


def efficiency(batch: float, b_noise: float, b0: float) -> float:
    """Progress of a sample at global batch ``batch`` relative to one at ``b0`` (<= 1 above
    ``b0``; 1 at an unbounded noise scale)."""
    return 1.0 if math.isinf(b_noise) else (b_noise + b0) / (b_noise + batch)


def gain(batch: float, b_noise: float, b0: float) -> float:
    """AdaScale's gain: one step at ``batch`` is worth this many steps at ``b0``."""
    return batch / b0 * efficiency(batch, b_noise, b0)


LR_RULES = ("gain", "sqrt-gain", "sqrt-batch", "none")


def default_lr_rule(sgd: bool) -> str:
    """AdaScale's gain for SGD; for other optimizers (Adam's step is normalised by the
    gradient's own scale) the square-root rule, which reached the target sooner than the
    gain's square root under fixed CPU shares in all four goodput runs that compared them
    (docs/results.md)."""
    return "gain" if sgd else "sqrt-batch"


def lr_factor(batch: float, b_noise: float, b0: float, rule: str) -> float:
    """What the learning rate set for ``b0`` is multiplied by at ``batch`` under ``rule``
    (:data:`LR_RULES`): the gain, its square root, the square-root rule ``sqrt(B / B_0)``
    (which ignores the noise scale), or 1."""
    if rule == "sqrt-batch":
        return math.sqrt(batch / b0)
    if rule == "none":
        return 1.0
    r = gain(batch, b_noise, b0)
    return r if rule == "gain" else math.sqrt(r)


def candidates(lo: int, hi: int, current: int, per_octave: int = 4) -> list[int]:
    """Global batches to weigh: ``lo``, ``hi``, a geometric grid between them (``per_octave``
    points per doubling) and ``current``."""
    steps = max(1, round(per_octave * math.log2(hi / lo))) if hi > lo else 0
    grid = {round(lo * (hi / lo) ** (k / steps)) for k in range(steps + 1)} if steps else {lo}
    return sorted(grid | {hi, current})


def full_tail(batch: int, samples: int, lo: int = 1) -> int:
    """The smallest global batch (not below ``lo``) that splits ``samples`` into as many
    steps as ``batch`` does: its last step nearly full. (20,000 samples at 476 leave a last
    step of 8 -- a mean gradient over 8 samples taken at the full rate, which Adam scales to
    a full-size step: every test-accuracy drop of the goodput runs came after such an epoch;
    at 466 the last step holds 428.)"""
    steps = math.ceil(samples / batch)
    return max(lo, min(batch, math.ceil(samples / steps)))


def thin(batch: int, samples: int) -> bool:
    """Whether ``samples`` in steps of ``batch`` leave a last step under a tenth of it."""
    return 0 < samples % batch < batch / 10


def aligned(samples: int, grid: list[int], tolerance: float = 0.05) -> list[int]:
    """Each batch of ``grid`` moved to the nearest within ``tolerance`` (and the grid's
    bounds) that divides ``samples`` (left out if none does): the batches an epoch can go on
    with after ``samples`` of its global order, its steps then starting where it stands."""
    out, lo, hi = set(), min(grid), max(grid)
    for c in grid:
        near = [b for b in range(max(lo, math.ceil(c * (1 - tolerance))),
                                 min(hi, math.floor(c * (1 + tolerance))) + 1)
                if samples % b == 0]
        if near:
            out.add(min(near, key=lambda b: (abs(b - c), b)))
    return sorted(out)


def split_step(steps: int, b0: int, grid: list[int], fraction: float = 0.1,
               min_steps: int = 20) -> int:
    """The step of a first epoch of ``steps`` steps at ``b0`` after which to choose the batch
    the first time (0: too short an epoch): after ``fraction`` of it (at least ``min_steps``
    measured), at the step up to twice as late where the most of ``grid`` is
    :func:`aligned`."""
    k0 = max(min_steps, math.ceil(fraction * steps))
    if 4 * k0 > steps:
        return 0
    best = max(range(k0, 2 * k0 + 1), key=lambda k: (len(aligned(k * b0, grid)), -k))
    return best if len(aligned(best * b0, grid)) > 1 else 0


def check_range(batch_range, global_batch: int, field: str = "batch_range") -> tuple[int, int]:
    """``(lo, hi)`` of a range holding the starting batch, or a one-line error."""
    try:
        lo, hi = (int(v) for v in batch_range)
    except (TypeError, ValueError):
        raise ConfigError(f"give the range as two batch sizes LO,HI, got {batch_range!r}",
                          field=field) from None
    if not 1 <= lo <= hi:
        raise ConfigError(f"needs 1 <= LO <= HI, got {lo},{hi}", field=field)
    if not lo <= global_batch <= hi:
        raise ConfigError(f"the global batch {global_batch} is outside {lo},{hi}", field=field)
    return lo, hi


@dataclass
class BatchChoice:
    """One epoch boundary's decision (into the record's row)."""

    batch: int                  # the global batch of the next epoch
    b_noise: float
    efficiency: float           # E(batch)
    goodput: float              # predicted, in B_0-samples per second
    current_goodput: float      # the batch in effect's
    changed: bool


class BatchChooser:
    """The global batch in ``[lo, hi]`` with the largest predicted goodput; a move needs a
    gain above ``hysteresis`` (noisy estimates must not make the batch wander) and goes at
    most a factor ``reach`` from the current batch (the models are the probe's, which timed
    the range's batches, corrected at the current batch: the further from it, the less
    sure; the next epoch measures the step time where it moved). Only batches whose
    samples are worth at least ``min_efficiency`` of one at ``B_0`` are taken: a run of a
    fixed number of epochs must not trade its final accuracy for speed (at 0.5, a batch may
    need up to twice the samples of ``B_0`` for the same progress)."""

    def __init__(self, lo: int, hi: int, b0: int, hysteresis: float = 0.05,
                 reach: float = 4.0, min_efficiency: float = 0.5):
        self.lo, self.hi, self.b0 = lo, hi, b0
        self.hysteresis, self.reach, self.min_efficiency = hysteresis, reach, min_efficiency

    def choose(self, current: int, b_noise: float, step_s: Callable[[int], float | None],
               interval: tuple[float, float] | None = None,
               grid: list[int] | None = None) -> BatchChoice:
        """``step_s(B)``: predicted seconds per step at global batch ``B`` (None: not a
        batch this world can run, e.g. above the ranks' caps). ``interval``: how far
        ``B_noise`` may be off (:meth:`hetgrad.gns.NoiseScale.interval`); the batch moves to
        the best of those that also pay at its cautious end -- a larger batch at the low
        one, a smaller at the high one -- so an uncertain estimate holds the batch, or moves
        it less far, rather than back and forth. ``grid``: the batches to weigh (default
        :func:`candidates`; the current one is always among them)."""
        weighed = sorted({*grid, current}) if grid else candidates(self.lo, self.hi, current)
        times = {b: t for b in weighed
                 if current / self.reach <= b <= current * self.reach
                 and (t := step_s(b)) is not None and t > 0}
        low, high = interval or (b_noise, b_noise)
        if not self._worth(current, b_noise):   # leave at once, unless the high end says stay
            batch = self._best(current, b_noise, times)
            batch = current if self._worth(current, high) else batch
        else:
            def pays(b: int) -> bool:
                return (self._pays(b, current, b_noise, times)
                        and self._pays(b, current, high if b < current else low, times))
            batch = max((b for b in times if pays(b)),
                        key=lambda b: _goodput(b, b_noise, self.b0, times), default=current)
        moved = batch != current
        now = _goodput(current, b_noise, self.b0, times)
        return BatchChoice(batch=batch, b_noise=b_noise,
                           efficiency=efficiency(batch, b_noise, self.b0),
                           goodput=_goodput(batch, b_noise, self.b0, times) or now,
                           current_goodput=now, changed=moved)

    def _worth(self, batch: int, b_noise: float) -> bool:
        return efficiency(batch, b_noise, self.b0) >= self.min_efficiency

    def _best(self, current: int, b_noise: float, times: dict) -> int:
        """The batch of the largest goodput among those worth it; if none is, the most
        efficient batch this world can run, never a larger one than ``current``."""
        allowed = [b for b in times if self._worth(b, b_noise)]
        if allowed:
            return max(allowed, key=lambda b: _goodput(b, b_noise, self.b0, times))
        return min((b for b in times if b <= current), default=current)

    def _pays(self, batch: int, current: int, b_noise: float, times: dict) -> bool:
        """Whether ``batch`` is worth its samples at ``b_noise`` and beats ``current`` by
        the hysteresis there."""
        return batch != current and self._worth(batch, b_noise) and _goodput(
            batch, b_noise, self.b0, times) > (_goodput(current, b_noise, self.b0, times)
                                               * (1 + self.hysteresis))


def _goodput(batch: int, b_noise: float, b0: float, times: dict) -> float:
    """Predicted progress per second at ``batch`` (0 where no step time is known)."""
    return batch / times[batch] * efficiency(batch, b_noise, b0) if batch in times else 0.0
