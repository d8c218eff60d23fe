"""The gradient noise scale from uneven batches (hetgrad/gns.py) on a problem whose noise is
known: least squares with Gaussian inputs and label noise, where one sample's gradient at
``w`` has mean ``delta = w - w*`` and covariance trace ``S = (d + 1)|delta|^2 + d sigma^2``."""
import math

import numpy as np
import pytest

from hetgrad.gns import EpochNoise, NoiseScale, estimate

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


def test_an_epochs_spread_is_that_of_its_steps_means():
    rng = np.random.default_rng(3)
    s = rng.normal(50.0, 9.0, 40)
    g2 = rng.normal(2.0, 0.5, 40) + 0.01 * s     # correlated
    got = EpochNoise.from_sums(s.sum(), g2.sum(), 40, (s * s).sum(), (g2 * g2).sum(),
                               (s * g2).sum())
    assert got.steps == 40 and got.s == pytest.approx(s.mean())
    assert got.var_s == pytest.approx(np.var(s, ddof=1) / 40)
    assert got.var_g2 == pytest.approx(np.var(g2, ddof=1) / 40)
    assert got.cov == pytest.approx(np.cov(s, g2)[0, 1] / 40)


def test_the_noise_scales_interval_covers_it_as_one_standard_error_does():
    """Epochs of noisy steps with known means, smoothed: the true B_noise lies within the
    interval in about 68 % of the runs; more steps narrow it; a signal within one standard
    error of 0 leaves its upper end unbounded."""
    rng, inside, widths = np.random.default_rng(11), 0, {}
    for run in range(300):
        smooth = NoiseScale(decay=0.99)
        for epoch in range(5):
            s, g2 = rng.normal(400.0, 300.0, 25), rng.normal(2.0, 3.0, 25)
            got = EpochNoise.from_sums(s.sum(), g2.sum(), 25, (s * s).sum(), (g2 * g2).sum(),
                                       (s * g2).sum())
            smooth.add(got.s, got.g2, weight=25, spread=(got.var_s, got.var_g2, got.cov))
        low, high = smooth.interval() or (math.inf, math.inf)
        inside += low <= 200.0 <= high
    assert 0.58 <= inside / 300 <= 0.80
    for steps in (25, 400):
        smooth = NoiseScale(decay=0.999)
        smooth.add(400.0, 2.0, weight=steps, spread=(300.0 ** 2 / steps, 1.0 / steps, 0.0))
        low, high = smooth.interval()
        widths[steps] = high / low
    # one epoch: the relative errors of S and |G|^2 add in quadrature, on the log scale
    assert widths[25] == pytest.approx(math.exp(2 * math.hypot(60 / 400, 0.2 / 2)))
    assert widths[400] == pytest.approx(math.exp(2 * math.hypot(15 / 400, 0.05 / 2)))
    shaky = NoiseScale()
    shaky.add(400.0, 2.0, spread=(0.0, 4.0 / (1 - shaky.decay) ** 2, 0.0))
    assert shaky.interval()[1] == math.inf and shaky.interval()[0] < shaky.b_noise


def _buckets(s, g2, count=8):
    """The six sums of steps ``s``, ``g2`` per bucket of interleaved steps (as the graph
    keeps them)."""
    return [[v[k::count].sum() for v in (s, g2, np.ones_like(s), s * s, g2 * g2, s * g2)]
            for k in range(count)]


def test_a_few_spiking_steps_move_one_bucket_not_the_epochs_estimate():
    """Steps of known means (S 400, |G|^2 2: B_noise 200), skewed as S is: the epoch's
    estimates are the plain means (unbiased). With two spikes of one rank's norm (S far up,
    |G|^2 = n - S/B as far down) the plain |G|^2 falls below 0 (no noise scale); then the
    median of the buckets' means gives B_noise within 20 % of the truth (over runs; 90 % of
    them within 0.7-1.5x), its variances pi/2 those of the plain means (as a median of
    normal means has); with fewer steps than the buckets need: the plain means."""
    rng, ratios = np.random.default_rng(5), []
    for run in range(200):
        s = 400.0 * rng.chisquare(8, 64) / 8
        g2 = rng.normal(2.0, 1.0, 64)
        plain = EpochNoise.from_sums(*(sum(c) for c in zip(*_buckets(s, g2))))
        assert EpochNoise.from_buckets(_buckets(s, g2)) == plain
        s[[3, 41]] += 20000.0
        g2[[3, 41]] -= 20000.0 / 100
        plain = EpochNoise.from_sums(*(sum(c) for c in zip(*_buckets(s, g2))))
        spiked = EpochNoise.from_buckets(_buckets(s, g2))
        assert plain.g2 < 0 < spiked.g2 and spiked.steps == plain.steps == 64
        assert spiked.var_g2 == pytest.approx(math.pi / 2 * plain.var_g2)
        ratios.append(spiked.s / spiked.g2 / 200.0)
    assert 0.8 <= np.median(ratios) <= 1.2
    assert np.mean((0.7 < np.array(ratios)) & (np.array(ratios) < 1.5)) > 0.9
    few = _buckets(np.array([1.0, 2.0, 30.0]), np.array([1.0, 1.0, -4.0]))
    assert EpochNoise.from_buckets(few).g2 == pytest.approx(-2.0 / 3)


