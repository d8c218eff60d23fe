"""The gradient noise scale from uneven local batches (the statistical half of goodput).

Rank ``i`` holds the mean gradient ``g_i`` of its ``b_i`` samples; the exchange gives
``g = sum_i (b_i / B) g_i``, the mean over all ``B``. With ``G`` the true gradient and ``S``
the trace of one sample's gradient covariance, ``E|g_i|^2 = |G|^2 + S / b_i`` and
``E|g|^2 = |G|^2 + S / B``, so over the ``P`` ranks that hold samples

    sum_i b_i E|g_i|^2 - B E|g|^2 = (P - 1) S,

which gives unbiased estimates from one step:

    S_hat = (sum_i b_i n_i - B n) / (P - 1),    |G|^2_hat = n - S_hat / B,

``n_i = |g_i|^2``, ``n = |g|^2``. With equal batches it is AdaptDL's (Pollux) estimator. One
step's estimates are noisy; :class:`NoiseScale` smooths each with a bias-corrected moving
average and gives ``B_noise = S / |G|^2`` (McCandlish et al. 2018: the batch where the
gradient's noise and signal are equal). No TensorFlow here.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

import numpy as np


def estimate(batches: Sequence[float], local_sq_norms: Sequence[float],
             global_sq_norm: float) -> tuple[float, float] | None:
    """``(S_hat, |G|^2_hat)`` of one step from every rank's batch ``b_i``, its ``|g_i|^2`` and
    the exchanged ``|g|^2``; None when fewer than two ranks held samples (no spread to see)."""
    held = [(b, n) for b, n in zip(batches, local_sq_norms) if b > 0]
    if len(held) < 2:
        return None
    return from_sums(sum(b * n for b, n in held), sum(b for b, _ in held), len(held),
                     global_sq_norm)


Number = float | np.ndarray


def from_sums(sum_bn: Number, total: Number, held: Number, n: Number) -> tuple[Number, Number]:
    """``S_hat`` and ``|G|^2_hat`` from the sums over the ranks of ``b_i n_i``, ``b_i`` and of
    the ranks that held samples (two or more), and ``n = |g|^2``: of one step, or of many
    (arrays, one entry per step)."""
    s = (sum_bn - total * n) / (held - 1)
    return s, n - s / total


@dataclass
class EpochNoise:
    """An epoch's mean ``S`` and ``|G|^2`` over its ``steps`` measured steps, and the
    variances (and covariance) of those means from the steps' spread."""

    s: float
    g2: float
    steps: int
    var_s: float = 0.0
    var_g2: float = 0.0
    cov: float = 0.0

    @classmethod
    def from_sums(cls, s: float, g2: float, steps: float, ss: float = 0.0, gg: float = 0.0,
                  sg: float = 0.0) -> "EpochNoise":
        """From the sums over the steps of ``S``, ``|G|^2``, 1, ``S^2``, ``|G|^4``,
        ``S |G|^2``."""
        n = max(steps, 1.0)
        ms, mg = s / n, g2 / n
        spread = max(steps - 1.0, 1.0) * n   # sample (co)variance over n, of the mean
        return cls(ms, mg, int(steps), max(ss - n * ms * ms, 0.0) / spread,
                   max(gg - n * mg * mg, 0.0) / spread, (sg - n * ms * mg) / spread)

    @classmethod
    def from_buckets(cls, table: Sequence[Sequence[float]], least: int = 4) -> "EpochNoise":
        """From the six sums of :meth:`from_sums` kept per bucket of interleaved steps (the
        epoch's ``k``-th measured step in bucket ``k mod len(table)``): the plain means,
        unbiased -- unless their ``|G|^2`` is not above 0 (a few steps of one rank's norm far
        above the rest: ``S`` far up, ``|G|^2`` far down; ~7 % of the goodput runs' epochs,
        which held the smoothed noise scale at nothing for 2-4 epochs after) and every
        bucket holds ``least`` steps: then the medians of the buckets' means, their
        (co)variances ``pi/2`` those of the plain means (a median of means: those steps move
        one bucket). Not always the medians: with the skewed per-step estimates of 2 ranks
        they came out several times too low late in training (the ninth goodput run)."""
        whole = cls.from_sums(*(sum(col) for col in zip(*table)))
        if whole.g2 > 0 or len(table) < 3 or min(row[2] for row in table) < least:
            return whole
        s, g2 = (statistics.median(row[k] / row[2] for row in table) for k in (0, 1))
        wider = math.pi / 2
        return cls(s, g2, whole.steps, wider * whole.var_s, wider * whole.var_g2,
                   wider * whole.cov)

    @classmethod
    def from_rows(cls, rows: np.ndarray, buckets: int) -> "EpochNoise":
        """From an epoch's measured steps, one row each: the sums over the ranks of ``b_i
        n_i``, ``b_i``, of the ranks that held samples, and ``n``. A step held by fewer than
        two ranks counts for nothing (its ``n`` may be NaN); the counted ones go round
        ``buckets`` buckets of interleaved steps in turn (:meth:`from_buckets`)."""
        rows = np.asarray(rows, np.float64).reshape(-1, 4)
        rows = rows[rows[:, 2] >= 2]
        s, g2 = from_sums(*rows.T)
        step = np.stack([s, g2, np.ones_like(s), s * s, g2 * g2, s * g2], 1)
        table = np.zeros((buckets, 6))
        np.add.at(table, np.arange(len(step)) % buckets, step)
        return cls.from_buckets(table.tolist())


