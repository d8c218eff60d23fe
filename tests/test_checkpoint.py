"""Checkpoint/resume: stop after epoch 2, resume to 4 == a straight 4-epoch run (2 real ranks),
dense and sparse."""
import json

import numpy as np
import pytest

from observed import assert_observed


# sparse: the residuals and selection history of every rank are checkpointed too
@pytest.mark.parametrize("extra", [{}, {"sparsify": "recent", "density": 0.05}],
                         ids=["dense", "sparse"])
def test_resume_matches_uninterrupted_run(world2, tmp_path, extra):
    common = dict(speeds=[1, 2], quiet=True, seed=3, probe_steps=1, **extra)
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    # the straight run observed: its scalars and timeline written, no weight changed by it
    world2.run("training:train", epochs=4, checkpoint_dir=str(straight),
               out=str(tmp_path / "a.json"), tensorboard=str(tmp_path / "tb"),
               timeline=str(tmp_path / "timeline.json"), **common)
    seen = assert_observed(tmp_path / "tb", tmp_path / "timeline.json", ranks=2, epochs=4)
    if extra:
        assert [v for _, v in seen["scalars"][""]["epoch/density"]] == pytest.approx([0.05] * 4)
    world2.run("training:train", epochs=2, checkpoint_dir=str(interrupted),
               out=str(tmp_path / "b1.json"), **common)
    state = json.loads((interrupted / "state.json").read_text())
    assert state["epoch"] == 2 and (interrupted / state["checkpoint"]).is_dir()
    ranks = sorted(f.name for f in (interrupted / state["checkpoint"]).glob("rank-*.npz"))
    assert ranks == (["rank-0.npz", "rank-1.npz"] if extra else [])
    assert sum(state["plan"]["batches"]) == 96
    resumed = world2.run("training:train", epochs=4, resume=str(interrupted),
                         out=str(tmp_path / "b2.json"), **common).root
    assert [e["epoch"] for e in resumed["epochs"]] == [3, 4]
    a = np.load(straight / "final_weights.npz")
    b = np.load(interrupted / "final_weights.npz")
    assert a.files == b.files and len(a.files) == 6
    moved = max(float(np.max(np.abs(a[k]))) for k in a.files)
    assert moved > 0.01
    assert max(float(np.max(np.abs(a[k] - b[k]))) for k in a.files) < 1e-6
