"""Step-time models (affine fit, piecewise fallback) and the equal-time partitioner."""
import itertools
import json

import pytest
from hypothesis import given, settings, strategies as st

from hetgrad.partition import Plan, equal_plan, fixed_plan, make_plan
from hetgrad.probe import ProbeResult, refine
from hetgrad.perfmodel import (BATCH_CEILING, StepModel, _batch_at, constant, equal_time_batches,
                               fit, probe_batches, relative_noise, scale_through)


def test_affine_fit_recovers_fixed_cost_and_speed():
    m = fit([[8, 0.004 + 8 / 2000], [32, 0.004 + 32 / 2000], [128, 0.004 + 128 / 2000]])
    assert m.kind == "affine"
    assert m.fixed_s == pytest.approx(0.004, rel=1e-9)
    assert m.samples_per_s == pytest.approx(2000, rel=1e-9)
    assert m.fit_error < 1e-9
    assert m.time(64) == pytest.approx(0.004 + 64 / 2000)


def test_negative_intercept_falls_back_to_the_origin():
    m = fit([[10, 0.001], [20, 0.004], [40, 0.010]])  # least squares would give a < 0
    assert m.fixed_s == 0.0 and m.samples_per_s > 0


def test_curve_that_is_not_affine_goes_piecewise_through_the_points():
    pts = [[8, 0.010], [32, 0.011], [128, 0.060]]  # flat, then steep (e.g. out of cache)
    m = fit(pts)
    assert m.fit_error > 0.10 and m.kind == "piecewise"
    for b, t in pts:
        assert m.time(b) == pytest.approx(t)
    assert m.time(80) == pytest.approx(0.011 + (80 - 32) * (0.049 / 96))
    assert m.time(256) > m.time(128)  # extended by the end segment


def test_a_miss_within_the_points_own_noise_stays_affine():
    pts = [[8, 0.029], [28, 0.024], [96, 0.040]]   # oversubscribed ranks: 20-40 % step spread
    assert fit(pts).kind == "piecewise"
    assert fit(pts, noise=[0.15, 0.12, 0.05]).kind == "affine"
    assert fit(pts, noise=[0.01, 0.01, 0.01]).kind == "piecewise"
    steady = [0.020] * 10
    assert relative_noise(steady) == 0.0
    spread = relative_noise([0.020, 0.030] * 5)   # IQR 0.01 around a median of 0.025
    assert spread == pytest.approx(1.2533 * (0.010 / 1.349) / (0.025 * 10 ** 0.5))


def test_probe_batches_cover_the_plans_local_batches():
    assert probe_batches(96, 96, 4) == [6, 24, 96]
    assert probe_batches(128, 512, 2) == [64, 91, 128]   # capped by memory
    assert probe_batches(4, 4, 4) == [1, 2, 4]
    assert probe_batches(64, 96, 4, count=1) == [64]


def test_flat_step_times_keep_the_throughput_split():
    """A tiny model: the step hardly grows with the batch, and the fitted fixed costs differ by
    noise. Equal time alone would move a third of a rank's batch for a 2 % gain."""
    pts = [[[32, 0.0040], [90, 0.0041], [256, 0.0043]],
           [[32, 0.0038], [90, 0.0039], [256, 0.0042]]]
    models = [fit(p) for p in pts]
    assert equal_time_batches(models, 256, [1, 1], [256, 256]) == [75, 181]  # for < 2 %
    plan = make_plan(models, 256, 4096)
    share = 256 / 0.0043 / (256 / 0.0043 + 256 / 0.0042)
    assert plan.batches[0] == pytest.approx(256 * share, abs=1)            # throughput split
    # a real gain (here 10 ms of fixed cost at 20-50 ms steps) still moves the work
    assert make_plan([StepModel(0.0, 1000.0, points=[[96, 0.096]]),
                      StepModel(0.010, 1000.0, points=[[96, 0.106]])], 96, 960).batches == [53, 43]


def test_fixed_cost_moves_work_to_where_it_costs_least():
    # same speed, rank 1 pays 10 ms more per step: it must get a smaller batch
    models = [StepModel(0.0, 1000.0), StepModel(0.010, 1000.0)]
    plan = make_plan(models, 96, 960)
    assert plan.batches == [53, 43]   # 53/1000 = 0.053, 0.010 + 43/1000 = 0.053
    assert max(plan.predicted_times_s) == plan.predicted_step_s
    assert plan.predicted_step_s == pytest.approx(0.053)
    assert make_plan([1000.0, 1000.0], 96, 960).batches == [48, 48]  # constant model


def test_only_measured_models_give_predicted_seconds():
    # relative speeds (--speeds 1,2,4, Horovod's equal split) and fixed splits time nothing:
    # a "predicted step" of b / 1 samples per second would read as 48 s
    for plan in (make_plan([1, 2, 4], 96, 960), equal_plan(2, 96, 960), fixed_plan([40, 56], 960),
                 make_plan([StepModel(0.0, 1000.0), 2.0], 96, 960)):
        assert plan.predicted_step_s is None and plan.predicted_times_s is None
    plan = make_plan([constant(1000.0), constant(3000.0)], 96, 960)
    assert plan.batches == [24, 72] and plan.predicted_step_s == pytest.approx(0.024)


