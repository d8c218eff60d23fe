"""`hetgrad train` on 3 real ranks with emulated unequal speeds, end to end."""
import math

import numpy as np

import pytest

from conftest import hetgrad_mpi, read_json


def test_three_rank_weighted_training_on_digits(tmp_path):
    out = tmp_path / "run.json"
    proc = hetgrad_mpi(3, ["train", "--emulate-speeds", "1,2,4", "--emulate-unit", "2e-3",
                           "--epochs", "8", "--out", str(out)], timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rec = read_json(out)
    plan = rec["plan"]
    assert sum(plan["batches"]) == plan["global_batch"] == 96
    steps = [math.ceil(n / b) for n, b in zip(plan["shard_sizes"], plan["batches"])]
    assert steps == [plan["steps_per_epoch"]] * 3
    # the probe measured the emulated speeds (it never reads the flag): ranks ordered 1 < 2 < 4
    sps = [p["samples_per_s"] for p in rec["probe"]]
    assert sps[0] < sps[1] < sps[2], sps
    assert 1.3 < sps[2] / sps[0] < 8, sps
    assert plan["batches"][0] < plan["batches"][1] < plan["batches"][2]
    assert len(rec["epochs"]) == 8
    assert rec["final_test_accuracy"] >= 0.90, rec["epochs"][-1]
    # progress lines come from rank 0 only: one line per epoch
    assert proc.stdout.count("epoch   8/8") == 1, proc.stdout


def test_equal_and_uneven_avg_modes_run(world2, tmp_path):
    for mode in ("equal", "uneven-avg"):
        speeds = {} if mode == "equal" else {"speeds": [1, 3]}  # equal mode plans nothing
        rec = world2.run("training:train", mode=mode, epochs=2, quiet=True, probe_steps=1,
                         out=str(tmp_path / f"{mode}.json"), **speeds).root
        expect = [48, 48] if mode == "equal" else [24, 72]
        assert rec["plan"]["batches"] == expect
        assert 0.0 < rec["final_test_accuracy"] <= 1.0


def test_steps_per_execution_trains_the_same_model(world2, tmp_path):
    """--steps-per-execution 4 (15 steps an epoch: calls of 4, 4, 4 and 3, the last step
    partial) gives one step per call's losses and test scores: the same weights."""
    recs = {k: world2.run("training:train", speeds=[1, 3], epochs=2, quiet=True, probe_steps=1,
                          steps_per_execution=k, out=str(tmp_path / f"spe{k}.json")).root
            for k in (1, 4)}
    assert recs[4]["config"]["steps_per_execution"] == 4
    assert recs[4]["plan"]["steps_per_epoch"] == 15
    # the probe ran training's step at one per call: with 4 per call the first epoch traces
    # the step anew and only warms up; with 1 it is measured (hetgrad.actions.Balance)
    assert [[e["warmup"] for e in recs[k]["balance"]] for k in (1, 4)] == [[False, False],
                                                                         [True, False]]
    for one, four in zip(recs[1]["epochs"], recs[4]["epochs"], strict=True):
        for key in ("loss", "test_loss", "test_accuracy"):
            assert four[key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), key


def test_tensorflow_start_up_lines_only_with_verbose(tmp_path):
    """Nothing in the environment quiets TF here: hetgrad itself must (and --verbose undo it)."""
    quiet_env = {"TF_CPP_MIN_LOG_LEVEL": None, "HETGRAD_VERBOSE": None}
    outputs = {}
    for flags in ([], ["--verbose"]):
        proc = hetgrad_mpi(2, [*flags, "train", "--speeds", "1,1", "--epochs", "1", "--quiet",
                               "--probe-steps", "1",
                               "--out", str(tmp_path / "r.json")], env_update=quiet_env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        outputs[bool(flags)] = proc.stdout + proc.stderr
    assert "cpu_feature_guard" not in outputs[False] and "absl" not in outputs[False]
    assert "UserWarning" not in outputs[False], outputs[False][-2000:]
    assert "cpu_feature_guard" in outputs[True] or "oneDNN" in outputs[True]


def test_regression_and_one_hot_losses_train(world2, tmp_path):
    """--loss mse on float targets (two per sample: two outputs, no class check, mean absolute
    error reported), and a categorical loss on integer labels (one-hot rows for the loss)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 8)).astype(np.float32)
    y = (x @ rng.normal(size=(8, 2))).astype(np.float32)
    npz = tmp_path / "values.npz"
    np.savez(npz, x_train=x[:500], y_train=y[:500], x_test=x[500:], y_test=y[500:])
    common = dict(speeds=[1, 3], quiet=True, probe_steps=1, global_batch=64)
    reg = world2.run("training:train", data=str(npz), loss="mse", epochs=6, lr=0.01,
                     out=str(tmp_path / "mse.json"), **common).root
    maes = [e["test_mae"] for e in reg["epochs"]]
    assert maes[-1] < 0.5 * maes[0], maes
    assert reg["final_test_mae"] == maes[-1] and reg["best_test_mae"] == min(maes)
    assert "final_test_accuracy" not in reg
    hinge = world2.run("training:train", loss="categorical_hinge", epochs=4,
                       out=str(tmp_path / "hinge.json"), **common).root
    assert hinge["final_test_accuracy"] > 0.8, hinge["epochs"][-1]