def test_without_a_positive_signal_the_interval_still_bounds_the_noise_scale_below():
    """A smoothed |G|^2 at or below 0 gives no noise scale, but S over |G|^2 one standard
    error up still bounds it below (the chooser moves up only if that end pays); nothing if
    that is not above 0, or S is not."""
    smooth = NoiseScale(decay=0.99)
    smooth.add(400.0, -1.0, weight=50, spread=(100.0, 4.0, 0.0))
    low, high = smooth.interval()
    assert smooth.b_noise is None and high == math.inf
    assert low == pytest.approx(400.0 / (-1.0 + 2.0))   # the bias corrections cancel
    sure = NoiseScale(decay=0.99)
    sure.add(400.0, -3.0, weight=50, spread=(100.0, 4.0, 0.0))
    assert sure.interval() is None
    assert NoiseScale().interval() is None
    nothing = NoiseScale()
    nothing.add(-5.0, 1.0)
    assert nothing.b_noise < 0 and nothing.interval() is None   # (the chooser skips it)


def test_the_graph_measures_what_the_estimator_says():
    """hetgrad.noise on three simulated ranks' gradients (two tensors, one of them an
    IndexedSlices with a repeated row), seeded with w_i = b_i / B or fused (seeded with b_i),
    against :func:`estimate` on the same numbers."""
    import tensorflow as tf
    from hetgrad.noise import GradientNoise, squared_norm

    rng = np.random.default_rng(5)
    batches = [3.0, 0.0, 9.0, 4.0]       # rank 1 holds no sample
    total = sum(batches)
    mine = [[rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(5).astype(
        np.float32)] if b else [np.zeros((4, 3), np.float32), np.zeros(5, np.float32)]
        for b in batches]
    sq = [float(sum(np.sum(t ** 2) for t in g)) for g in mine]
    mean = [sum(b / total * g[k] for b, g in zip(batches, mine)) for k in range(2)]
    want = estimate(batches, sq, float(sum(np.sum(t ** 2) for t in mean)))
    for fused in (False, True):
        gauges = [GradientNoise() for _ in batches]
        for noise, g, b in zip(gauges, mine, batches):
            w = b if fused else b / total
            noise.keep([tf.constant(w * t) for t in g], tf.constant([w, b]),
                       [tf.constant(t) for t in mean])
        others = sum(noise.take_rows()[:, :3] for noise in gauges[1:])
        got = gauges[0].take(lambda rows: rows + others)   # the ranks' sum, as take() asks
        s, g2, steps = got.s, got.g2, got.steps
        assert steps == 1 and got.var_s == 0 and s == pytest.approx(want[0], rel=1e-5) \
            and g2 == pytest.approx(want[1], rel=1e-5), fused
    rows = tf.IndexedSlices(tf.constant([[1.0, 2.0], [3.0, 4.0]]), tf.constant([1, 1]),
                            tf.constant([3, 2]))
    assert float(squared_norm([rows])) == pytest.approx(4.0 ** 2 + 6.0 ** 2)


