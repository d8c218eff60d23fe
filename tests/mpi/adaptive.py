"""The goodput-driven global batch through hk.fit: the learning rate a user's callbacks see
inside and at the end of each epoch, and the steps each epoch ran (the case
``adaptive:fit`` of a test world, tests/world.py)."""
import numpy as np

import hetgrad
import hetgrad.keras as hk
from hetgrad import compat
from hetgrad.compat import keras

N, B0, LR = 3000, 16, 0.02


class SeenRates(keras.callbacks.Callback):
    """Per epoch: the learning rate in its steps (a set; ``runs``: [rate, steps] in order),
    at its end, and its step count."""

    def __init__(self):
        super().__init__()
        self.inside, self.at_end, self.steps, self.runs = [], [], [], []

    def on_epoch_begin(self, epoch, logs=None):
        self.inside.append(set())
        self.steps.append(0)
        self.runs.append([])

    def on_train_batch_end(self, batch, logs=None):
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
    seen = SeenRates()
    extra = [RaiseInLastEpoch(epochs - 1)] if fail else []
    try:
        hk.fit(model, x, y, global_batch=B0, epochs=epochs, adaptive_batch=(B0, 512),
               callbacks=[seen, *extra], verbose=0)
        raised = None
    except RuntimeError as exc:
        raised = str(exc)
    return {"inside": [sorted(s) for s in seen.inside], "at_end": seen.at_end,
            "steps": seen.steps, "runs": seen.runs, "raised": raised,
            "lr_after": compat.learning_rate(model.optimizer)}
