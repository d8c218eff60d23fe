"""hk.fit: the whole pipeline for a user's compiled model in one call, on 3 real ranks."""
import re

import numpy as np
import pytest

import hetgrad
import hetgrad.keras as hk
from hetgrad.errors import HetgradError
from observed import assert_observed


# sleeps well above a 2-core machine's noise in the probe's smallest batches (at 2e-3 the plan
# came out [5, 5, 14] about 1 run in 6)
EMULATED = {"HETGRAD_EMULATE_SPEEDS": "1,2,4", "HETGRAD_EMULATE_UNIT": "4e-3"}


def test_fit_on_three_ranks(world3, tmp_path):
    ran = world3.run("fit:run", str(tmp_path / "ckpt"), env=EMULATED)
    res = ran.root
    assert res["fit_vs_manual"] < 1e-6          # = probe-free hk.shard + DistributedOptimizer
    assert res["steps_per_execution_vs_fit"] < 1e-6
    assert res["steps_per_execution_probed"] == 3 and res["steps_per_execution_kept"] == 3
    assert res["agree"] and res["probed_agree"]
    assert res["history_keys"] == ["loss", "mae", "val_loss", "val_mae"]
    assert res["history_epochs"] == [0, 1]
    # the user's callback saw one fit of 2 epochs, not 2 fits of 1
    assert res["calls"] == {"on_train_begin": 1, "on_train_end": 1, "on_epoch_end": 2}
    assert res["epochs_param"] == 2
    assert res["early_stop_epochs"] == [0, 1]   # every rank stopped after 2 of 6 epochs
    assert res["resumed_epochs"] == [2, 3] and res["resume_err"] < 1e-6
    loss = res["probed_loss"]
    assert res["traced_before"] >= 1 and res["traced_after"] == res["traced_before"], res
    assert loss[-1] < loss[0] and loss[-1] < 0.5 * res["var_y"]
    printed = "".join(ran.stdout)
    plans = re.findall(r"hetgrad: plan batches \[(\d+), (\d+), (\d+)\]", printed)
    assert len(plans) == 1, printed                # rank 0 only, the probed run
    b = list(map(int, plans[0]))
    assert sum(b) == 24 and b[0] < b[1] < b[2], b  # follows the emulated speeds 1, 2, 4
    seen = assert_observed(f"{tmp_path / 'ckpt'}-tb", f"{tmp_path / 'ckpt'}-timeline.json",
                           ranks=3, epochs=3)
    assert seen["scalars"]["rank2"]["rank/batch"][0] == (1, b[2])   # the probed plan
    assert "optimizer/learning_rate" in seen["scalars"][""]


@pytest.mark.parametrize("per_call, pauses", [(1, [4, 4, 4, 4, 2]), (3, [12, 6])])
def test_emulated_pause_covers_every_step_of_a_call(per_call, pauses):
    """Emulated speeds sleep, before each call into the train step, for every sample the call
    trains on: one step, or ``steps_per_execution`` of them (the epoch's last call fewer)."""
    import tensorflow as tf
    from hetgrad.compat import keras
    from hetgrad.emulate import SpeedEmulator
    emulator, sizes = SpeedEmulator(1.0), [4, 4, 4, 4, 2]
    paused: list[int] = []
    emulator.pause = paused.append
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=per_call)
    data = tf.data.Dataset.from_tensor_slices((np.zeros((18, 2), np.float32),
                                               np.zeros((18, 1), np.float32))).batch(4)
    model.fit(data, epochs=1, steps_per_epoch=5, verbose=0,
              callbacks=[emulator.callback(lambda step: sizes[step])])
    assert paused == pauses