def test_steps_go_round_the_buckets_and_an_uncounted_one_adds_nothing():
    """Counted steps (rows of the ranks' sums) fill the 8 buckets in turn; a step that fewer
    than two ranks held -- even with a non-finite norm -- adds nothing and takes no turn.
    35 counted steps whose mean |G|^2 is below 0: the medians of the buckets' means decide,
    so a step in the wrong bucket moves the result."""
    from hetgrad.noise import BUCKETS
    rows, table = [], np.zeros((BUCKETS, 6))
    for k in range(4 * BUCKETS + 3):
        sum_bn = 10.0 + k * k % 13   # S = sum_bn - 4, |G|^2 = 1 - S / 4 (held 2, B 4, n 1)
        rows += [[sum_bn, 4.0, 2.0, 1.0], [1.0, 4.0, 1.0, float("nan")]]  # 2 ranks, then 1
        s = sum_bn - 4.0
        g2 = 1.0 - s / 4.0
        table[k % BUCKETS] += [s, g2, 1.0, s * s, g2 * g2, s * g2]
    got = EpochNoise.from_rows(np.array(rows), BUCKETS)
    want = EpochNoise.from_buckets(table.tolist())
    plain = EpochNoise.from_sums(*table.sum(0))
    assert table[:, 2].tolist() == [5.0] * 3 + [4.0] * (BUCKETS - 3) and plain.g2 < 0
    assert got.steps == 4 * BUCKETS + 3 and got.s != pytest.approx(plain.s)   # the medians
    assert (got.s, got.g2, got.var_s, got.cov) == pytest.approx(
        (want.s, want.g2, want.var_s, want.cov))
    assert EpochNoise.from_rows(np.zeros((0, 4)), BUCKETS).steps == 0


def test_the_rows_keep_an_epochs_latest_steps_and_grow_past_them():
    """keep() writes a row per measured step (every 2nd here); past the variable's rows it
    keeps the latest ones in order and take_rows() grows it for the next epoch; reserve()
    drops what was written (the probe's steps) and makes room."""
    import tensorflow as tf
    from hetgrad.noise import GradientNoise
    noise = GradientNoise(every=2, capacity=3)
    step = tf.function(lambda k: noise.keep([tf.reshape(k, [1])], tf.constant([1.0, 2.0]),
                                            [tf.constant([0.5])]))
    for k in range(1, 10):
        step(tf.constant(float(k)))   # steps 1, 3, 5, 7, 9 measured: rows b_i n_i = 2 k^2
    np.testing.assert_allclose(noise.take_rows(), [[2.0 * k * k, 2.0, 1.0, 0.25]
                                                   for k in (5, 7, 9)])
    assert noise.capacity == 5 and len(noise.take_rows()) == 0
    for k in range(4):
        step(tf.constant(1.0))
    noise.reserve(8)
    assert noise.capacity == 8 and len(noise.take_rows()) == 0
    step(tf.constant(5.0))   # (step 13: not measured)
    step(tf.constant(3.0))
    np.testing.assert_allclose(noise.take_rows(), [[18.0, 2.0, 1.0, 0.25]])
    assert noise.take(lambda rows: 1 / 0).steps == 0   # nothing to sum: no collective
    gated = GradientNoise(every=2, gate=lambda: tf.constant(False))   # (Adam's first steps)
    for k in range(3):
        gated.keep([tf.constant([1.0])], tf.constant([1.0, 2.0]), [tf.constant([0.5])])
    rows = gated.take_rows()
    assert len(rows) == 2 and not rows.any()   # written, held by none: counted for nothing


def test_the_preconditioner_is_adams_step_per_unit_gradient():
    """After two Adam steps, the scales for a third step's gradient are the step that Adam
    then takes per unit gradient (with beta_1 = 0 its first moment is the gradient itself:
    ``-dw / (lr g)``), on each of the flavour's Adam classes (Keras 2's legacy one too);
    none for SGD or AMSGrad (its step divides by the largest second moment seen)."""
    from hetgrad import compat
    keras = compat.keras
    grads = [np.array([[0.5], [-2.0], [0.1]], np.float32),
             np.array([[1.5], [1.0], [0.1]], np.float32),
             np.array([[-1.0], [3.0], [0.2]], np.float32)]
    kinds = [keras.optimizers] + ([] if compat.KERAS3 else [keras.optimizers.legacy])
    for opts in kinds:
        layer = keras.layers.Dense(1, use_bias=False)
        layer.build((None, 3))
        adam = opts.Adam(0.01, beta_1=0.0, beta_2=0.9, epsilon=0.05)
        for g in grads[:2]:
            adam.apply_gradients([(g, layer.kernel)])
        before = np.array(layer.kernel.numpy())
        scales = compat.adam_preconditioner(adam)
        got = np.asarray(scales([scales.moment(layer.kernel)], [grads[2]])[0])
        adam.apply_gradients([(grads[2], layer.kernel)])
        step = -(layer.kernel.numpy() - before) / (0.01 * grads[2])
        np.testing.assert_allclose(got, step, rtol=1e-4, err_msg=str(opts))
        assert compat.adam_preconditioner(opts.SGD(0.1)) is None
        assert compat.adam_preconditioner(opts.Adam(0.1, amsgrad=True)) is None


