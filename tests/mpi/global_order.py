"""The global order on real ranks (cases of a test world, tests/world.py): every sample once per
epoch, and the same weights from one process, from uneven ranks, from a run re-planned in the
middle of an epoch, from a run stopped in the middle of an epoch and resumed, and from a
checkpoint resumed on another number of ranks."""
import json
import os
import signal
from pathlib import Path

import numpy as np
import tensorflow as tf

import hetgrad
import hetgrad.keras as hk
from hetgrad.compat import keras
from hetgrad.data import ArraySource
from hetgrad.data.reader import rank_batches
from hetgrad.errors import HetgradError
from hetgrad.preempt import Preempted

N, B, SEED, LR = 200, 24, 5, 0.3          # 9 steps an epoch, the last one 8 samples


def _data(n: int = N):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 6)).astype(np.float32)
    return x, (x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1)


def _model(seed: int = 1):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="tanh"),
                              keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.SGD(LR),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _flat(model) -> np.ndarray:
    return np.concatenate([w.ravel() for w in model.get_weights()])


def reference(epochs: int, n: int = N) -> np.ndarray:
    """One process, plain Keras, every global batch of the order as one batch."""
    x, y = _data(n)
    model, source = _model(), ArraySource(x, y)
    one = hetgrad.fixed_plan([B], n)
    for epoch in range(epochs):
        for xb, yb in rank_batches(source, one, 0, SEED, epoch):
            model.train_on_batch(xb, yb)
    return _flat(model)


class _Switch(keras.callbacks.Callback):
    """``set_plan(new)`` after step ``at`` - 1 of epoch ``epoch``."""

    def __init__(self, epoch, at, new):
        super().__init__()
        self.epoch, self.at, self.new, self.now = epoch, at, new, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.now = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.now == self.epoch and batch == self.at - 1:
            hk.set_plan(self.model.optimizer, self.new)


def same_weights() -> dict:
    """hk.fit on uneven batches, and the library path re-planned after step 4 of epoch 2,
    against one process: max |weight difference| and how far training moved."""
    x, y = _data()
    rank, epochs = hetgrad.init().rank, 3
    ref = reference(epochs)
    uneven = _model()
    plan_a = hetgrad.fixed_plan([4, 8, 12], N)
    hk.fit(uneven, x, y, global_batch=B, epochs=epochs, plan=plan_a, rebalance=False,
           seed=SEED, verbose=0)
    plan_b = hetgrad.fixed_plan([10, 9, 5], N)
    switched = _model()
    switched.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(LR), plan=plan_a),
                     loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    source = ArraySource(x, y)
    parts = [rank_batches(source, plan_a, rank, SEED, 0),
             rank_batches(source, plan_a, rank, SEED, 1, 0, 4),
             rank_batches(source, plan_b, rank, SEED, 1, 4),
             rank_batches(source, plan_b, rank, SEED, 2)]
    data = parts[0]
    for part in parts[1:]:
        data = data.concatenate(part)
    switched.fit(data, epochs=epochs, steps_per_epoch=plan_a.steps_per_epoch, verbose=0,
                 callbacks=[hk.callbacks.BroadcastGlobalVariablesCallback(0),
                            _Switch(1, 4, plan_b)])
    start = _flat(_model())
    return {"uneven": float(np.max(np.abs(_flat(uneven) - ref))),
            "switched": float(np.max(np.abs(_flat(switched) - ref))),
            "moved": float(np.max(np.abs(ref - start)))}


def tiny_tail() -> dict:
    """A final step of 2 samples on 3 ranks (one rank has none: it joins with weight 0): the
    weights of one process, and a BatchNormalization model left finite on every rank."""
    n, epochs = 3 * B + 2, 3
    x, y = _data(n)
    plan = hetgrad.fixed_plan([4, 8, 12], n)
    plain = _model()
    hk.fit(plain, x, y, global_batch=B, epochs=epochs, plan=plan, rebalance=False, seed=SEED,
           verbose=0)
    keras.utils.set_random_seed(1)
    bn = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8),
                           keras.layers.BatchNormalization(), keras.layers.Dense(3)])
    bn.compile(optimizer=keras.optimizers.SGD(LR),
               loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = hk.fit(bn, x, y, global_batch=B, epochs=epochs, plan=plan, rebalance=False,
                     seed=SEED, verbose=0)
    return {"lasts": plan.last_batches(),
            "vs_one_process": float(np.max(np.abs(_flat(plain) - reference(epochs, n)))),
            "bn_finite": bool(np.all(np.isfinite(_flat(bn)))),
            "losses": [float(v) for v in history.history["loss"]]}


class IdModel(keras.Model):
    """Trains on ``x["features"]`` and logs ``x["id"]`` of every sample it trains on."""

    seen: list = []

    def train_step(self, data):
        x, y = data
        tf.py_function(lambda ids: self.seen.extend(ids.numpy().tolist()) or 0, [x["id"]],
                       tf.int64)
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self(x["features"], training=True))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}


