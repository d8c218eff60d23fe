"""The goodput-driven global batch (hetgrad.goodput): efficiency, AdaScale's gain, the
chooser's decisions and hysteresis; no TensorFlow."""
import json
import math

import pytest

from hetgrad.errors import ConfigError
from hetgrad.goodput import (BatchChooser, aligned, candidates, check_range, default_lr_rule,
                             efficiency, gain, lr_factor, split_step)


def test_efficiency_and_gain_follow_the_noise_scale():
    assert efficiency(64, 500.0, 64) == 1.0
    assert efficiency(564, 500.0, 64) == pytest.approx(564 / 1064)
    # a batch far below B_noise is almost free (linear scaling), far above it worthless
    assert gain(128, 1e9, 64) == pytest.approx(2.0)
    assert gain(6400, 1.0, 64) == pytest.approx(65 / 64, rel=1e-3)
    assert lr_factor(256, 256.0, 64, default_lr_rule(sgd=True)) == \
        pytest.approx(256 / 64 * 320 / 512)
    assert lr_factor(256, 256.0, 64, default_lr_rule(sgd=False)) == pytest.approx(2.0)
    assert lr_factor(256, 256.0, 64, "sqrt-gain") == pytest.approx(math.sqrt(2.5))
    # the square-root rule ignores the noise scale; none leaves the rate as it is
    assert lr_factor(256, 256.0, 64, "sqrt-batch") == pytest.approx(2.0)
    assert lr_factor(256, 1e9, 64, "sqrt-gain") == pytest.approx(2.0, rel=1e-6)
    assert lr_factor(256, 256.0, 64, "none") == 1.0


def test_candidates_span_the_range_geometrically_and_hold_the_current_batch():
    c = candidates(64, 1024, 100)
    assert c[0] == 64 and c[-1] == 1024 and 100 in c and 128 in c and 512 in c
    assert len(c) == 18          # 4 per doubling over 4 doublings, and 100
    assert candidates(96, 96, 96) == [96]


def affine(fixed_s: float, per_sample_s: float):
    return lambda b: fixed_s + per_sample_s * b


FAR = float("inf")   # a chooser that may jump anywhere in its range at once


def test_a_fixed_cost_per_step_and_a_large_noise_scale_grow_the_batch():
    step = affine(0.010, 1e-5)       # 10 ms a step, 0.01 ms a sample: B=64 wastes the step
    best = max(candidates(64, 2048, 64), key=lambda b: b / step(b) * efficiency(b, 4000, 64))
    assert best > 512
    choice = BatchChooser(64, 2048, 64, reach=FAR).choose(64, 4000.0, step)
    assert choice.changed and choice.batch == best
    assert choice.goodput == pytest.approx(best / step(best) * efficiency(best, 4000, 64))
    # by default at most four times the batch a move: the step time there is measured first
    assert BatchChooser(64, 2048, 64).choose(64, 4000.0, step).batch == 256


def test_a_small_noise_scale_or_no_fixed_cost_keeps_the_batch_small():
    chooser = BatchChooser(32, 2048, 256, reach=FAR)
    assert chooser.choose(256, 10.0, affine(0.010, 1e-5)).batch < 256   # noise-free: shrink
    # time in proportion to the batch: a larger batch only loses efficiency
    assert chooser.choose(256, 1000.0, affine(0.0, 1e-4)).batch == 32
    assert BatchChooser(32, 2048, 256).choose(256, 1000.0, affine(0.0, 1e-4)).batch == 64


def test_hysteresis_keeps_a_batch_whose_goodput_is_within_it():
    step = affine(0.010, 1e-5)
    best = BatchChooser(64, 2048, 64, reach=FAR).choose(64, 4000.0, step).batch
    near = [b for b in candidates(64, 2048, 64)
            if b != best and b / step(b) * efficiency(b, 4000, 64)
            > 0.97 * best / step(best) * efficiency(best, 4000, 64)]
    assert near   # a neighbour within 3 % of the best goodput: no move from it
    assert not BatchChooser(64, 2048, 64, hysteresis=0.05, reach=FAR).choose(
        near[0], 4000.0, step).changed
    assert BatchChooser(64, 2048, 64, hysteresis=0.0, reach=FAR).choose(
        near[0], 4000.0, step).changed