def test_an_epoch_weighs_the_steps_of_b0_its_samples_make():
    """The smoothing's decay is per step of B_0: an epoch of 10 measured steps out of every
    4th at B_0 = 100 weighs 40, one of 5 such at B = 200 weighs 40 as well."""
    from types import SimpleNamespace

    from hetgrad.observe import Noise
    epochs = [(100, EpochNoise(8.0, 2.0, 10)), (200, EpochNoise(30.0, 1.0, 5))]   # B, the epoch
    action, rows = Noise(decay=0.99), []
    for batch, taken in epochs:
        summed = object()   # what take() must get to sum the ranks' rows
        gauge = SimpleNamespace(take=lambda got, taken=taken: taken if got is summed else None,
                                every=4, precondition=None)
        job = SimpleNamespace(aggregation=SimpleNamespace(noise=gauge),
                              comm=SimpleNamespace(allreduce_sum=summed),
                              plan=SimpleNamespace(global_batch=batch),
                              spec=SimpleNamespace(global_batch=100))
        rows.append({})
        action.on_epoch_end(job, len(rows) - 1, rows[-1])
    keep = 0.99 ** 40
    s = keep * (1 - keep) * 8.0 + (1 - keep) * 30.0     # the corrections cancel in S / |G|^2
    g2 = keep * (1 - keep) * 2.0 + (1 - keep) * 1.0
    assert rows[0]["b_noise_smoothed"] == pytest.approx(4.0)
    assert rows[1]["b_noise_smoothed"] == pytest.approx(s / g2)
    assert rows[1]["b_noise"] == pytest.approx(30.0) and not rows[1]["gns_preconditioned"]


def test_the_rate_of_measured_steps_changes_without_a_new_trace():
    """``every`` is a variable: set between calls of a traced step, it changes which steps
    write a row (one in 1, then one in 3 counted on from where the count stands)."""
    import tensorflow as tf
    from hetgrad.noise import GradientNoise
    noise = GradientNoise(every=1)

    @tf.function
    def step():
        noise.keep([tf.constant([1.0])], tf.constant([1.0, 2.0]), [tf.constant([0.5])])
    for _ in range(4):
        step()
    noise.every.assign(3)
    for _ in range(6):   # counts 4..9: 6 and 9 measured
        step()
    assert len(noise.take_rows()) == 4 + 2
    assert step.experimental_get_tracing_count() == 1


@pytest.mark.parametrize("steps,every", [(1000, 4), (256, 4), (255, 3), (128, 2), (127, 1),
                                         (50, 1)])
def test_an_adaptive_epoch_measures_64_steps_or_every_one(steps, every):
    from hetgrad.noise import every_for
    assert every_for(steps) == every and every_for(steps, most=2) == min(every, 2)


def test_an_epoch_after_the_split_weighs_the_steps_its_rate_stands_for():
    """The split's part measured every step, the epoch's rest every 4th (the adaptive batch
    changed the rate at the rest's begin): each weighs its own measured steps times its own
    rate, and the row says the rate."""
    from types import SimpleNamespace

    import tensorflow as tf
    from hetgrad.observe import Noise
    every, summed = tf.Variable(1, dtype=tf.int64), object()
    action, rows = Noise(decay=0.99), [{}, {}]
    for rate, batch, taken, row in ((1, 100, EpochNoise(8.0, 2.0, 20), rows[0]),
                                    (4, 200, EpochNoise(30.0, 1.0, 5), rows[1])):
        every.assign(rate)
        gauge = SimpleNamespace(take=lambda got, taken=taken: taken if got is summed else None,
                                every=every, precondition=None)
        job = SimpleNamespace(aggregation=SimpleNamespace(noise=gauge),
                              comm=SimpleNamespace(allreduce_sum=summed),
                              plan=SimpleNamespace(global_batch=batch),
                              spec=SimpleNamespace(global_batch=100))
        (action.on_split if row is rows[0] else action.on_epoch_end)(job, 0, row)
    first, rest = 0.99 ** 20, 0.99 ** (5 * 4 * 2)   # what each keeps of the past
    s = rest * (1 - first) * 8.0 + (1 - rest) * 30.0
    g2 = rest * (1 - first) * 2.0 + (1 - rest) * 1.0
    assert rows[1]["b_noise_smoothed"] == pytest.approx(s / g2)
    assert (rows[0]["gns_every"], rows[1]["gns_every"]) == (1, 4)


