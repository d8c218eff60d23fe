"""The library path for a user's own model and data (hetgrad.init, hk.probe,
hetgrad.make_plan, hk.shard), on 3 real ranks, and its errors."""
import numpy as np
import pytest
import tensorflow as tf

import hetgrad
import hetgrad.keras as hk
from hetgrad.errors import HetgradError


def test_ranks_waiting_in_the_probes_gather_leave_the_cores_to_the_others(world3):
    res = world3.run("library:idle_wait").values
    assert [r["got"] for r in res] == [[(0, 100_000), (1, 100_000), (2, 100_000)]] * 3
    for r in res[1:]:   # waited about the second rank 0 slept, almost all of it off the core
        assert r["wall_s"] > 0.8 and r["cpu_s"] < 0.1 * r["wall_s"], res


def test_probe_plan_shard_on_three_ranks(world3):
    run = world3.run("library:run")
    res = run.root
    # rank 0, capped at 2 samples, times its one size three times and says it once
    assert "timing batch sizes [2] (rank 0's)" in run.stdout[0], run.stdout[0]
    for name in ("regression", "two_input", "hetgrad_optimizer"):
        r = res[name]
        assert r["same_state"], name       # weights and optimizer slots untouched
        assert r["ranks"] == [0, 1, 2] and r["positive"], r
        assert r["batches"] == [[2, 7, 24]] * 3, r  # geometric from B / (4 P) = 2 to B = 24
        # then each rank timed once at its batch of the plan, its model scaled through it
        assert [len(b) for b in r["refined_at"]] == [1, 1, 1], r
        assert sum(b for (b,) in r["refined_at"]) == 24 and r["through_point"], r
    assert res["capped_sizes"] == [1, 3, 3], res["capped_sizes"]   # one point, timed 3 times
    assert sum(res["probe_plan"]) == 24
    assert res["tf_data_probe"] == [[0, 3], [1, 3], [2, 3]], res["tf_data_probe"]  # a tf.data set
    assert res["plan"] == {"batches": [3, 7, 14], "last": [1, 1, 2]}  # 4 full steps + 4
    # a whole epoch with the partial final step equals one process on the global batches
    assert res["exact_err"] < 1e-6, res
    assert res["avg_diff"] > 1e-3, res   # Horovod's plain average gives other weights
    assert res["weights_agree"]
    # the aggregation counts the traces of its step (an epoch's warm-up, hetgrad.actions):
    # the first fit's, none in a second fit of the same step
    assert res["traces"][0] == 0 < res["traces"][1] == res["traces"][2], res["traces"]


def plan2():
    return hetgrad.make_plan([1, 1], 8, 20)


def test_shard_errors_name_the_argument():
    x, y = np.zeros((20, 2), np.float32), np.zeros(20)
    with pytest.raises(HetgradError, match="plan: the plan is for 2 ranks, this job has 1"):
        hk.shard(x, y, plan2())
    with pytest.raises(HetgradError, match=r"x: inputs and targets differ in length"):
        hk.shard(x, y[:19], plan2(), rank=0)
    with pytest.raises(HetgradError, match="plan: the plan is for 20 samples, the data has 30"):
        hk.shard(np.zeros((30, 2)), np.zeros(30), plan2(), rank=0)
    endless = tf.data.Dataset.range(5).repeat()
    with pytest.raises(HetgradError, match="x: the dataset's length is infinite"):
        hk.shard(endless, None, plan2(), rank=0)
    unknown = tf.data.Dataset.range(20).filter(lambda v: v >= 0)
    with pytest.raises(HetgradError, match="x: the dataset's length is unknown"):
        hk.shard(unknown, None, plan2(), rank=0)
    with pytest.raises(HetgradError, match="plan: give the plan"):
        hk.shard(x, y)
    with pytest.raises(HetgradError, match="global_batch: dataset has 20 samples, fewer"):
        hetgrad.make_plan([1, 1], 32, 20)


def test_shard_of_a_dataset_follows_the_plan():
    """A finite tf.data.Dataset is read once; each rank gets its slice of every global batch
    (2 and 6 of 8), every sample once an epoch, the last step the tail of 6 split 1 + 5."""
    plan = hetgrad.make_plan([1, 3], 8, 22)   # batches 2 / 6, 3 steps
    assert plan.last_batches() == [1, 5]
    ds = tf.data.Dataset.range(22)
    got = [[b[0].numpy() for b in hk.shard(ds, None, plan, rank=r).take(3)] for r in (0, 1)]
    assert [len(b) for b in got[0]] == [2, 2, 1] and [len(b) for b in got[1]] == [6, 6, 5]
    assert sorted(np.concatenate(got[0] + got[1])) == list(range(22))


def test_probe_refuses_an_uncompiled_model_or_mismatched_data():
    from hetgrad.compat import keras
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    with pytest.raises(HetgradError, match="model: compile the model"):
        hk.probe(model, np.zeros((10, 2)), np.zeros(10))
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(HetgradError, match="x: inputs and targets differ in length"):
        hk.probe(model, np.zeros((10, 2)), np.zeros(9))
    with pytest.raises(HetgradError, match=r"batches: probe batches must be integers in \[1, 10\]"):
        hk.probe(model, np.zeros((10, 2)), np.zeros(10), batches=[4, 20])


def test_the_probe_traces_its_step_once_for_all_its_sizes():
    """hk.probe's batches have training's shape, the batch size unknown: its 3 sizes run one
    trace of the step (Keras traced the second size again, then relaxed the shape)."""
    from hetgrad.compat import keras

    class Traced(keras.Sequential):
        traces = 0

        def train_step(self, data):
            Traced.traces += 1   # (Python: runs when the step is traced, not when it runs)
            return super().train_step(data)

    x = np.random.default_rng(0).normal(size=(200, 5)).astype(np.float32)
    model = Traced([keras.Input((5,)), keras.layers.Dense(8, activation="tanh"),
                    keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    perf = hk.probe(model, x, x.sum(1), global_batch=24, steps=2, warmup=1)
    assert [b for b, _ in perf[0].points] == [6, 12, 24] and Traced.traces == 1