def test_batches_the_world_cannot_run_are_never_chosen():
    step = lambda b: None if b > 300 else 0.010 + 1e-5 * b   # noqa: E731  e.g. over the caps
    choice = BatchChooser(64, 2048, 64, reach=FAR).choose(64, 4000.0, step)
    assert choice.changed and 256 <= choice.batch <= 300


def test_no_batch_worth_less_than_half_a_sample_of_b0():
    """Steps of fixed cost make 2048 the goodput's best even at B_noise 100 (E = 0.09), but
    E(B) >= 0.5 holds the batch at B <= B_noise + 2 B_0 = 228 -- and a batch above that (the
    noise scale fell) moves down at once, with no hysteresis to clear."""
    step = lambda b: 0.010   # noqa: E731
    up = BatchChooser(64, 2048, 64, reach=FAR).choose(64, 100.0, step)
    assert up.changed and up.batch <= 228 and up.efficiency >= 0.5
    assert BatchChooser(64, 2048, 64, reach=FAR, min_efficiency=0).choose(
        64, 100.0, step).batch == 2048
    down = BatchChooser(64, 2048, 64, reach=2).choose(512, 100.0, step)
    assert down.changed and down.batch == 256   # none within reach is worth 0.5: the nearest
    # the current batch unscored (no step time known there) and none worth it: the best
    # runnable one, never one without a step time
    runnable = lambda b: 0.010 if b == 362 else None   # noqa: E731
    stuck = BatchChooser(64, 2048, 64, reach=2).choose(512, 100.0, runnable)
    assert stuck.batch == 362 and stuck.changed
    assert not BatchChooser(64, 2048, 64, reach=2).choose(512, 100.0, lambda b: None).changed
    larger = lambda b: 0.010 if b == 724 else None   # noqa: E731  only a less efficient one
    assert not BatchChooser(64, 2048, 64, reach=2).choose(512, 100.0, larger).changed


def test_a_move_must_pay_at_the_cautious_end_of_the_noise_scales_interval():
    """Up where the point estimate says so, but not if the low end of B_noise's interval
    says it does not pay; down likewise at the high end (an unbounded one never shrinks the
    batch on goodput); a narrow interval moves as the point estimate does."""
    step = affine(0.010, 1e-5)
    chooser = BatchChooser(64, 2048, 64)
    assert chooser.choose(64, 4000.0, step, (3000.0, 5000.0)).batch == 256
    held = chooser.choose(64, 4000.0, step, (10.0, 5000.0))
    assert not held.changed and held.batch == 64
    assert chooser.choose(64, 4000.0, step).changed   # without the interval: up
    proportional = affine(0.0, 1e-4)                 # a larger batch only loses efficiency
    assert chooser.choose(256, 1000.0, proportional, (900.0, 1100.0)).batch == 64
    assert not chooser.choose(256, 1000.0, proportional, (900.0, math.inf)).changed
    # a batch not worth its samples leaves at once, unless the high end says it is
    flat = lambda b: 0.010   # noqa: E731
    assert chooser.choose(512, 100.0, flat, (80.0, 120.0)).batch == 215   # E >= 0.5 again
    assert not chooser.choose(512, 100.0, flat, (80.0, 2000.0)).changed


