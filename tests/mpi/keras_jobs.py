"""A user's Keras job through ``hk.fit`` on real ranks, as a new user writes it: Keras' own
callbacks (files written once, by rank 0), ``BackupAndRestore``, a model compiled with
hetgrad's optimizer or loaded by ``hk.load_model``, a subclassed model with its own
``train_step``. Cases of a test world (tests/world.py)."""
import os
from pathlib import Path

import numpy as np
import tensorflow as tf

import hetgrad
import hetgrad.keras as hk
from hetgrad.compat import keras

B, N = 16, 96


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, 5)).astype(np.float32)
    return x, (x.sum(1) > 0).astype(np.int64)


def _model(optimizer=None, cls=None):
    keras.utils.set_random_seed(1)
    inp = keras.Input((5,))
    out = keras.layers.Dense(2)(keras.layers.Dense(8, activation="relu")(inp))
    model = (cls or keras.Model)(inp, out)
    metrics = {} if cls else {"metrics": ["accuracy"]}   # (OwnStep updates no metric)
    model.compile(optimizer=optimizer or keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), **metrics)
    return model


class _Ranks(keras.callbacks.Callback):
    """Appends ``rank epoch`` to a file at every epoch end (to see who ran it)."""

    def __init__(self, path):
        super().__init__()
        self.path = path

    def on_epoch_end(self, epoch, logs=None):
        with open(self.path, "a") as f:
            f.write(f"{hetgrad.init().rank} {epoch}\n")


def callbacks_on_ranks(tmp: str) -> dict:
    """hk.fit with ModelCheckpoint, CSVLogger, TensorBoard, EarlyStopping, a plain and a
    rank_zero_only callback of the user's: what each rank ran and what is on disk."""
    d = Path(tmp)
    cbs = [keras.callbacks.ModelCheckpoint(str(d / "ckpt-{epoch}.keras")),
           keras.callbacks.CSVLogger(str(d / "log.csv")),
           keras.callbacks.TensorBoard(str(d / "tb")),
           keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=1e9),
           _Ranks(str(d / "everyone.txt")), hk.callbacks.rank_zero_only(_Ranks(str(d / "zero.txt")))]
    x, y = _data()
    hist = hk.fit(_model(), x, y, global_batch=B, epochs=5, plan=hetgrad.make_plan([1, 3], B, N),
                  callbacks=cbs, verbose=0)
    hetgrad.init().barrier()
    events = [str(p.relative_to(d)) for p in sorted((d / "tb").rglob("events.out.*"))]
    return {"epochs": hist.epoch, "events": events}


def backup_and_restore(tmp: str) -> dict:
    """Keras' BackupAndRestore given to hk.fit: 2 epochs kept (delete_checkpoint=False), then
    the same callback resumes a 4-epoch run, which deletes the backup when it ends; and a
    straight 4-epoch run to compare with."""
    x, y = _data()
    plan = hetgrad.make_plan([1, 3], B, N)
    backup = str(Path(tmp) / "backup")
    fixed = dict(global_batch=B, plan=plan, rebalance=False, verbose=0)
    hk.fit(_model(), x, y, epochs=2, callbacks=[
        keras.callbacks.BackupAndRestore(backup, delete_checkpoint=False)], **fixed)
    kept = sorted(os.listdir(backup))
    resumed = _model()
    hist = hk.fit(resumed, x, y, epochs=4, callbacks=[keras.callbacks.BackupAndRestore(backup)],
                  **fixed)
    hetgrad.init().barrier()
    straight = _model()
    hk.fit(straight, x, y, epochs=4, **fixed)
    return {"kept": kept, "resumed_epochs": hist.epoch, "deleted": not os.path.exists(backup),
            "vs_straight": max(float(np.max(np.abs(a - b))) for a, b in
                               zip(resumed.get_weights(), straight.get_weights()))}


class OwnStep(keras.Model):
    """Keras' guide's custom ``train_step``: unpacks ``(x, y)`` as ``fit`` passes it."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}


def models_hk_fit_takes(tmp: str) -> dict:
    """hk.fit (probed plan) on a model compiled with hk.DistributedOptimizer, on one from
    hk.load_model, and on a subclassed model with its own train_step: each trains and the
    replicas agree."""
    x, y = _data()
    comm = hetgrad.init()
    out = {}
    compiled = _model(hk.DistributedOptimizer(keras.optimizers.SGD(0.1)))
    out["compiled"] = hk.fit(compiled, x, y, global_batch=B, epochs=2, verbose=0).history
    out["compiled_agree"] = hk.replicas_agree(compiled)
    path = str(Path(tmp) / "m.keras")
    if comm.rank == 0:
        compiled.save(path)
    comm.barrier()
    loaded = hk.load_model(path)
    out["loaded"] = hk.fit(loaded, x, y, global_batch=B, epochs=2, verbose=0).history
    out["loaded_agree"] = hk.replicas_agree(loaded)
    own = _model(cls=OwnStep)
    out["own_step"] = hk.fit(own, x, y, global_batch=B, epochs=2, verbose=0).history
    out["own_step_agree"] = hk.replicas_agree(own)
    return out