def test_preconditioned_norms_are_of_the_scaled_gradients():
    """keep() with a preconditioner: this rank's ``b_i |s * g_i|^2`` and ``|s * g|^2``, the
    scales given the step's mean gradient and the variable's second moment."""
    import tensorflow as tf
    from hetgrad.noise import GradientNoise
    g_i, g = np.array([1.0, -2.0, 4.0], np.float32), np.array([0.5, 1.0, -1.0], np.float32)
    s = np.array([2.0, 0.5, 0.25], np.float32)
    seen = []

    def scales(moments, grads):
        seen.append((np.asarray(moments[0]), np.asarray(grads[0])))
        return [tf.constant(s)]
    scales.moment = lambda variable: tf.constant([7.0, 8.0, 9.0]) if variable == "var" else None
    noise = GradientNoise(precondition=scales)
    w, b = 0.25, 8.0
    noise.keep([tf.constant(w * g_i)], tf.constant([w, b]), [tf.constant(g)], ["var"])
    np.testing.assert_allclose(seen[0][0], [7.0, 8.0, 9.0])
    np.testing.assert_allclose(seen[0][1], g)
    np.testing.assert_allclose(noise.take_rows()[-1],
                               [b * np.sum((s * g_i) ** 2), b, 1.0, np.sum((s * g) ** 2)],
                               rtol=1e-6)


def test_small_gradients_are_read_whole_in_one_vector_and_a_large_one_in_a_block():
    """Tensors of several shapes (and a None) measured exactly; a large constant one (its
    every block has the same squares) counted as many times as it has blocks; with a
    preconditioner, each entry scaled by its own variable's second moment's scale."""
    import tensorflow as tf
    from hetgrad.noise import Blocks, GradientNoise
    rng = np.random.default_rng(2)
    small = [rng.standard_normal(shape).astype(np.float32) for shape in ((3, 4), (5,))]
    large = np.full(40000, 0.5, np.float32)
    mine = [small[0], None, small[1], large]
    mean = [0.5 * t if t is not None else None for t in mine]
    moments = {k: np.float32(k + 1) for k in range(4)}
    for precondition in (None, "sqrt"):
        scales = None
        if precondition:
            def scales(vs, grads):
                return [1.0 / tf.sqrt(v) for v in vs]
            scales.moment = lambda k: tf.fill(mine[k].shape, moments[k])
        noise = GradientNoise(precondition=scales, blocks=Blocks(blocks=4, whole=16384))
        noise.keep([None if t is None else tf.constant(t) for t in mine],
                   tf.constant([1.0, 6.0]), [None if t is None else tf.constant(t) for t in mean],
                   list(range(4)))
        factor = (lambda k: 1.0 / moments[k]) if precondition else (lambda k: 1.0)
        want = sum(factor(k) * np.sum(mine[k] ** 2) for k in (0, 2, 3))
        np.testing.assert_allclose(noise.take_rows()[-1],
                                   [6.0 * want, 6.0, 1.0, 0.25 * want], rtol=1e-5)