def compiled():
    from hetgrad.compat import keras
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def test_fit_errors_name_the_argument(tmp_path):
    import tensorflow as tf
    x, y = np.zeros((20, 2), np.float32), np.zeros(20, np.float32)
    from hetgrad.compat import keras
    bare = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    with pytest.raises(HetgradError, match="model: compile the model"):
        hk.fit(bare, x, y, global_batch=4, epochs=1)
    with pytest.raises(HetgradError, match="x: the dataset's length is infinite"):
        hk.fit(compiled(), tf.data.Dataset.range(3).repeat(), None, global_batch=4, epochs=1)
    with pytest.raises(HetgradError, match="x: inputs and targets differ in length"):
        hk.fit(compiled(), x, y[:19], global_batch=4, epochs=1)
    with pytest.raises(HetgradError, match="plan: the plan is for 2 ranks, this job has 1"):
        hk.fit(compiled(), x, y, global_batch=8, epochs=1, plan=hetgrad.make_plan([1, 1], 8, 20))
    with pytest.raises(HetgradError, match="plan: the plan is for a global batch of 8, not 4"):
        hk.fit(compiled(), x, y, global_batch=4, epochs=1, plan=hetgrad.make_plan([1], 8, 20))
    with pytest.raises(HetgradError, match="global_batch: dataset has 20 samples, fewer"):
        hk.fit(compiled(), x, y, global_batch=32, epochs=1)
    with pytest.raises(HetgradError, match="resume: resume needs the checkpoint_dir"):
        hk.fit(compiled(), x, y, global_batch=4, epochs=1, resume=True)
    with pytest.raises(HetgradError, match="adaptive_batch: the global batch 4 is outside 8,16"):
        hk.fit(compiled(), x, y, global_batch=4, epochs=1, adaptive_batch=(8, 16))
    from hetgrad.compat import keras
    scheduled = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    scheduled.compile(optimizer=keras.optimizers.SGD(
        keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9)), loss="mse")
    with pytest.raises(HetgradError, match="adaptive_batch: the adaptive batch scales the "
                                           "learning rate: give the optimizer a number"):
        hk.fit(scheduled, x, y, global_batch=4, epochs=1, adaptive_batch=(4, 16))
    with pytest.raises(HetgradError, match="adaptive_batch: the adaptive batch needs 2 or more "
                                           "ranks"):
        hk.fit(compiled(), x, y, global_batch=4, epochs=1, adaptive_batch=(4, 16))
    with pytest.raises(HetgradError, match="gns_every: must be >= 1, got 0"):
        hk.fit(compiled(), x, y, global_batch=4, epochs=1, gns=True, gns_every=0)
    # the user's own hetgrad optimizer with a float weight: kept as given (it raised at the
    # start before), refused up front where a re-plan would have to move it
    fixed = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    fixed.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.1), weight=1.0),
                  loss="mse")
    with pytest.raises(HetgradError, match="rebalance: a fixed weight .* cannot follow a new "
                                           "plan"):
        hk.fit(fixed, x, y, global_batch=4, epochs=1, verbose=0)
    assert len(hk.fit(fixed, x, y, global_batch=4, epochs=1, verbose=0,
                      rebalance=False).history["loss"]) == 1


def test_the_epoch_clock_leaves_validation_apart():
    """``time_s`` of an epoch is its training steps; the validation Keras runs inside
    ``model.fit`` (``validation_data``) is ``validation_s`` -- the adaptive batch's measured
    step time must not hold it."""
    import time
    from types import SimpleNamespace

    from hetgrad.compat import keras
    from hetgrad.loop import _EpochClock

    class SlowValidation(keras.callbacks.Callback):
        def on_test_batch_end(self, batch, logs=None):
            time.sleep(0.3)

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((8, 3), np.float32), np.ones((8, 1), np.float32)
    progress = SimpleNamespace(continued=False)
    clock = _EpochClock(progress)
    model.fit(x, y, batch_size=8, epochs=1, validation_data=(x, y), verbose=0,
              callbacks=[clock, SlowValidation()])
    assert clock.validation >= 0.3 and clock.seconds > 0   # the sleep is validation's
    progress.continued = True       # the rest of a split epoch counts from the first's start
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[clock])
    assert clock.seconds >= 0.3 and clock.validation == 0


def test_hk_fits_progress_bar_counts_the_epochs_steps(capsys):
    """hk.fit's bar (verbose 1, rank 0) through the adapter that shows the user one fit: it
    counts steps on every Keras flavour (Keras 2's own default counts samples, which a TF2
    fit does not report: its bar stood still), and a split epoch's rest moves its end."""
    from hetgrad.compat import keras
    from hetgrad._keras.user_callbacks import OneFit, progress_callbacks
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((12, 3), np.float32), np.ones((12, 1), np.float32)
    adapter = OneFit(progress_callbacks(1, 0), epochs=1)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[adapter])
    shown = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)   # no colours
    assert re.search(r"(?<!\d)3/3(?!\d)", shown), shown
    bar = adapter.inner[0]
    adapter.steps = 5                           # a rest that ends at step 5: the bar's end too
    adapter.set_params({"verbose": 0, "epochs": 1, "steps": 2})
    assert bar.progbar.target == 5