def test_without_a_point_estimate_the_chooser_goes_by_the_intervals_low_end():
    """A smoothed |G|^2 at or below 0 leaves the row only the interval's low end: the batch
    moves up if that end says it pays, never down (the upper end is unbounded); with no
    interval, no decision."""
    from hetgrad.adapt import _noise
    assert _noise({"b_noise_smoothed": None, "b_noise_interval": [3000.0, None]}) == \
        (3000.0, (3000.0, math.inf))
    assert _noise({"b_noise_smoothed": 500.0, "b_noise_interval": [400.0, 700.0]}) == \
        (500.0, (400.0, 700.0))
    assert _noise({"b_noise_smoothed": None, "b_noise_interval": None}) == (None, None)
    assert _noise({"b_noise_smoothed": -4.0, "b_noise_interval": None}) == (None, None)  # S < 0
    assert _noise({"b_noise_smoothed": None, "b_noise_interval": [-0.0, None]}) == (None, None)
    chooser, step = BatchChooser(64, 2048, 64), affine(0.010, 1e-5)
    b_noise, interval = _noise({"b_noise_smoothed": None, "b_noise_interval": [3000.0, None]})
    assert chooser.choose(64, b_noise, step, interval).batch > 64
    b_noise, interval = _noise({"b_noise_smoothed": None, "b_noise_interval": [10.0, None]})
    assert not chooser.choose(256, b_noise, step, interval).changed


@pytest.mark.parametrize("given, problem", [
    ((64,), "two batch sizes"), (("a", 2), "two batch sizes"), ((512, 64), "LO <= HI"),
    ((128, 512), "outside 128,512")])
def test_a_bad_range_is_named(given, problem):
    with pytest.raises(ConfigError, match=problem) as err:
        check_range(given, 96)
    assert err.value.field == "batch_range"


def test_hk_fit_scales_the_learning_rate_inside_epochs_only(world3):
    """The rate a user's callback reads in the steps is the optimizer's times the batch's
    factor, the same through an epoch; at an epoch's end (where ReduceLROnPlateau reads and
    sets it) it is the user's own again. The first choice comes inside the first epoch, which
    the user's callbacks see as one: its first steps at B_0 and the user's rate, the rest of
    its samples at a larger batch and rate, its steps numbered on (Keras' progress bar too)."""
    from mpi.adaptive import B0, LR, N
    res = world3.run("adaptive:fit").root
    assert res["at_end"] == pytest.approx([LR] * 4)
    steps = math.ceil(N / B0)
    grid = [b for b in candidates(B0, 512, B0) if b <= 4 * B0]
    k = split_step(steps, B0, grid)
    assert 20 <= k <= steps // 4
    (first, at_b0), (rate, rest) = res["runs"][0]           # two runs of one rate each
    assert first == pytest.approx(LR) and at_b0 == k and rate > LR
    assert any(rest == math.ceil((N - k * B0) / b) for b in aligned(k * B0, grid) if b > B0)
    assert all(len(runs) == 1 for runs in res["runs"][1:]), res["runs"]
    # its steps numbered on: 0 .. k + rest - 1, which params and Keras' bar end at
    assert res["indices"][0] == list(range(k + rest))
    assert res["told"][0] == res["bar"][0] == k + rest
    assert res["told"][1] == res["bar"][1] == len(res["indices"][1]) == res["steps"][1]
    # hk.fit's bar (verbose=1) is mid-line at the split: the choice's line starts a new one
    said = [line for line in res["printed"].split("\n") if "hetgrad: global batch" in line]
    assert said and said[0].startswith(f"hetgrad: global batch {B0} -> "), res["printed"]
    before = res["printed"].split("hetgrad: global batch")[0]
    assert f"/{steps}" in before.split("\n")[-2]   # on the line the bar was drawing


@pytest.fixture(scope="module")
def adapted(world3, tmp_path_factory):
    """``hetgrad train --adaptive-batch`` from B = 24 in 24..384 on 3 ranks for 4 epochs with
    checkpoints, then resumed for a 5th."""
    d = tmp_path_factory.mktemp("adaptive")
    common = dict(data="digits", global_batch=24, adaptive_batch=True, batch_range=[24, 384],
                  lr=0.05, quiet=True, probe_steps=2, checkpoint_dir=str(d / "ck"))
    first = world3.run("training:train", epochs=4, out=str(d / "a.json"), **common).root
    state = json.loads((d / "ck" / "state.json").read_text())
    resumed = world3.run("training:train", epochs=5, resume=str(d / "ck"),
                         out=str(d / "b.json"), **common).root
    again = json.loads((d / "ck" / "state.json").read_text())   # saved by the resumed run
    return first, state, resumed, again