def test_a_large_gradient_is_read_in_blocks_that_keep_its_squares_unbiased():
    """Blocks: a gradient of over ``whole`` entries is read one block of 1/blocks of them per
    step (the same block on every rank: drawn from the step), its squares counted ``blocks``
    times; a small one whole. Over many steps the sum of squares averages to the true one
    (entries of very unequal size: 99 % of the sum in a quarter of them, spread over every
    block), every block is drawn, and a block is contiguous."""
    import tensorflow as tf
    from hetgrad.noise import Blocks, squared_norm
    blocks = Blocks(blocks=8, whole=100)
    big = np.ones((10, 100), np.float32)
    big[:, :25] = 20.0
    small = tf.constant(np.full((4, 5), 3.0, np.float32))
    index = tf.constant(np.arange(1000, dtype=np.float32).reshape(10, 100))
    assert blocks.layout(1000) == (128, 8) and blocks.layout(20) == (20, 1)
    sums, drawn_blocks = [], set()
    for step in range(400):
        (cut, count), (whole, one) = blocks.draw([(10, 100), (4, 5)], tf.constant(step, tf.int64))
        assert (count, one) == (8, 1) and whole(small) is small
        entries = cut(index).numpy()
        begin = int(entries[0])
        np.testing.assert_array_equal(entries, np.arange(begin, min(begin + 128, 1000)))
        drawn_blocks.add(begin // 128)
        sums.append(float(squared_norm([cut(tf.constant(big)), small], [count, one])))
    twice = [blocks.draw([(10, 100)], tf.constant(7, tf.int64))[0][0](index) for _ in range(2)]
    np.testing.assert_array_equal(twice[0].numpy(), twice[1].numpy())
    assert drawn_blocks == set(range(8))
    assert np.mean(sums) == pytest.approx(float(np.sum(big ** 2)) + 20 * 9.0, rel=0.05)


def test_read_in_blocks_the_noise_scale_of_a_large_gradient_stays_within_20_percent():
    """The graph's estimator (three simulated ranks, uneven batches) on a gradient of 24,000
    entries, read one block of 1/16 per step: each rank's mean gradient is ``G + xi_i /
    sqrt(b_i)``, ``xi_i`` Gaussian with a variance ten times larger on the first 3,000
    entries (an uneven spread over the blocks), so ``S`` and ``|G|^2`` are known. Over 300
    steps the means are within 20 % of them, and of the same estimator reading every entry."""
    import tensorflow as tf
    from hetgrad.noise import BUCKETS, Blocks, GradientNoise
    rng, shape, batches = np.random.default_rng(11), (120, 200), [8.0, 24.0, 64.0]
    var = np.full(shape, 1e-3, np.float32)
    var.flat[:3000] = 1e-2
    signal = np.full(shape, np.sqrt(0.5 / var.size), np.float32)       # |G|^2 = 0.5
    true_s, total = float(var.sum()), sum(batches)
    gauges = {"blocks": GradientNoise(), "whole": GradientNoise(blocks=Blocks(blocks=1))}
    assert gauges["blocks"].blocks.layout(var.size) == (1504, 16)
    rows = {k: [] for k in gauges}
    for _ in range(300):
        mine = [signal + rng.standard_normal(shape).astype(np.float32) * np.sqrt(var / b)
                for b in batches]
        mean = [tf.constant(sum(b / total * g for b, g in zip(batches, mine)))]
        for k, noise in gauges.items():
            sent = [noise._measured([tf.constant(b / total * g)], tf.constant([b / total, b]),
                                    mean, None).numpy() for b, g in zip(batches, mine)]
            rows[k].append([*np.sum(sent, 0)[:3], sent[0][3]])   # n: the same on every rank
            noise.count.assign_add(1)
    taken, whole = (EpochNoise.from_rows(np.array(rows[k]), BUCKETS)
                    for k in ("blocks", "whole"))
    (s, g2, steps), (s_all, g2_all) = (taken.s, taken.g2, taken.steps), (whole.s, whole.g2)
    assert steps == 300
    assert s == pytest.approx(true_s, rel=0.2) and g2 == pytest.approx(0.5, rel=0.2)
    assert s == pytest.approx(s_all, rel=0.2) and g2 == pytest.approx(g2_all, rel=0.2)
    assert s / g2 == pytest.approx(true_s / 0.5, rel=0.2)


@pytest.fixture(scope="module")
def measured(world3, tmp_path_factory):
    """``hetgrad train --gns`` on the same data, seed and global batch, split equally (plan
    weights) and unevenly (counted samples, fused into the exchange): the global order makes
    both train the same model, so only the estimator's split differs."""
    d = tmp_path_factory.mktemp("gns")
    return {name: world3.run("training:train", speeds=speeds, epochs=3, quiet=True, gns=True,
                             probe_steps=1, seed=3, out=str(d / f"{name}.json"), **extra).root
            for name, speeds, extra in (("equal", [1, 1, 1], {"gns_every": 1}),
                                        ("uneven", [1, 2, 4], {"weighting": "samples",
                                                               "gns_every": 1}),
                                        ("every4", [1, 2, 4], {}),
                                        ("every4-samples", [1, 2, 4], {"weighting": "samples"}),
                                        ("sparse", [1, 1, 1], {"gns_every": 1, "sparsify": "topk",
                                                               "density_warmup": 2}),
                                        ("adam-equal", [1, 1, 1], {"gns_every": 1, **ADAM}),
                                        ("adam-uneven", [1, 2, 4], {"gns_every": 1, **ADAM,
                                                                    "weighting": "samples"}))}


ADAM = {"optimizer": "adam", "lr": 0.003}


def test_equal_and_uneven_splits_record_the_same_noise_scale(measured):
    equal, uneven = measured["equal"], measured["uneven"]
    assert equal["plan"]["batches"] == [32, 32, 32] and uneven["plan"]["batches"] == [14, 27, 55]
    steps = equal["plan"]["steps_per_epoch"]
    for a, b in zip(equal["epochs"], uneven["epochs"]):
        assert a["gns_steps"] == b["gns_steps"] == steps   # each epoch's own steps
        assert a["gns_noise"] > 0 and a["gns_signal"] > 0 and b["gns_signal"] > 0
        assert b["b_noise_smoothed"] == pytest.approx(a["b_noise_smoothed"], rel=0.2)
        assert b["b_noise"] == pytest.approx(a["b_noise"], rel=0.2)
    # the trajectories are the same (weighted = full batch), so this compares estimators only
    assert uneven["final_test_accuracy"] == pytest.approx(equal["final_test_accuracy"], abs=0.01)


def test_with_adam_the_preconditioned_noise_scale_agrees_between_splits(measured):
    """Adam's noise scale is of ``g / (sqrt(v_hat) + eps)``, after its 10th step: the same with
    equal and uneven batches (the same trajectory) -- over the run's 35 measured steps within
    20 %, an epoch's (5 or 15 steps, 2 degrees of freedom each: ~1/sqrt(steps) of spread
    each, 0.31 and 0.29 apart in epochs 1-2) within 40 %."""
    equal, uneven = measured["adam-equal"], measured["adam-uneven"]
    steps = equal["plan"]["steps_per_epoch"]
    assert [e["gns_steps"] for e in equal["epochs"]] == [steps - 10, steps, steps]
    for a, b in zip(equal["epochs"], uneven["epochs"]):
        assert a["gns_preconditioned"] and b["gns_preconditioned"] and a["b_noise"] > 0
        assert b["b_noise"] == pytest.approx(a["b_noise"], rel=0.4)
    assert uneven["epochs"][-1]["b_noise_smoothed"] == pytest.approx(
        equal["epochs"][-1]["b_noise_smoothed"], rel=0.2)
    assert not measured["equal"]["epochs"][0]["gns_preconditioned"]


def test_by_default_every_fourth_step_is_measured(measured):
    """Steps 0, 4, 8, ... of the run (counted on across epochs), the last one too."""
    run = measured["every4"]
    total = 3 * run["plan"]["steps_per_epoch"]
    assert sum(e["gns_steps"] for e in run["epochs"]) == (total - 1) // 4 + 1
    assert all(e["gns_noise"] > 0 and e["b_noise_smoothed"] > 0 for e in run["epochs"])


def test_plan_weights_and_counted_samples_measure_the_same(measured):
    """Every 4th step measured, the same split and trajectory: seeded with plan weights
    ``w_i`` or with the counted samples ``b_i`` (fused into the exchange), the same steps
    and estimates."""
    plan, samples = measured["every4"], measured["every4-samples"]
    assert plan["plan"]["batches"] == samples["plan"]["batches"] == [14, 27, 55]
    for a, b in zip(plan["epochs"], samples["epochs"]):
        assert a["gns_steps"] == b["gns_steps"] > 0
        assert b["gns_noise"] == pytest.approx(a["gns_noise"], rel=1e-3)
        assert b["gns_signal"] == pytest.approx(a["gns_signal"], rel=1e-3)


def test_a_sparse_run_measures_in_its_dense_warm_up_only(measured):
    """--sparsify topk --density-warmup 2: epoch 1 (density 21.5 %) sends every entry, so it
    trains and measures as the dense run does; epochs 2-3 (4.6 %, 1 %) are sparse: none."""
    dense, sparse = measured["equal"]["epochs"], measured["sparse"]["epochs"]
    assert sparse[0]["gns_steps"] == dense[0]["gns_steps"]
    assert sparse[0]["b_noise"] == pytest.approx(dense[0]["b_noise"], rel=1e-3)
    assert "gns_steps" not in sparse[1] and "gns_steps" not in sparse[2]