def test_hk_fit_traces_the_training_step_once():
    """Keras creates the compiled metrics (Keras 3: the optimizer's slots too) inside the
    first traced step, and a tf.function that creates variables is traced twice: every
    rank's first step paid a second trace (the goodput runs' cnn1d: 0.5 s of its 1.3 s first
    call, ad hoc). hk.fit creates them first: the step's Python runs once, on every flavour,
    and so does the probe's (one fit per probe batch). A custom train_step is left alone
    (what it passes the model is its own): traced twice, as in Keras."""
    from hetgrad.compat import keras

    class Counting(keras.layers.Layer):   # one count per trace of a training step
        traces = 0

        def call(self, x, training=None):
            if training:
                type(self).traces += 1
            return x

    class Custom(keras.Sequential):
        def train_step(self, *args, **kwargs):
            return super().train_step(*args, **kwargs)

    def compiled(cls=keras.Sequential):
        Counting.traces = 0
        model = cls([keras.Input((5,)), Counting(), keras.layers.Dense(3)])
        model.compile(optimizer=keras.optimizers.Adam(0.01), metrics=["accuracy"],
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 5)).astype(np.float32), rng.integers(0, 3, 32)
    plan = hetgrad.make_plan([1], 8, 32)
    hk.fit(compiled(), x, y, global_batch=8, epochs=2, plan=plan, verbose=0)
    assert Counting.traces == 1
    hk.probe(compiled(), x, y, batches=[8], steps=2, warmup=1)
    assert Counting.traces == 1
    hk.fit(compiled(Custom), x, y, global_batch=8, epochs=1, plan=plan, verbose=0)
    assert Counting.traces == 2


def test_in_place_broadcasts_only_what_horovod_can_take():
    """Horovod's in-place broadcast keys each tensor by its variable's name: two unnamed
    tf.Variables (or a Keras 3 subclassed model's kernels) would collide, so those go the
    traced way; as do other dtypes and calls inside a traced function."""
    import tensorflow as tf
    import hetgrad.tensorflow as htf
    htf.init()
    a, b = tf.Variable(1.0), tf.Variable(2.0)
    named = [tf.Variable(1.0, name="w"), tf.Variable(3, dtype=tf.int64, name="step")]
    assert htf.in_place(named) and not htf.in_place([a, b])
    assert not htf.in_place([tf.Variable(1, dtype=tf.int16, name="n")])
    assert not tf.function(lambda: tf.constant(htf.in_place(named)))().numpy()
    htf.broadcast_variables([a, b], root_rank=0)   # one rank: the values stay
    htf.broadcast_variables(named, root_rank=0)
    assert (a.numpy(), b.numpy(), int(named[1].numpy())) == (1.0, 2.0, 3)


def test_the_broadcast_is_one_where_every_rank_built_its_optimizer(monkeypatch):
    """hetgrad's loop (every rank's slots built alike before the fit): one broadcast of the
    model's and the optimizer's variables before the first step. By default, as Horovod
    (rank 0 alone may have loaded a built optimizer): the weights first, both after the
    first step -- also when this rank's optimizer is built."""
    from hetgrad import compat
    from hetgrad._keras import callbacks
    from hetgrad.compat import keras
    sizes = []
    monkeypatch.setattr(callbacks, "broadcast_variables",
                        lambda variables, root_rank: sizes.append(len(variables)))
    x, y = np.ones((8, 3), np.float32), np.ones((8, 1), np.float32)
    for alike, expected in ((True, ["all"]), (False, ["model", "all"])):
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
        compat.build_optimizer(model.optimizer, model.trainable_variables)
        n = {"model": len(model.variables),
             "all": len(model.variables) + len(compat.optimizer_variables(model.optimizer))}
        sizes.clear()
        model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[
            callbacks.BroadcastGlobalVariablesCallback(0, built_alike=alike)])
        assert sizes == [n[e] for e in expected]


def test_the_heap_is_still_during_training_and_thawed_after():
    """hk.fit freezes the objects alive at its start (gc.freeze: a full collection no longer
    scans TensorFlow's) and thaws them at its end, also after an error; a process that froze
    some itself keeps its own freeze."""
    import gc

    from hetgrad.compat import keras

    seen = []

    class Frozen(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append(gc.get_freeze_count())

    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3)])
    model.compile(optimizer="sgd", loss="mse")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 5)).astype(np.float32), rng.normal(size=(32, 3))
    plan = hetgrad.make_plan([1], 8, 32)
    assert gc.get_freeze_count() == 0
    hk.fit(model, x, y, global_batch=8, epochs=1, plan=plan, verbose=0, callbacks=[Frozen()])
    assert seen[-1] > 10000 and gc.get_freeze_count() == 0
    with pytest.raises(HetgradError):
        hk.fit(model, x, y, global_batch=8, epochs=1, plan=hetgrad.make_plan([1], 8, 40),
               verbose=0)
    assert gc.get_freeze_count() == 0
    gc.freeze()
    try:
        mine = gc.get_freeze_count()
        hk.fit(model, x, y, global_batch=8, epochs=1, plan=plan, verbose=0,
               callbacks=[Frozen()])
        # (freed objects leave the frozen ones: the count only falls)
        assert seen[-1] <= mine and 0.9 * mine < gc.get_freeze_count() <= mine
    finally:
        gc.unfreeze()
