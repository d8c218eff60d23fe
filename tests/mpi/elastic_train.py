"""An elastic job under ``horovodrun`` with a host-discovery script (tests/test_elastic.py):
Horovod's elastic loop with hetgrad's state, each (re)start probing the ranks there are and
planning uneven batches for them; rank 0 logs every epoch (the world size, the plan) as one
JSON line to LOG.

Usage: elastic_train.py LOG EPOCHS
"""
import json
import sys
import time

import numpy as np

import hetgrad
import hetgrad.keras as hk
from hetgrad.compat import keras

N, B = 480, 48


def log(path: str, **row) -> None:
    if hk.rank() == 0:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")


class Paced(keras.callbacks.Callback):
    """A pause per step (so hosts can change mid-run) and rank 0's line per epoch."""

    def __init__(self, path: str, plan):
        super().__init__()
        self.path, self.plan = path, plan

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.03)

    def on_epoch_end(self, epoch, logs=None):
        log(self.path, epoch=epoch + 1, size=hk.size(), batches=self.plan.batches)


def main(path: str, epochs: int) -> None:
    hk.init()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, 6)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(2)])
    model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.1)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    state = hk.elastic.KerasState(model, epoch=0)

    @hk.elastic.run
    def train(state):
        # every (re)start: the ranks there are now, probed together, and a plan for them
        perf = hk.probe(model, x, y, global_batch=B, steps=2, warmup=1)
        plan = hetgrad.make_plan(perf, B, N)
        model.fit(hk.shard(x, y, plan, seed=0), initial_epoch=state.epoch, epochs=epochs,
                  steps_per_epoch=plan.steps_per_epoch, verbose=0,
                  # the line before the commit: a commit that finds new hosts interrupts
                  # the callbacks after it, and the epoch it saved must be in the log
                  callbacks=[hk.elastic.UpdateEpochStateCallback(state), Paced(path, plan),
                             hk.elastic.CommitStateCallback(state)])

    train(state)
    log(path, done=True, size=hk.size(), agree=bool(hk.replicas_agree(model)))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
