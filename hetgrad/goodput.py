"""Goodput: the global batch that makes the most progress per second (Pollux, OSDI'21).

A step of global batch ``B`` takes ``t(B) = max_i t_i(b_i) + exchange`` (the plan's equal-time
split of ``B`` over the ranks' step models) and carries ``B`` samples; with the gradient noise
scale ``B_noise`` (:mod:`hetgrad.gns`) each sample is worth

    E(B) = (B_noise + B_0) / (B_noise + B)

of one at the starting batch ``B_0`` (McCandlish et al.: steps needed fall as
``1 + B_noise / B``), so the progress per second is ``goodput(B) = B / t(B) * E(B)``. Between
epochs :class:`BatchChooser` picks the candidate ``B`` in the user's range with the largest
goodput, moving only when it beats the current one by the hysteresis, and at most by a
factor 2, and never to a batch whose samples are worth less than half one at ``B_0``
(``E(B) >= 0.5``); the learning rate
follows by AdaScale's gain ``r = (B / B_0) E(B)`` -- the progress of one step at ``B`` in
steps at ``B_0`` -- linearly for SGD, by its square root for Adam, or by another rule of
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
    ``b0``)."""
    return (b_noise + b0) / (b_noise + batch)


def gain(batch: float, b_noise: float, b0: float) -> float:
    """AdaScale's gain: one step at ``batch`` is worth this many steps at ``b0``."""
    return batch / b0 * efficiency(batch, b_noise, b0)


LR_RULES = ("gain", "sqrt-gain", "sqrt-batch", "none")


def default_lr_rule(sgd: bool) -> str:
    """AdaScale's gain for SGD, its square root for other optimizers (Adam's step is
    normalised by the gradient's own scale)."""
    return "gain" if sgd else "sqrt-gain"


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
    most a factor ``reach`` from the current batch (the next epoch measures the step time
    there before a further move trusts the models' extrapolation). Only batches whose
    samples are worth at least ``min_efficiency`` of one at ``B_0`` are taken: a run of a
    fixed number of epochs must not trade its final accuracy for speed (at 0.5, a batch may
    need up to twice the samples of ``B_0`` for the same progress)."""

    def __init__(self, lo: int, hi: int, b0: int, hysteresis: float = 0.05,
                 reach: float = 2.0, min_efficiency: float = 0.5):
        self.lo, self.hi, self.b0 = lo, hi, b0
        self.hysteresis, self.reach, self.min_efficiency = hysteresis, reach, min_efficiency

    def choose(self, current: int, b_noise: float,
               step_s: Callable[[int], float | None]) -> BatchChoice:
        """``step_s(B)``: predicted seconds per step at global batch ``B`` (None: not a
        batch this world can run, e.g. above the ranks' caps)."""
        def scored(b: int):
            t = step_s(b)
            return None if t is None or t <= 0 else b / t * efficiency(b, b_noise, self.b0)

        near = [b for b in candidates(self.lo, self.hi, current)
                if current / self.reach <= b <= current * self.reach]
        scores = {b: g for b in near if (g := scored(b)) is not None}
        now = scores.get(current, 0.0)     # the current batch is always a candidate
        worth = lambda b: efficiency(b, b_noise, self.b0) >= self.min_efficiency  # noqa: E731
        allowed = {b: g for b, g in scores.items() if worth(b)}
        # none worth it: the most efficient batch this world can run, never a larger one
        best = max(allowed, key=allowed.get,
                   default=min((b for b in scores if b <= current), default=current))
        moved = best != current and (not worth(current) or (
            best in allowed and allowed[best] > now * (1 + self.hysteresis)))
        batch = best if moved else current
        return BatchChoice(batch=batch, b_noise=b_noise,
                           efficiency=efficiency(batch, b_noise, self.b0),
                           goodput=scores.get(batch, now), current_goodput=now, changed=moved)