def brute_force(models, total, lo, hi):
    best = None
    for combo in itertools.product(*[range(l, h + 1) for l, h in zip(lo, hi)]):
        if sum(combo) == total:
            worst = max(m.time(b) for m, b in zip(models, combo))
            best = worst if best is None else min(best, worst)
    return best


affine_st = st.builds(StepModel, st.floats(0.0, 0.05), st.floats(10.0, 5000.0))
scaled_st = st.builds(lambda m, scale: m.scaled(scale),
                      st.one_of(affine_st, st.builds(constant, st.floats(10.0, 5000.0))),
                      st.floats(0.5, 2.0))
# a probe's curve as fit() may leave it: points sorted by batch, times maybe falling (raised
# to a non-decreasing curve) or flat, a scale from the rebalancer
piecewise_st = st.builds(
    lambda pts, scale: StepModel(0.0, 1.0, kind="piecewise", scale=scale,
                                 points=sorted([float(b), t] for b, t in pts)),
    st.lists(st.tuples(st.integers(1, 30), st.floats(1e-4, 0.05)), min_size=1, max_size=4,
             unique_by=lambda p: p[0]),
    st.floats(0.5, 2.0))
model_st = st.one_of(affine_st, scaled_st, piecewise_st)


@settings(max_examples=300, deadline=None)
@given(model=model_st, level=st.floats(1e-6, 0.2))
def test_the_largest_batch_within_a_step_time_inverts_the_model(model, level):
    b = _batch_at(model, level)
    if b == 0.0:   # nothing within: not even a sliver of a sample
        assert model.time(1e-9) > level or model.time(0.0) > level
        return
    assert model.time(b) <= level * (1 + 1e-9) + 1e-15
    if b < BATCH_CEILING:   # and a little more is not
        assert model.time(b * (1 + 1e-6) + 1e-6) > level


@settings(max_examples=200, deadline=None)
@given(models=st.lists(model_st, min_size=1, max_size=3), total=st.integers(1, 24),
       data=st.data())
def test_equal_time_batches_are_optimal_against_brute_force(models, total, data):
    p = len(models)
    lo = [data.draw(st.integers(0, 3)) for _ in range(p)]
    hi = [l + data.draw(st.integers(0, 20)) for l in lo]
    if not sum(lo) <= total <= sum(hi):
        with pytest.raises(ValueError):
            equal_time_batches(models, total, lo, hi)
        return
    out = equal_time_batches(models, total, lo, hi)
    assert sum(out) == total and all(l <= b <= h for l, b, h in zip(lo, out, hi))
    worst = max(m.time(b) for m, b in zip(models, out))
    assert worst == pytest.approx(brute_force(models, total, lo, hi), rel=1e-12, abs=1e-15)


def test_the_bisection_stops_once_the_batches_at_its_ends_agree():
    """The water level is a head start for the exact hand-out of the last samples (whose
    optimality the brute-force test checks): its bisection stops once the batches at both
    ends sum within 1e-4 of each other, some 30 levels for 4 ranks and a batch of 400 --
    the adaptive batch weighs a dozen such splits every epoch -- not 80."""
    from hetgrad import perfmodel
    models = [StepModel(0.004, 4000.0), StepModel(0.004, 4000.0), StepModel(0.004, 2000.0),
              StepModel(0.0, 1.0, kind="piecewise", points=[[25, 0.02], [100, 0.05], [400, 0.2]])]
    calls = []
    with pytest.MonkeyPatch.context() as m:
        m.setattr(perfmodel, "_batch_at", lambda *a: calls.append(1) or _batch_at(*a))
        out = equal_time_batches(models, 400, [1] * 4, [400] * 4)
    assert sum(out) == 400 and len(calls) <= 4 * 40, len(calls)


def test_plans_saved_before_the_model_still_load(tmp_path):
    old = make_plan([constant(1.0), constant(3.0)], 96, 1000).to_dict()  # times recorded
    for key in ("fixed_s", "predicted_step_s", "predicted_times_s"):
        del old[key]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    plan = Plan.load(path, world_size=2)
    assert plan.batches == [24, 72] and plan.predicted_step_s is None


def test_constant_model_is_the_zero_fixed_cost_case():
    assert constant(250.0).time(50) == pytest.approx(0.2)
    assert StepModel(0.0, 250.0).time(50) == constant(250.0).time(50)


def test_scale_multiplies_and_fits_through_the_measured_points():
    m = StepModel(0.004, 500.0)
    assert m.scaled(2.0).scaled(1.5).time(10) == pytest.approx(3.0 * m.time(10))
    assert scale_through(m, [[10, 0.9 * m.time(10)]]) == pytest.approx(0.9)
    assert scale_through(m, [[10, 0.9 * m.time(10)], [20, 1.1 * m.time(20)]],
                         [0.0, 1.0]) == pytest.approx(1.1)


