"""Bad input: a clear one-line error naming the flag, non-zero exit, no hung ranks."""
import json
import subprocess
import sys
import time

import pytest

from conftest import FAST_ABORT, hetgrad_mpi


def hetgrad(*args):
    return subprocess.run([sys.executable, "-m", "hetgrad.cli", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("speeds,needle", [
    ("1,0,2", "--speeds: speed of rank 1 is 0.0"),
    ("1,-2", "--speeds: speed of rank 1 is -2.0"),
    ("nan,1", "--speeds: speed of rank 0 is nan"),
    ("1,x", "--speeds: expected comma-separated numbers"),
])
def test_plan_bad_speeds(speeds, needle):
    p = hetgrad("plan", "--speeds", speeds, "-B", "64", "--dataset-size", "1000")
    assert p.returncode == 2 and needle in p.stderr, p.stderr


def test_plan_batch_too_small_and_data_too_small():
    p = hetgrad("plan", "--speeds", "1,1,1", "-B", "4", "--min-batch", "2", "--dataset-size", "99")
    assert p.returncode == 2 and "--global-batch: global batch 4 < 3 ranks x min batch 2" in p.stderr
    p = hetgrad("plan", "--speeds", "1,1", "-B", "64", "--dataset-size", "10")
    assert p.returncode == 2 and "--global-batch: dataset has 10 samples" in p.stderr


def test_plan_cli_writes_json(tmp_path):
    out = tmp_path / "plan.json"
    p = hetgrad("plan", "--speeds", "1,2,4", "-B", "96", "--data", "digits", "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert json.loads(out.read_text())["batches"] == [14, 27, 55]


def test_train_plan_for_other_rank_count(tmp_path):
    plan = tmp_path / "plan3.json"
    assert hetgrad("plan", "--speeds", "1,2,4", "-B", "96", "--data", "digits",
                   "--out", str(plan)).returncode == 0
    t0 = time.time()
    p = hetgrad_mpi(2, ["train", "--plan", str(plan), "--epochs", "1", "--out",
                        str(tmp_path / "r.json")], timeout=200, env_update=FAST_ABORT)
    assert p.returncode != 0
    assert "--plan: plan file" in p.stderr and "is for 3 ranks but this job has 2" in p.stderr
    assert time.time() - t0 < 120


def test_train_unreadable_npz(tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_text("garbage")
    p = hetgrad_mpi(2, ["train", "--data", str(bad), "--epochs", "1",
                        "--out", str(tmp_path / "r.json")], timeout=200, env_update=FAST_ABORT)
    assert p.returncode != 0
    assert "--data: cannot read" in p.stderr and "bad.npz" in p.stderr
