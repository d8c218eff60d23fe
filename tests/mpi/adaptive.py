"""The goodput-driven global batch through hk.fit: the learning rate a user's callbacks see
inside and at the end of each epoch, and the steps each epoch ran (the case
``adaptive:fit`` of a test world, tests/world.py)."""
import contextlib
import io
import json
import os
import signal
from pathlib import Path

import numpy as np

import hetgrad
import hetgrad.keras as hk
from hetgrad import compat
from hetgrad.compat import keras
from hetgrad.goodput import candidates, split_step
from hetgrad.preempt import Preempted

N, B0, LR = 3000, 16, 0.02


class SeenRates(keras.callbacks.Callback):
    """Per epoch: the learning rate in its steps (a set; ``runs``: [rate, steps] in order),
    at its end, its step count, the step indices seen and ``params["steps"]`` at its end."""

    def __init__(self):
        super().__init__()
        self.inside, self.at_end, self.steps, self.runs = [], [], [], []
        self.indices, self.told = [], []

    def on_epoch_begin(self, epoch, logs=None):
        self.inside.append(set())
        self.steps.append(0)
        self.runs.append([])
        self.indices.append([])

    def on_train_batch_end(self, batch, logs=None):
        self.indices[-1].append(batch)
        rate = round(compat.learning_rate(self.model.optimizer), 9)
        self.inside[-1].add(rate)
        self.steps[-1] += 1
        runs = self.runs[-1]
        if runs and runs[-1][0] == rate:
            runs[-1][1] += 1
        else:
            runs.append([rate, 1])

    def on_epoch_end(self, epoch, logs=None):
        self.at_end.append(compat.learning_rate(self.model.optimizer))
        self.told.append(self.params["steps"])


class SeenBar(keras.callbacks.ProgbarLogger):
    """Keras' progress bar counting steps (silent: the fits inside run at verbose 0), its
    target at each epoch's last step."""

    def __init__(self):
        super().__init__(**({} if compat.KERAS3 else {"count_mode": "steps"}))
        self.targets = []

    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        self.targets.append(None)

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)
        self.targets[-1] = self.progbar.target


class RaiseInLastEpoch(keras.callbacks.Callback):
    """Every rank raises after the 2nd step of epoch ``last`` (the same step everywhere)."""

    def __init__(self, last: int):
        super().__init__()
        self.last, self.epoch = last, None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch == self.last and batch == 1:
            raise RuntimeError("a user's callback failed")


def fit(epochs: int = 4, fail: bool = False) -> dict:
    """hk.fit of a small softmax classifier on noisy labels, global batch from 16 in
    (16, 512): its tiny steps are all fixed cost, so a larger batch pays once the noise scale
    is measured. ``fail``: a callback raises in the last epoch; the optimizer's rate after."""
    hetgrad.init()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, 20)).astype(np.float32)
    y = (np.argmax(x[:, :4] + 2.0 * rng.normal(size=(N, 4)), axis=1)).astype(np.int64)
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(4)])
    model.compile(optimizer=keras.optimizers.SGD(LR), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    seen, bar = SeenRates(), SeenBar()
    extra = [RaiseInLastEpoch(epochs - 1)] if fail else []
    printed = io.StringIO()   # rank 0's output: Keras' bar (verbose 1) and hetgrad's lines
    try:
        with contextlib.redirect_stdout(printed):
            hk.fit(model, x, y, global_batch=B0, epochs=epochs, adaptive_batch=(B0, 512),
                   callbacks=[seen, bar, *extra], verbose=1)
        raised = None
    except RuntimeError as exc:
        raised = str(exc)
    return {"inside": [sorted(s) for s in seen.inside], "at_end": seen.at_end,
            "steps": seen.steps, "runs": seen.runs, "raised": raised,
            "indices": seen.indices, "told": seen.told, "bar": bar.targets,
            "lr_after": compat.learning_rate(model.optimizer), "printed": printed.getvalue()}


class _Trained(keras.callbacks.Callback):
    """Keeps the ids the run trains on (not the probe's: ``seen`` starts empty at the
    training's begin) in ``kept``; SIGUSR1 to this process after the ``stop_after``-th step
    this callback sees, on the last rank."""

    def __init__(self, kept: list, stop_after: int = 0):
        super().__init__()
        self.kept, self.stop_after, self.count = kept, stop_after, 0
        self.indices, self.told = [], None   # the step indices seen, params["steps"] at the end

    def on_train_begin(self, logs=None):
        self.model.seen.clear()

    def on_train_batch_end(self, batch, logs=None):
        self.indices.append(batch)
        self.told = self.params["steps"]
        self.count += 1
        if self.count == self.stop_after and hetgrad.init().rank == hetgrad.init().size - 1:
            os.kill(os.getpid(), signal.SIGUSR1)

    def on_train_end(self, logs=None):
        self.kept.extend(self.model.seen)


def ids_split(ckpt: str) -> dict:
    """One epoch of hk.fit with the adaptive batch from 16, asked to stop 3 steps into the
    rest of the epoch after its first choice, then resumed: the ids this rank trained on,
    the step indices (and ``params["steps"]``) a callback saw in each process, and the
    checkpoint's place."""
    from global_order import IdModel   # tests/mpi/, on the ranks' path
    hetgrad.init()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, 20)).astype(np.float32)
    y = (np.argmax(x[:, :4] + 2.0 * rng.normal(size=(N, 4)), axis=1)).astype(np.int64)
    grid = [b for b in candidates(B0, 512, B0) if b <= 4 * B0]
    k = split_step(-(-N // B0), B0, grid)
    kept, stopped, counted = [], None, []
    for resume, stop_after in ((False, k + 3), (True, 0)):
        keras.utils.set_random_seed(1)
        inp = keras.Input((20,))
        model = IdModel(inp, keras.layers.Dense(4)(inp))
        model.seen = []
        model.compile(optimizer=keras.optimizers.SGD(LR),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        trained = _Trained(kept, stop_after)
        try:
            hk.fit(model, {"features": x, "id": np.arange(N)}, y, global_batch=B0, epochs=1,
                   adaptive_batch=(B0, 512), checkpoint_dir=ckpt, resume=resume,
                   callbacks=[trained], verbose=0)
        except Preempted:   # (rank 0 saved the checkpoint: its word on it)
            stopped = hetgrad.init().rank == 0 and json.loads(
                (Path(ckpt) / "state.json").read_text())
        counted.append({"indices": trained.indices, "told": trained.told})
    return {"ids": kept, "k": k, "counted": counted, "stopped": stopped and {
        "epoch": stopped["epoch"], "step": stopped["step"],
        "batch": stopped["plan"]["global_batch"]}}
