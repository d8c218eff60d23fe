"""Data at scale's promise on real ranks (tests/mpi/global_order.py): one global order of
samples per epoch that no world size, plan or re-plan changes -- so one process, uneven
ranks, a re-plan mid-epoch and a checkpoint resumed on more ranks all end with the same
weights (SGD, no BatchNorm or dropout: up to float summation order)."""
import numpy as np

N = 200


def test_one_process_uneven_ranks_and_a_mid_epoch_replan_agree(world3):
    r = world3.run("global_order:same_weights").root
    assert r["moved"] > 0.05, r                       # training really moved the weights
    assert r["uneven"] < 1e-5 and r["switched"] < 1e-5, r


def test_a_final_step_smaller_than_the_world_is_trained_exactly(world3):
    r = world3.run("global_order:tiny_tail")
    assert sorted(r.root["lasts"]) == [0, 1, 1], r.root
    assert r.root["vs_one_process"] < 1e-5, r.root
    for rank in r.values:     # BatchNormalization's empty batch left nothing NaN anywhere
        assert rank["bn_finite"] and np.all(np.isfinite(rank["losses"])), r.values


def test_every_sample_once_an_epoch_on_uneven_ranks(world3):
    ranks = world3.run("global_order:ids_per_epoch").values
    epochs = [sum((r[e] for r in ranks), []) for e in (0, 1)]
    for ids in epochs:
        assert sorted(ids) == list(range(N))
    assert epochs[0] != epochs[1]                     # a new order every epoch


def test_a_checkpoint_of_two_ranks_resumes_on_three(world2, world3, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    first = world2.run("global_order:resumed_on", ckpt, 1).root   # nothing saved: from scratch
    assert first["epochs"] == [0] and first["vs_one_process"] < 1e-5
    resumed = world3.run("global_order:resumed_on", ckpt, 3, 11)
    assert resumed.root["epochs"] == [1, 2], resumed.root
    assert resumed.root["vs_one_process"] < 1e-5, resumed.root
    assert "resuming a 2-rank checkpoint on 3 ranks" in resumed.stderr[0]


def test_stopped_mid_epoch_and_resumed_is_bit_identical(world3, tmp_path):
    """A stop request reaching one rank after step 4 of epoch 2: every rank stops there
    together, saves, exits 75; the resumed run ends exactly where the straight one does."""
    r = world3.run("global_order:stopped_and_resumed", str(tmp_path / "ckpt"), 3, 1, 4).root
    assert (r["exit"], r["epoch"], r["step"], r["checkpoint"]) == (75, 1, 4, "ckpt-1-4"), r
    assert r["resumed_epochs"] == [1, 2], r
    assert r["vs_straight"] == 0.0, r
    assert r["vs_one_process"] < 1e-5, r


def test_a_learning_rate_warm_up_resumes_mid_epoch_bit_identically(world3, tmp_path):
    """The user's per-step LR callback sees the resumed epoch's steps where they are."""
    r = world3.run("global_order:stopped_and_resumed", str(tmp_path / "ckpt"), 3, 1, 4,
                   warmup=True).root
    assert (r["exit"], r["step"]) == (75, 4) and r["vs_straight"] == 0.0, r


def test_stopped_mid_epoch_on_two_ranks_resumes_on_three(world2, world3, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    stop = world2.run("global_order:stopped_in_epoch", ckpt, 3, 1, 6).root
    assert (stop["exit"], stop["epoch"], stop["step"]) == (75, 1, 6), stop
    resumed = world3.run("global_order:resumed_on", ckpt, 3, 11)
    assert resumed.root["epochs"] == [1, 2], resumed.root
    assert resumed.root["vs_one_process"] < 1e-5, resumed.root


def test_hk_fit_refuses_to_resume_with_another_setting(world2, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    world2.run("global_order:resumed_on", ckpt, 1)
    errors = world2.run("global_order:refused_resume", ckpt).values
    assert all("seed: the checkpoint's job had 5, this job asks for 6" in e for e in errors), \
        errors
    assert np.all([isinstance(e, str) for e in errors])


def test_hetgrad_train_drops_the_tail_only_when_asked(world2, tmp_path):
    common = dict(speeds=[1, 2], quiet=True, seed=3, epochs=1, global_batch=100)
    kept = world2.run("training:train", out=str(tmp_path / "a.json"), **common).root["plan"]
    dropped = world2.run("training:train", out=str(tmp_path / "b.json"), drop_remainder=True,
                         **common).root["plan"]
    n = kept["dataset_size"]
    assert n % 100 and kept["dropped"] == 0 and kept["steps_per_epoch"] == n // 100 + 1
    assert dropped["dropped"] == n % 100 and dropped["steps_per_epoch"] == n // 100