def test_the_batch_follows_goodput_and_the_rate_follows_the_batch(adapted):
    first = adapted[0]
    rows, balance = first["epochs"], first["balance"]
    assert "batch_next" in rows[0]        # decided on the probe's models (no time measured)
    assert any(r.get("batch_changed") for r in rows), rows
    batch, factor = 24, 1.0
    for row, split in zip(rows, balance):
        assert row["global_batch"] == batch == sum(split["batches"])   # the epoch's plan
        # SGD: the rate is the user's times AdaScale's gain at the batch last chosen
        assert row["lr_factor"] == pytest.approx(factor, rel=1e-6)
        assert row["lr"] == pytest.approx(0.05 * factor, rel=1e-5)
        if "batch_next" in row:
            assert 24 <= row["batch_next"] <= 4 * batch     # at most 4x the batch a move
            assert row["batch_changed"] == (row["batch_next"] != batch)
            assert 0 < row["efficiency"] <= 1 and row["goodput_predicted"] > 0
            batch = row["batch_next"]
            factor = gain(batch, row["b_noise_smoothed"], 24)


def test_another_learning_rate_rule_is_followed(world3, tmp_path):
    """``--lr-rule sqrt-batch``: the rate follows sqrt(B / B_0), whatever the noise scale."""
    rec = world3.run("training:train", data="digits", global_batch=24, adaptive_batch=True,
                     batch_range=[24, 384], lr=0.05, quiet=True, probe_steps=2, epochs=3,
                     lr_rule="sqrt-batch", out=str(tmp_path / "r.json")).root
    rows = rec["epochs"]
    assert any(r.get("batch_changed") for r in rows), rows
    for before, row in zip(rows, rows[1:]):
        assert row["lr_factor"] == pytest.approx(math.sqrt(before["batch_next"] / 24))
        assert row["lr"] == pytest.approx(0.05 * row["lr_factor"], rel=1e-5)


def test_a_resumed_run_goes_on_with_the_chosen_batch_and_rate(adapted):
    first, state, resumed, again = adapted
    decided = [r for r in first["epochs"] if "batch_next" in r][-1]
    chosen = decided["batch_next"]
    assert state["plan"]["global_batch"] == chosen
    factor = gain(chosen, decided["b_noise_smoothed"], 24)
    assert state["adaptive"]["lr_factor"] == pytest.approx(factor, rel=1e-6)
    row = resumed["epochs"][-1]
    assert row["epoch"] == 5 and row["global_batch"] == chosen
    assert row["lr_factor"] == pytest.approx(factor, rel=1e-6)
    assert "batch_next" not in row          # the last epoch decides nothing
    # its checkpoint keeps them for a resume after that one
    assert again["epoch"] == 5 and again["plan"]["global_batch"] == chosen
    assert again["adaptive"] == {"lr_factor": pytest.approx(factor, rel=1e-6), "b0": 24,
                                 "chosen": True}


def test_hk_fit_gives_the_users_rate_back_when_an_epoch_raises(world3):
    """A user's callback raises in the last epoch, whose steps ran at a scaled rate: the
    optimizer holds the user's own rate afterwards (what a handler would save)."""
    from mpi.adaptive import LR
    res = world3.run("adaptive:fit", fail=True).root
    assert res["raised"] == "a user's callback failed"
    assert res["inside"][-1] and res["inside"][-1][0] > LR * 1.01, res   # scaled when it raised
    assert res["lr_after"] == pytest.approx(LR)


def test_the_users_rate_is_back_when_an_epoch_raises():
    """Scaled from an epoch's first step; an epoch that raises (the loop calls on_error) leaves
    the user's own rate in the optimizer, for what a handler saves."""
    from types import SimpleNamespace

    from hetgrad import compat
    from hetgrad.adapt import AdaptiveBatch
    optimizer = compat.keras.optimizers.SGD(0.1)
    action = AdaptiveBatch(BatchChooser(10, 40, 10), rebalancer=None, lr_rule="gain", verbose=False,
                           saved={"lr_factor": 2.0})
    job = SimpleNamespace(optimizer=optimizer)
    (rate,) = action.callbacks(job)
    rate.on_train_batch_begin(0)
    assert compat.learning_rate(optimizer) == pytest.approx(0.2)
    action.on_error(job)
    assert compat.learning_rate(optimizer) == pytest.approx(0.1)


