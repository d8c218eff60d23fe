"""The examples run as a user would run them, on real ranks (a test world's), with emulated
speeds (the probe must see them: HETGRAD_EMULATE_SPEEDS slows hk.probe's and hk.fit's
steps)."""
import re

from conftest import ROOT

DIGITS = str(ROOT / "hetgrad" / "datasets" / "digits.npz")


def emulated(speeds: str) -> dict:
    return {"HETGRAD_EMULATE_SPEEDS": speeds, "HETGRAD_EMULATE_UNIT": "1e-3"}


def run_example(world, args: list[str], speeds: str) -> str:
    """``python ARGS`` on the world's ranks (what `mpirun -np N python ARGS` runs; the
    launch itself is tested by tests/test_slurm.py, which runs an example under srun):
    what the ranks printed."""
    out = "".join(world.run("user_scripts:run", *args, env=emulated(speeds)).stdout)
    assert "replicas agree: True" in out, out
    return out


def the_plan(out: str, pattern: str) -> list[int]:
    plans = re.findall(pattern, out)
    assert len(plans) == 1, out          # rank 0 only
    return [int(b) for b in plans[0].split(", ")]


def test_regression_example_on_two_ranks(world2):
    out = run_example(world2, ["examples/regression.py", "--epochs", "6"], "1,3")
    b0, b1 = the_plan(out, r"plan: batches \[([\d, ]+)\]")
    assert b0 + b1 == 256 and b0 < b1, (b0, b1)       # follows speeds 1, 3
    assert re.search(r"\], 16 steps per epoch", out)  # 4096 / 256
    first, last, mean = map(float, re.search(
        r"first epoch ([\d.]+), last epoch ([\d.]+), predicting the mean ([\d.]+)", out).groups())
    assert last < first and last < 0.5 * mean, out   # it learns


def test_cnn_example_on_a_keras_npz_on_two_ranks(world2):
    out = run_example(world2, ["examples/cnn_npz.py", DIGITS, "--epochs", "4"], "1,3")
    b0, b1 = the_plan(out, r"plan: batches \[([\d, ]+)\]")
    assert b0 + b1 == 128 and b0 < b1, (b0, b1)
    first, last, acc = map(float, re.search(
        r"first epoch ([\d.]+), last epoch ([\d.]+); test accuracy ([\d.]+)", out).groups())
    assert last < first and acc > 0.6, out            # 10 classes: chance is 0.1


def test_fit_example_on_three_ranks(world3):
    out = run_example(world3, ["examples/fit_tabular.py", "--epochs", "4"], "1,2,4")
    b = the_plan(out, r"hetgrad: plan batches \[([\d, ]+)\]")
    assert sum(b) == 256 and b[0] < b[1] < b[2], b
    first, last, acc = map(float, re.search(
        r"loss ([\d.]+) -> ([\d.]+), val accuracy ([\d.]+)", out).groups())
    assert last < first and acc > 0.6, out            # 3 classes: chance is 1/3


def test_cli_trains_a_user_model_by_import_path(world2, tmp_path):
    rec = world2.run("training:train", cwd=str(ROOT), model="examples.cnn_npz:build_model",
                     data=DIGITS, epochs=2, global_batch=64, speeds=[1, 1], quiet=True,
                     probe_steps=1,
                     out=str(tmp_path / "run.json")).root
    assert rec["config"]["model"] == "examples.cnn_npz:build_model"
    assert rec["final_test_accuracy"] > 0.5, rec["final_test_accuracy"]
