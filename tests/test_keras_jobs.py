"""A user's Keras job never corrupts a file: under hk.fit the callbacks that write files run
on rank 0 only, the others on every rank; BackupAndRestore is served by hk.fit's checkpoints;
hk.fit takes any compiled model (tests/mpi/keras_jobs.py, 2 ranks)."""
import csv

import numpy as np


def test_file_writers_run_on_rank_zero_and_the_others_everywhere(world2, tmp_path):
    res = world2.run("keras_jobs:callbacks_on_ranks", str(tmp_path)).values
    assert [r["epochs"] for r in res] == [[0, 1]] * 2   # early stopping on both ranks
    everyone = sorted((tmp_path / "everyone.txt").read_text().split("\n")[:-1])
    assert everyone == ["0 0", "0 1", "1 0", "1 1"]
    assert (tmp_path / "zero.txt").read_text() == "0 0\n0 1\n"      # rank_zero_only
    rows = list(csv.DictReader(open(tmp_path / "log.csv")))
    assert [r["epoch"] for r in rows] == ["0", "1"]                 # one writer
    from hetgrad.compat import keras
    for epoch in (1, 2):   # whole, readable files (two writers corrupted them)
        model = keras.models.load_model(tmp_path / f"ckpt-{epoch}.keras")
        assert len(model.get_weights()) == 4
    events = res[0]["events"]
    assert len(events) == 1 and events[0].startswith("tb/train/"), events   # one file a run


def test_backup_and_restore_resumes_every_rank_then_goes(world2, tmp_path):
    res = world2.run("keras_jobs:backup_and_restore", str(tmp_path)).root
    assert "state.json" in res["kept"]
    assert res["resumed_epochs"] == [2, 3] and res["deleted"]
    assert res["vs_straight"] < 1e-6


def test_hk_fit_takes_compiled_loaded_and_subclassed_models(world2, tmp_path):
    res = world2.run("keras_jobs:models_hk_fit_takes", str(tmp_path)).root
    for name in ("compiled", "loaded", "own_step"):
        loss = res[name]["loss"]
        assert len(loss) == 2 and np.isfinite(loss).all(), (name, res[name])
        assert res[f"{name}_agree"], name