def test_refine_corrects_a_plan_a_noisy_fixed_cost_put_off_by_a_sample():
    """Slow rank 2 ms/sample, fast 0.25 ms/sample, both 4 ms fixed; the probe put the slow
    rank's fixed cost at 6.4 ms. Timing both at the plan it gives and scaling the models there
    gives the plan of the true models."""
    true = [StepModel(0.004, 500.0), StepModel(0.004, 4000.0)]
    probed = [StepModel(0.0064, 500.0), StepModel(0.004, 4000.0)]
    planned = []

    def planner(models):
        planned.append(make_plan(models, 96, 96).batches)
        return planned[-1]

    class TwoRanks:  # rank 0 of two; rank 1 reports its true time at its planned batch
        rank, size = 0, 2

        def gather_with_timeout(self, point, timeout):
            b1 = planned[-1][1]
            return [point, [b1, true[1].time(b1)]]

    results = [ProbeResult(r, "host", "/CPU:0", m.samples_per_s, m.fixed_s)
               for r, m in enumerate(probed)]
    time_at = lambda sizes, lockstep: ([[sizes[0], true[0].time(sizes[0])]], [[]])  # noqa: E731
    out = refine(TwoRanks(), results, planner, time_at, rounds=1, timeout=1.0)
    assert planned == [[9, 87]] and make_plan(true, 96, 96).batches == [10, 86]
    assert out[0].plan_points == [[9, pytest.approx(true[0].time(9))]]
    assert out[0].scale == pytest.approx(true[0].time(9) / probed[0].time(9))
    assert out[1].scale == pytest.approx(1.0)
    assert make_plan([r.model() for r in out], 96, 96).batches == [10, 86]
    # a second round times the new plan, and stops once the plan no longer moves
    out = refine(TwoRanks(), results, planner, time_at, rounds=3, timeout=1.0)
    assert planned[1:] == [[9, 87], [10, 86], [10, 86]] and len(out[0].plan_points) == 2


def test_probe_record_and_per_rank_timers_on_two_ranks(world2, tmp_path):
    """Rank 1 emulated 4x faster; mode uneven-avg (a baseline) is timed like weighted."""
    rec = world2.run("training:train", mode="uneven-avg", emulate_speeds="1,4", probe_refine=1,
                     emulate_unit=2e-3, epochs=3, quiet=True, out=str(tmp_path / "run.json")).root
    # the probe ran (and traced) training's own step: the first epoch is a measurement
    assert [e["warmup"] for e in rec["balance"]] == [False, False, False]
    for entry in rec["probe"]:
        assert [b for b, _ in entry["points"]] == [12, 34, 96]  # B / (4 P) .. B
        assert entry["fixed_s"] >= 0
        noise = [relative_noise(t) for t in entry["step_times_s"]]
        model = ProbeResult(**{**entry, "scale": 1.0}).model()  # the fit (before refinement):
        # affine within 10 % or the noise, else piecewise
        assert model.kind == fit(entry["points"], noise).kind, entry
        for (b, t), e in zip(entry["points"], noise):
            assert abs(model.time(b) - t) <= max(0.10, 2 * e) * t + 1e-12, entry
        times = [t for _, t in entry["points"]]
        assert times == sorted(times)
        # refined once (--probe-refine 1): timed at its planned batch, the model scaled there
        (b, t), = entry["plan_points"]
        assert ProbeResult(**entry).model().time(b) == pytest.approx(t)
        assert entry["scale"] == pytest.approx(t / model.time(b))
    slow, fast = rec["probe"]
    assert 2.0 < fast["samples_per_s"] / slow["samples_per_s"] < 5.0
    assert slow["plan_points"][0][0] < fast["plan_points"][0][0]
    assert sum(p["plan_points"][0][0] for p in rec["probe"]) == 96
    plan = rec["plan"]
    models = [ProbeResult(**p).model() for p in rec["probe"]]
    assert plan["predicted_times_s"] == pytest.approx(
        [m.time(b) for m, b in zip(models, plan["batches"])])
    assert plan["batches"][0] < plan["batches"][1] and plan["predicted_step_s"] > 0
    assert len(plan["predicted_times_s"]) == 2
    # each rank's own busy time and epoch time (not a cross-rank mean)
    assert len(rec["balance"]) == 3
    assert rec["per_rank_epoch_times_s"][0] != rec["per_rank_epoch_times_s"][1]
    for e in rec["balance"][1:]:
        assert e["busy_s"][0] != e["busy_s"][1] and e["wait_s"][0] != e["wait_s"][1]


def test_fixed_plan_keeps_the_given_batches():
    from hetgrad.partition import fixed_plan
    plan = fixed_plan([20, 76], 1437)
    assert plan.batches == [20, 76] and plan.global_batch == 96
    assert plan.steps_per_epoch == 15 and sum(plan.shard_sizes) == 1437
    with pytest.raises(Exception, match="integers >= 1"):
        fixed_plan([0, 96], 1437)
