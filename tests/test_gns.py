"""The gradient noise scale from uneven batches (hetgrad/gns.py) on a problem whose noise is
known: least squares with Gaussian inputs and label noise, where one sample's gradient at
``w`` has mean ``delta = w - w*`` and covariance trace ``S = (d + 1)|delta|^2 + d sigma^2``."""
import numpy as np
import pytest

from hetgrad.gns import NoiseScale, estimate

D, SIGMA = 10, 1.0
DELTA = np.full(D, np.sqrt(0.25 / D))           # |G|^2 = 0.25
TRUE_S = (D + 1) * 0.25 + D * SIGMA ** 2          # 12.75
TRUE_B_NOISE = TRUE_S / 0.25                      # 51


def local_gradient(rng, b: int) -> np.ndarray:
    """The mean gradient of ``b`` fresh samples at ``w* + DELTA``."""
    x = rng.standard_normal((b, D))
    residual = x @ DELTA - SIGMA * rng.standard_normal(b)
    return (x * residual[:, None]).mean(axis=0)


def run(batches: list[int], steps: int = 3000, seed: int = 0) -> dict:
    """Every step: each rank's mean gradient, the weighted exchange, the estimate."""
    rng, total = np.random.default_rng(seed), sum(batches)
    s_hat, g2_hat, smooth = [], [], NoiseScale(decay=0.999)
    for _ in range(steps):
        local = [local_gradient(rng, b) if b else np.zeros(D) for b in batches]
        g = sum(b / total * gi for b, gi in zip(batches, local))
        s, g2 = estimate(batches, [float(gi @ gi) for gi in local], float(g @ g))
        s_hat.append(s)
        g2_hat.append(g2)
        smooth.add(s, g2)
    return {"S": np.mean(s_hat), "G2": np.mean(g2_hat), "smoothed": smooth.b_noise}


@pytest.mark.parametrize("batches", [[24, 24, 24, 24], [4, 12, 24, 56], [0, 30, 66]],
                         ids=["equal", "uneven", "idle-rank"])
def test_noise_and_signal_are_unbiased_whatever_the_split(batches):
    got = run(batches)
    assert got["S"] == pytest.approx(TRUE_S, rel=0.05)
    assert got["G2"] == pytest.approx(0.25, rel=0.2)
    assert got["S"] / got["G2"] == pytest.approx(TRUE_B_NOISE, rel=0.2)
    assert got["smoothed"] == pytest.approx(TRUE_B_NOISE, rel=0.2)


def test_equal_and_uneven_splits_agree():
    equal, uneven = run([24, 24, 24, 24], seed=1), run([2, 6, 16, 72], seed=2)
    assert uneven["smoothed"] == pytest.approx(equal["smoothed"], rel=0.2)


def test_equal_batches_give_the_two_batch_size_estimator():
    """With b on each of P ranks it is McCandlish et al.'s estimator from the small batch b
    and the big batch B = P b (AdaptDL's)."""
    rng = np.random.default_rng(3)
    b, p = 8, 4
    local = [rng.standard_normal(D) for _ in range(p)]
    g = sum(local) / p
    small, big = np.mean([gi @ gi for gi in local]), g @ g
    s, g2 = estimate([b] * p, [gi @ gi for gi in local], g @ g)
    assert g2 == pytest.approx((p * b * big - b * small) / (p * b - b))
    assert s == pytest.approx((small - big) / (1 / b - 1 / (p * b)))


def test_one_rank_with_samples_estimates_nothing():
    assert estimate([0, 96], [0.0, 1.0], 1.0) is None


def test_smoothing_is_bias_corrected_and_waits_for_a_positive_signal():
    smooth = NoiseScale(decay=0.9)
    assert smooth.b_noise is None and smooth.noise is None
    smooth.add(10.0, 2.0)
    assert smooth.noise == pytest.approx(10.0) and smooth.signal == pytest.approx(2.0)
    assert smooth.b_noise == pytest.approx(5.0)
    negative = NoiseScale()
    negative.add(10.0, -1.0)     # an early |G|^2 estimate below 0: no noise scale yet
    assert negative.b_noise is None
