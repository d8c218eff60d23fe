"""``hk.fit``: the whole pipeline in one call, for a two-input classifier on tabular data
(numeric features and a categorical column), with validation, early stopping and
checkpoints that a rerun with ``--resume`` continues from:

    mpirun -np 3 .venv/bin/python examples/fit_tabular.py --epochs 8 --checkpoint-dir ckpt
    mpirun -np 3 .venv/bin/python examples/fit_tabular.py --epochs 12 --checkpoint-dir ckpt --resume

Only rank 0 prints.
"""
import argparse

import numpy as np

import hetgrad
import hetgrad.keras as hk
from hetgrad.compat import keras

CATEGORIES = 20


def load_data(n: int = 6000, seed: int = 0):
    """Inputs as a dict (one entry per model input), 3 classes; the same on every rank."""
    rng = np.random.default_rng(seed)
    numeric = rng.normal(size=(n, 12)).astype(np.float32)
    category = rng.integers(0, CATEGORIES, size=n)
    score = numeric[:, :3].sum(1) + np.sin(category)     # a rule the model has to learn
    y = np.digitize(score, np.quantile(score, [1 / 3, 2 / 3]))
    return {"numeric": numeric, "category": category}, y


def build_model() -> keras.Model:
    numeric = keras.Input((12,), name="numeric")
    category = keras.Input((), dtype="int32", name="category")
    embedded = keras.layers.Embedding(CATEGORIES, 4)(category)
    h = keras.layers.Concatenate()([numeric, embedded])
    h = keras.layers.Dense(64, activation="relu")(h)
    return keras.Model([numeric, category], keras.layers.Dense(3)(h))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--global-batch", type=int, default=256)
    ap.add_argument("--checkpoint-dir", default=None)
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args()

    comm = hetgrad.init()
    x, y = load_data()
    split = len(y) * 5 // 6
    train = ({k: v[:split] for k, v in x.items()}, y[:split])
    val = ({k: v[split:] for k, v in x.items()}, y[split:])
    model = build_model()
    model.compile(optimizer=keras.optimizers.Adam(3e-3), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = hk.fit(model, *train, global_batch=args.global_batch, epochs=args.epochs,
                     validation_data=val, checkpoint_dir=args.checkpoint_dir,
                     resume=args.resume,
                     callbacks=[keras.callbacks.EarlyStopping("val_loss", patience=3)])
    agree = hk.replicas_agree(model)
    if comm.rank == 0:
        h = history.history
        print(f"trained epochs {history.epoch[0] + 1}..{history.epoch[-1] + 1}: loss "
              f"{h['loss'][0]:.4f} -> {h['loss'][-1]:.4f}, val accuracy "
              f"{h['val_accuracy'][-1]:.4f}; replicas agree: {agree}", flush=True)


if __name__ == "__main__":
    main()