def test_from_the_first_choice_on_up_to_a_step_in_four_is_measured_unless_the_user_said():
    """A fit's begin sets the rate of its steps: once the first choice was made (a resumed
    run knows from the checkpoint's state) one step in up to 4, as long as the epoch still
    measures 64 (every_for); every step before it, whatever the epoch (a first epoch too
    short to split decides at its end); the user's own ``gns_every`` (``then_every`` None)
    is left as set."""
    from types import SimpleNamespace

    import tensorflow as tf
    from hetgrad.adapt import AdaptiveBatch
    cases = [({"chosen": True}, 4, 1000, 4), ({"chosen": True}, 4, 200, 3),
             ({"chosen": True}, 4, 100, 1), (None, 4, 1000, 1), ({"chosen": False}, 4, 1000, 1),
             ({"chosen": True}, None, 1000, 1)]
    for saved, then, steps, want in cases:
        noise = SimpleNamespace(every=tf.Variable(1, dtype=tf.int64))
        job = SimpleNamespace(aggregation=SimpleNamespace(noise=noise),
                              checkpointer=SimpleNamespace(state={}),
                              plan=SimpleNamespace(steps_per_epoch=steps),
                              progress=SimpleNamespace(first_step=0))
        action = AdaptiveBatch(BatchChooser(10, 40, 10), rebalancer=None, lr_rule="gain",
                               verbose=False, saved=saved, then_every=then)
        action.on_epoch_begin(job, 1)
        assert int(noise.every) == want, (saved, then, steps)
        assert job.checkpointer.state["adaptive"]["chosen"] == bool(saved and saved["chosen"])


def test_one_rank_is_refused_before_tensorflow():
    from hetgrad.config import TrainConfig
    from hetgrad.validate import check_flags
    with pytest.raises(ConfigError, match="needs 2 or more ranks") as err:
        check_flags(TrainConfig(adaptive_batch=True), world_size=1)
    assert err.value.field == "adaptive_batch"
    check_flags(TrainConfig(adaptive_batch=True), world_size=2)


def test_the_rule_in_effect_is_what_a_resume_compares():
    """A default rule and its name resume alike; another rule is refused, naming the flag."""
    from hetgrad.config import TrainConfig
    from hetgrad.errors import InputFileError
    from hetgrad.validate import check_resumed, job_identity
    sgd = job_identity(TrainConfig(adaptive_batch=True))
    assert sgd["lr_rule"] == "gain" == job_identity(
        TrainConfig(adaptive_batch=True, lr_rule="gain"))["lr_rule"]
    assert job_identity(TrainConfig(adaptive_batch=True, optimizer="adam"))["lr_rule"] == \
        "sqrt-batch"
    state = {"plan": {"global_batch": 96, "dataset_size": 1437}, "epoch": 1, "job": sgd}
    check_resumed(state, "ck", sgd, global_batch=96, n_train=1437, epochs=2,
                  batch_range=(96, 1536))
    other = job_identity(TrainConfig(adaptive_batch=True, lr_rule="sqrt-gain"))
    with pytest.raises(InputFileError) as err:
        check_resumed(state, "ck", other, global_batch=96, n_train=1437, epochs=2,
                      batch_range=(96, 1536))
    assert err.value.field == "lr_rule" and "'gain'" in str(err.value)