@dataclass
class NoiseScale:
    """Bias-corrected exponential moving averages of ``S`` and ``|G|^2`` (weight ``decay``
    on the past, as Adam's moments), ``B_noise`` from them, and how uncertain it is."""

    decay: float = 0.95
    s: float = 0.0
    g2: float = 0.0
    steps: float = 0
    var_s: float = 0.0      # variances and covariance of the (uncorrected) averages
    var_g2: float = 0.0
    cov: float = 0.0

    def add(self, s: float, g2: float, weight: float = 1,
            spread: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> None:
        """One more estimate; ``weight``: as many steps as it stands for (an epoch's mean of
        ``weight`` steps moves the averages as far as those steps one by one would);
        ``spread``: its variances and covariance (:class:`EpochNoise`), to propagate."""
        keep = self.decay ** weight
        self.s = keep * self.s + (1 - keep) * s
        self.g2 = keep * self.g2 + (1 - keep) * g2
        past = (self.var_s, self.var_g2, self.cov)
        self.var_s, self.var_g2, self.cov = (keep ** 2 * mine + (1 - keep) ** 2 * new
                                             for mine, new in zip(past, spread))
        self.steps += weight

    def interval(self, z: float = 1.0) -> tuple[float, float] | None:
        """``B_noise`` ``z`` standard errors down and up (the delta method on ``log(S /
        |G|^2)``, the epochs' estimates taken as independent); the upper end ``inf`` while
        ``|G|^2`` is within ``z`` of them of 0. Without a ``B_noise`` (``|G|^2`` not above
        0: noise outweighed it) still a lower end, ``S`` over ``|G|^2`` ``z`` of them up, if
        that is above 0 -- an estimate at most ``z`` below the truth says the noise scale is
        at least that. None if nothing is known (also where ``S`` is not above 0)."""
        b, sd_g2 = self.b_noise, math.sqrt(self.var_g2)
        if b is not None and b <= 0:   # S not above 0: no noise seen
            return None
        if b is None:
            top = self.g2 + z * sd_g2
            return (self.s / top, math.inf) if self.steps and self.s > 0 and top > 0 else None
        rel2 = (self.var_s / self.s ** 2 + self.var_g2 / self.g2 ** 2
                - 2 * self.cov / (self.s * self.g2)) if self.s > 0 else math.inf
        rel = math.sqrt(max(rel2, 0.0))
        high = math.inf if self.g2 <= z * sd_g2 else b * math.exp(z * rel)
        return b * math.exp(-z * rel), high

    def _corrected(self, value: float) -> float:
        return value / (1 - self.decay ** self.steps)

    @property
    def noise(self) -> float | None:
        """Smoothed ``S`` (None before the first step)."""
        return self._corrected(self.s) if self.steps else None

    @property
    def signal(self) -> float | None:
        """Smoothed ``|G|^2`` (None before the first step)."""
        return self._corrected(self.g2) if self.steps else None

    @property
    def b_noise(self) -> float | None:
        """``S / |G|^2``, None while ``|G|^2`` is not yet above 0 (early noise can make its
        estimate negative)."""
        if not self.steps or self.g2 <= 0:
            return None
        return self.s / self.g2     # the bias corrections cancel
