"""Your own CNN on your own Keras-format .npz (x_train, y_train, x_test, y_test), e.g. the
``mnist.npz`` that ``keras.datasets.mnist`` downloads:

    mpirun -np 3 .venv/bin/python examples/cnn_npz.py ~/.keras/datasets/mnist.npz --epochs 5
    mpirun -np 3 .venv/bin/python examples/cnn_npz.py hetgrad/datasets/digits.npz

``build_model`` has the signature the CLI takes, so the same model also trains with
``hetgrad train --model examples.cnn_npz:build_model --data PATH``. Only rank 0 prints.
"""
import argparse

import numpy as np

import hetgrad
import hetgrad.keras as hk
from hetgrad.compat import keras


def load(path: str):
    """Images as float32 in [0, 1] with a channel axis, integer labels."""
    with np.load(path) as f:
        x_train, y_train, x_test, y_test = (f[k] for k in ("x_train", "y_train", "x_test",
                                                            "y_test"))
    scale = float(max(x_train.max(), 1))
    prep = lambda x: (x.astype(np.float32) / scale).reshape(*x.shape[:3], -1)  # noqa: E731
    return prep(x_train), y_train.astype(np.int64), prep(x_test), y_test.astype(np.int64)


def build_model(input_shape, num_classes: int) -> keras.Model:
    layers = keras.layers
    inp = keras.Input(input_shape)
    x = layers.Conv2D(16, 3, padding="same", activation="relu")(inp)
    x = layers.MaxPooling2D(2)(x)
    x = layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    x = layers.Flatten()(x)
    return keras.Model(inp, layers.Dense(num_classes)(x))   # logits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", help="a Keras-format .npz")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--global-batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2e-3)
    args = ap.parse_args()

    comm = hetgrad.init()
    x, y, x_test, y_test = load(args.data)
    model = build_model(x.shape[1:], int(max(y.max(), y_test.max())) + 1)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.Adam(args.lr), loss=loss)
    perf = hk.probe(model, x, y, global_batch=args.global_batch)
    plan = hetgrad.make_plan(perf, args.global_batch, len(x))
    if comm.rank == 0:
        print(f"plan: batches {plan.batches}, {plan.steps_per_epoch} steps per epoch", flush=True)

    model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.Adam(args.lr), plan=plan),
                  loss=loss, metrics=["accuracy"])
    history = model.fit(hk.shard(x, y, plan, seed=0), epochs=args.epochs,
                        steps_per_epoch=plan.steps_per_epoch,
                        callbacks=[hk.callbacks.BroadcastGlobalVariablesCallback(0),
                                   hk.callbacks.MetricAverageCallback()],
                        verbose=2 if comm.rank == 0 else 0)
    agree = hk.replicas_agree(model)
    if comm.rank == 0:
        _, test_acc = model.evaluate(x_test, y_test, verbose=0)
        print(f"loss: first epoch {history.history['loss'][0]:.4f}, last epoch "
              f"{history.history['loss'][-1]:.4f}; test accuracy {test_acc:.4f}; "
              f"replicas agree: {agree}", flush=True)


if __name__ == "__main__":
    main()
