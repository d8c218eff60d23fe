"""hk.fit on real ranks: the manual path's weights, callbacks seen as one fit, early stopping
on every rank, validation, checkpoint + resume equal to an uninterrupted run, and (under
HETGRAD_EMULATE_SPEEDS) a probed plan that follows the speeds, with TensorBoard scalars and
the timeline.
(the case ``fit:run`` of a test world, tests/world.py; ``ckpt`` a directory that does not
exist yet).
"""

import numpy as np

import hetgrad
import hetgrad.keras as hk
from hetgrad import compat
from hetgrad.compat import keras
from regression_problem import B, LR, N, regression_data  # tests/mpi/


def run(ckpt: str) -> dict:
    comm = hetgrad.init()
    rank, size = comm.rank, comm.size
    rng = np.random.default_rng(0)
    x, y = regression_data(rng)
    plan = hetgrad.make_plan([1, 2, 4][:size], B, N)
    res = {}

    def compiled(seed=3, steps_per_execution=1, cls=keras.Sequential):
        keras.utils.set_random_seed(seed)
        model = cls([keras.Input((5,)), keras.layers.Dense(8, activation="tanh"),
                     keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(LR, momentum=0.5), loss="mse", metrics=["mae"],
                      steps_per_execution=steps_per_execution)
        return model

    def agree(model) -> bool:
        mine = model.get_weights()
        root = comm.bcast(mine if rank == 0 else None, root=0)
        return all(np.array_equal(a, b) for a, b in zip(mine, root))

    class Calls(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.calls = {"on_train_begin": 0, "on_train_end": 0, "on_epoch_end": 0}

        def on_train_begin(self, logs=None):
            self.calls["on_train_begin"] += 1
            self.epochs_param = self.params["epochs"]

        def on_train_end(self, logs=None):
            self.calls["on_train_end"] += 1

        def on_epoch_end(self, epoch, logs=None):
            self.calls["on_epoch_end"] += 1

    # 1. with the manual path's plan and seed: the manual path's weights (tests/mpi/library.py)
    manual = compiled()
    manual.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.5),
                                                     plan=plan), loss="mse")
    manual.fit(hk.shard(x, y, plan, seed=7), epochs=2, steps_per_epoch=plan.steps_per_epoch,
               verbose=0)
    model, calls = compiled(), Calls()
    hist = hk.fit(model, x, y, global_batch=B, epochs=2, plan=plan, rebalance=False, seed=7,
                  callbacks=[calls], validation_data=(x[:20], y[:20]), verbose=0)
    res["fit_vs_manual"] = max(float(np.max(np.abs(a - b)))
                               for a, b in zip(model.get_weights(), manual.get_weights()))
    res["history_keys"] = sorted(hist.history)
    res["history_epochs"] = hist.epoch
    res["calls"], res["epochs_param"] = calls.calls, calls.epochs_param
    res["agree"] = agree(model)

    # 1b. three steps per call into the graph (5 steps an epoch: calls of 3 and 2, the last step
    # partial): the same weights
    several = compiled(steps_per_execution=3)
    hk.fit(several, x, y, global_batch=B, epochs=2, plan=plan, rebalance=False, seed=7, verbose=0)
    res["steps_per_execution_vs_fit"] = max(float(np.max(np.abs(a - b))) for a, b in
                                            zip(several.get_weights(), model.get_weights()))
    # the probe times single steps of such a model (Keras 2's multi-step function would ask
    # train_on_batch's one-batch iterator for more), and leaves it at 3 per call
    res["steps_per_execution_probed"] = len(hk.probe(several, x, y, global_batch=B))
    res["steps_per_execution_kept"] = compat.steps_per_execution(several)

    # 2. early stopping (no epoch improves by 1e9) ends every rank after 2 of 6 epochs
    stop = keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=1e9)
    res["early_stop_epochs"] = hk.fit(compiled(), x, y, global_batch=B, epochs=6, plan=plan,
                                      callbacks=[stop], verbose=0).epoch

    # 3. 2 epochs + resume to 4 == 4 epochs straight (no rebalancing: its re-plans follow timings)
    fixed = dict(global_batch=B, plan=plan, rebalance=False, verbose=0)
    straight = compiled()
    hk.fit(straight, x, y, epochs=4, **fixed)
    hk.fit(compiled(), x, y, epochs=2, checkpoint_dir=ckpt, **fixed)
    resumed = compiled(seed=11)   # other initial weights: all of them come from the checkpoint
    hist = hk.fit(resumed, x, y, epochs=4, checkpoint_dir=ckpt, resume=True, **fixed)
    res["resumed_epochs"] = hist.epoch
    res["resume_err"] = max(float(np.max(np.abs(a - b)))
                            for a, b in zip(resumed.get_weights(), straight.get_weights()))

    # 4. probed plan (emulated speeds from the environment), rebalancing, progress on rank 0,
    # observed (TensorBoard scalars and the timeline next to ``ckpt``; the timeline given on
    # rank 0 only, Horovod's habit for its HOROVOD_TIMELINE); the probe traced the step the
    # training runs (nothing traced after the probe)
    class Traced(keras.Sequential):
        traces = 0

        def train_step(self, data):
            Traced.traces += 1   # (Python: runs when the step is traced, not when it runs)
            return super().train_step(data)

    traced = keras.callbacks.LambdaCallback(
        on_train_begin=lambda logs: res.update(traced_before=Traced.traces),
        on_train_end=lambda logs: res.update(traced_after=Traced.traces))
    probed = compiled(cls=Traced)
    hist = hk.fit(probed, x, y, global_batch=B, epochs=3, tensorboard=f"{ckpt}-tb",
                  timeline=f"{ckpt}-timeline.json" if rank == 0 else None, callbacks=[traced])
    res["probed_loss"] = hist.history["loss"]
    res["probed_agree"] = agree(probed)
    res["var_y"] = float(np.var(y))

    return res
