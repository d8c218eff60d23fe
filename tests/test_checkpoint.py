"""Checkpoint/resume: stop after epoch 2, resume to 4 == a straight 4-epoch run (2 real ranks),
dense and sparse."""
import json

import numpy as np
import pytest

from conftest import hetgrad_mpi


# sparse: the residuals and selection history of every rank are checkpointed too
@pytest.mark.parametrize("extra", [[], ["--sparsify", "recent", "--density", "0.05"]],
                         ids=["dense", "sparse"])
def test_resume_matches_uninterrupted_run(tmp_path, extra):
    common = ["train", "--speeds", "1,2", "--quiet", "--seed", "3", *extra]
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    p = hetgrad_mpi(2, [*common, "--epochs", "4", "--checkpoint-dir", str(straight),
                        "--out", str(tmp_path / "a.json")])
    assert p.returncode == 0, p.stderr[-3000:]
    p = hetgrad_mpi(2, [*common, "--epochs", "2", "--checkpoint-dir", str(interrupted),
                        "--out", str(tmp_path / "b1.json")])
    assert p.returncode == 0, p.stderr[-3000:]
    state = json.loads((interrupted / "state.json").read_text())
    assert state["epoch"] == 2 and (interrupted / state["checkpoint"]).is_dir()
    ranks = sorted(f.name for f in (interrupted / state["checkpoint"]).glob("rank-*.npz"))
    assert ranks == (["rank-0.npz", "rank-1.npz"] if extra else [])
    assert sum(state["plan"]["batches"]) == 96
    p = hetgrad_mpi(2, [*common, "--epochs", "4", "--resume", str(interrupted),
                        "--out", str(tmp_path / "b2.json")])
    assert p.returncode == 0, p.stderr[-3000:]
    resumed = json.loads((tmp_path / "b2.json").read_text())
    assert [e["epoch"] for e in resumed["epochs"]] == [3, 4]
    a = np.load(straight / "final_weights.npz")
    b = np.load(interrupted / "final_weights.npz")
    assert a.files == b.files and len(a.files) == 6
    moved = max(float(np.max(np.abs(a[k]))) for k in a.files)
    assert moved > 0.01
    assert max(float(np.max(np.abs(a[k] - b[k]))) for k in a.files) < 1e-6