def test_hk_fit_checks_its_rule_before_any_work():
    import numpy as np

    from hetgrad import compat
    from hetgrad.comm import LocalComm
    from hetgrad.errors import HetgradError
    from hetgrad.keras.fitting import _checked
    model = compat.keras.Sequential([compat.keras.Input((3,)), compat.keras.layers.Dense(2)])
    model.compile(optimizer=compat.keras.optimizers.Adam(0.01), loss="mse")
    x, y = np.zeros((40, 3), np.float32), np.zeros((40, 2), np.float32)
    args = (LocalComm(), model, x, y, 8, 1, None)
    assert _checked(*args, (8, 32), None)[1:] == ((8, 32), "sqrt-batch")
    assert _checked(*args, (8, 32), "none")[2] == "none"
    for adaptive, rule, says in [((8, 32), "linear", "unknown lr rule 'linear'"),
                                 (None, "gain", "does nothing without adaptive_batch")]:
        with pytest.raises(HetgradError) as err:
            _checked(*args, adaptive, rule)
        assert err.value.field == "lr_rule" and says in str(err.value)


def test_a_split_epoch_stopped_in_its_rest_and_resumed_trains_every_sample_once(
        world3, tmp_path):
    """hk.fit's first epoch chooses after k steps at B_0, is asked to stop 3 steps into its
    rest (under the new plan), and is resumed: over the ranks and both processes, every
    sample trained exactly once, and the user's callback saw the epoch's steps numbered on
    from 0 to its end, once each."""
    from mpi.adaptive import B0, N
    r = world3.run("adaptive:ids_split", str(tmp_path / "ck"))
    assert sorted(sum((v["ids"] for v in r.values), [])) == list(range(N))
    stop, k = r.root["stopped"], r.root["k"]
    assert stop["epoch"] == 0 and stop["batch"] > B0, stop     # in the rest, at the new batch
    assert stop["step"] * stop["batch"] > k * B0                 # past where the rest began
    # the user's callbacks count the epoch's steps on, across the resume too
    before, after = r.root["counted"]
    assert before["indices"] + after["indices"] == list(range(after["told"]))
    assert before["told"] == after["told"] and before["indices"][k - 1:k + 1] == [k - 1, k]


def test_aligned_batches_go_on_where_the_order_stands():
    grid = candidates(100, 800, 100)
    got = aligned(2800, grid)
    assert got == [100, 140, 175, 200, 280, 350, 400, 560, 700]
    assert all(2800 % b == 0 and any(abs(b - c) <= 0.05 * c for c in grid) for b in got)
    assert aligned(2801, [100, 200]) == []                 # a prime-ish count: none


def test_the_first_choice_comes_early_in_a_long_enough_first_epoch():
    grid = [b for b in candidates(100, 800, 100) if b <= 400]
    k = split_step(250, 100, grid)
    assert 25 <= k <= 50                      # after 10 % of the epoch, at most twice that
    best = max(len(aligned(j * 100, grid)) for j in range(25, 51))
    assert len(aligned(k * 100, grid)) == best
    assert split_step(60, 24, grid) == 0      # too short: the decision after the epoch


def test_hetgrad_train_chooses_inside_its_first_epoch(world3, tmp_path):
    """The first epoch (90 steps at B_0 = 16) stops after k steps, chooses, and goes on
    with the rest of its samples at the new batch: one row, every sample once; every step
    measured (after the choice too: epochs this short need every one)."""
    rec = world3.run("training:train", data="digits", global_batch=16, adaptive_batch=True,
                     batch_range=[16, 256], lr=0.05, quiet=True, probe_steps=2, epochs=2,
                     out=str(tmp_path / "r.json")).root
    rows = rec["epochs"]
    assert [r["epoch"] for r in rows] == [1, 2]
    part, row = rows[0]["split"], rows[0]
    k, b = part["split_at_step"], part["batch_next"]
    assert part["global_batch"] == 16 and part["batch_changed"] and b > 16
    assert (k * 16) % b == 0 and row["global_batch"] == b == rows[1]["global_batch"]
    assert row["time_s"] > part["time_s"] and "test_accuracy" in row
    n = rec["plan"]["dataset_size"]
    assert part["gns_steps"] == k                       # the first fit's steps, each once
    assert row["gns_steps"] == math.ceil((n - k * 16) / b), (n, k, b)  # the rest, each once
    assert part["gns_every"] == row["gns_every"] == rows[1]["gns_every"] == 1
    assert row["lr_factor"] > 1 and rows[1]["lr_factor"] == pytest.approx(row["lr_factor"])

