"""Your own Keras model, loss and data on heterogeneous ranks: probe -> plan -> shard -> fit.

    mpirun -np 3 .venv/bin/python examples/regression.py --epochs 5

A regression model (mean squared error) on in-memory arrays; replace ``build_model`` and
``load_data`` with yours. Only rank 0 prints.
"""
import argparse

import numpy as np

import hetgrad
import hetgrad.keras as hk
from hetgrad.compat import keras


def load_data(n: int = 4096, features: int = 16, seed: int = 0):
    rng = np.random.default_rng(seed)  # the same on every rank: each takes its plan's shard
    x = rng.normal(size=(n, features)).astype(np.float32)
    w = rng.normal(size=(features, 1)).astype(np.float32)
    y = np.tanh(x @ w) + 0.05 * rng.normal(size=(n, 1)).astype(np.float32)
    return x, y


def build_model(features: int) -> keras.Model:
    return keras.Sequential([keras.Input((features,)), keras.layers.Dense(64, activation="relu"),
                             keras.layers.Dense(1)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--global-batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=0.1)
    args = ap.parse_args()

    comm = hetgrad.init()
    x, y = load_data()
    model = build_model(x.shape[1])
    model.compile(optimizer=keras.optimizers.SGD(args.lr), loss="mse")
    perf = hk.probe(model, x, y, global_batch=args.global_batch)   # this model, these batches
    plan = hetgrad.make_plan(perf, args.global_batch, len(x))
    if comm.rank == 0:
        print(f"plan: batches {plan.batches}, {plan.steps_per_epoch} steps per epoch", flush=True)

    model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(args.lr), plan=plan),
                  loss="mse")
    history = model.fit(hk.shard(x, y, plan, seed=0), epochs=args.epochs,
                        steps_per_epoch=plan.steps_per_epoch,
                        callbacks=[hk.callbacks.BroadcastGlobalVariablesCallback(0),
                                   hk.callbacks.MetricAverageCallback()],
                        verbose=2 if comm.rank == 0 else 0)
    agree = hk.replicas_agree(model)   # a collective: every rank calls it
    if comm.rank == 0:
        loss = history.history["loss"]
        print(f"loss: first epoch {loss[0]:.4f}, last epoch {loss[-1]:.4f}, "
              f"predicting the mean {float(np.var(y)):.4f}; replicas agree: {agree}",
              flush=True)


if __name__ == "__main__":
    main()