def ids_per_epoch() -> list:
    """hk.fit (uneven probed-free plan) on a model that logs the id of every sample each
    rank trains on: this rank's ids of each of 2 epochs."""
    x, y = _data()
    keras.utils.set_random_seed(1)
    inp = keras.Input((6,))
    model = IdModel(inp, keras.layers.Dense(3)(inp))
    model.compile(optimizer=keras.optimizers.SGD(LR),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.seen = []
    hk.fit(model, {"features": x, "id": np.arange(N)}, y, global_batch=B, epochs=2,
           plan=hetgrad.fixed_plan([4, 8, 12], N), rebalance=False, seed=SEED, verbose=0)
    per_epoch = hetgrad.fixed_plan([4, 8, 12], N).shard_sizes[hetgrad.init().rank]
    return [model.seen[:per_epoch], model.seen[per_epoch:]]


def resumed_on(ckpt: str, epochs: int, init: int = 1) -> dict:
    """hk.fit to ``epochs`` from the checkpoint in ``ckpt`` if it holds one (made by a world
    of another size if the test did so), probe-free: the weights against one process.
    ``init``: the initial weights' seed (the reference's is 1; another shows that every weight
    comes from the checkpoint)."""
    x, y = _data()
    model = _model(seed=init)
    size = hetgrad.init().size
    hist = hk.fit(model, x, y, global_batch=B, epochs=epochs, plan=hetgrad.make_plan(
        [1.0 + r for r in range(size)], B, N), rebalance=False, seed=SEED,
        checkpoint_dir=ckpt, resume=True, verbose=0)
    return {"epochs": hist.epoch, "vs_one_process": float(np.max(np.abs(_flat(model)
                                                                        - reference(epochs))))}


def refused_resume(ckpt: str) -> str:
    """hk.fit resumed with another seed than its checkpoint's: the error."""
    x, y = _data()
    try:
        hk.fit(_model(), x, y, global_batch=B, epochs=3, seed=SEED + 1, checkpoint_dir=ckpt,
               resume=True, plan=hetgrad.make_plan([1] * hetgrad.init().size, B, N), verbose=0)
    except HetgradError as exc:
        return str(exc)
    return "no error"


class _SignalAt(keras.callbacks.Callback):
    """SIGUSR1 to this process after step ``step`` of epoch ``epoch``, on rank ``rank`` only: a
    stop request that reaches one rank in the middle of an epoch."""

    def __init__(self, epoch: int, step: int, rank: int):
        super().__init__()
        self.epoch, self.step, self.rank, self.now = epoch, step, rank, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.now = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.now, batch + 1) == (self.epoch, self.step) and hetgrad.init().rank == self.rank:
            os.kill(os.getpid(), signal.SIGUSR1)


def _fit(model, epochs: int, **kw):
    x, y = _data()
    size = hetgrad.init().size
    return hk.fit(model, x, y, global_batch=B, epochs=epochs, rebalance=False, seed=SEED,
                  plan=hetgrad.make_plan([1.0 + r for r in range(size)], B, N), verbose=0, **kw)


def _warmup(on: bool) -> list:
    """Horovod's LR warm-up over 3 epochs, set every step (or nothing)."""
    return [hk.callbacks.LearningRateWarmupCallback(initial_lr=LR, warmup_epochs=3)] if on else []


def stopped_in_epoch(ckpt: str, epochs: int, epoch: int, step: int, warmup: bool = False) -> dict:
    """hk.fit with checkpoints in ``ckpt``, asked to stop by a signal to the last rank after
    step ``step`` of epoch ``epoch`` (0-based): the exit code and the saved state."""
    try:
        _fit(_model(), epochs, checkpoint_dir=ckpt,
             callbacks=[_SignalAt(epoch, step, hetgrad.init().size - 1), *_warmup(warmup)])
        code = None
    except Preempted as exc:
        code = exc.code
    state = json.loads((Path(ckpt) / "state.json").read_text())
    return {"exit": code, "epoch": state["epoch"], "step": state["step"],
            "checkpoint": state["checkpoint"]}


def stopped_and_resumed(ckpt: str, epochs: int, epoch: int, step: int,
                        warmup: bool = False) -> dict:
    """The same run three ways on these ranks: straight through, stopped after step ``step``
    of epoch ``epoch`` (:func:`stopped_in_epoch`), and resumed from that checkpoint into a
    model of other initial weights: the stop and how far the resumed weights are from the
    straight run's (bit for bit: 0.0) and from one process."""
    straight = _model()
    _fit(straight, epochs, callbacks=_warmup(warmup))
    stop = stopped_in_epoch(ckpt, epochs, epoch, step, warmup)
    resumed = _model(seed=11)
    hist = _fit(resumed, epochs, checkpoint_dir=ckpt, resume=True, callbacks=_warmup(warmup))
    return {**stop, "resumed_epochs": hist.epoch,
            "vs_straight": float(np.max(np.abs(_flat(resumed) - _flat(straight)))),
            "vs_one_process": float(np.max(np.abs(_flat(resumed) - reference(epochs))))}
