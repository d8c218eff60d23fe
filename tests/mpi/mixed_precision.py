"""Mixed precision (``mixed_float16``) on 2 ranks with uneven batches (4 and 12), one step of
three overflowing float16 on rank 1 only: every way the loss scale and hetgrad's optimizer
can be put together, every weight, dense and sparse. The case ``mixed_precision:overflow`` of
a test world (tests/world.py)."""
import numpy as np

import hetgrad
import hetgrad.keras as hk
from hetgrad import compat
from hetgrad.compat import keras
from hetgrad.sparse import Sparsify

BATCHES = [4, 12]
ARRANGEMENTS = ("policy_first", "policy_after", "user_outer", "user_inner")


def _model():
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(2)])


def _lso(opt):
    return (keras.optimizers.LossScaleOptimizer if compat.KERAS3
            else keras.mixed_precision.LossScaleOptimizer)(opt)


def _compiled(arrangement: str, hetgrad_args: dict):
    """``policy_first``: the policy set, then hetgrad's optimizer made (it takes the loss scale
    inside); ``policy_after``: made first, Keras wraps a loss scale around it at compile;
    ``user_outer`` / ``user_inner``: the user's own LossScaleOptimizer around / inside."""
    sgd = keras.optimizers.SGD(0.1)
    if arrangement == "policy_after":
        opt = hk.DistributedOptimizer(sgd, **hetgrad_args)
        keras.mixed_precision.set_global_policy("mixed_float16")
    elif arrangement == "user_outer":
        opt = hk.DistributedOptimizer(sgd, **hetgrad_args)
        keras.mixed_precision.set_global_policy("mixed_float16")
        opt = _lso(opt)
    else:
        keras.mixed_precision.set_global_policy("mixed_float16")
        opt = hk.DistributedOptimizer(_lso(sgd) if arrangement == "user_inner" else sgd,
                                      **hetgrad_args)
    model = _model()
    model.compile(optimizer=opt,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


class _Weights(keras.callbacks.Callback):
    """The model's weights after every step."""

    def on_train_begin(self, logs=None):
        self.seen = [self._flat()]

    def on_train_batch_end(self, batch, logs=None):
        self.seen.append(self._flat())

    def _flat(self):
        return np.concatenate([w.ravel() for w in self.model.get_weights()])


def _run(comm, arrangement: str, weight: str, sparse: bool) -> dict:
    rank = comm.rank
    b = BATCHES[rank]
    rng = np.random.default_rng(rank)
    x = rng.normal(size=(3 * b, 5)).astype(np.float32)
    y = (x.sum(1) > 0).astype(np.int64)
    if rank == 1:
        x[b:2 * b] *= 1e6          # step 2 overflows float16 on rank 1 only
    args = {"plan": dict(plan=hetgrad.fixed_plan(BATCHES, 3 * sum(BATCHES))),
            "float": dict(weight=b / sum(BATCHES)), "samples": {}}[weight]
    if sparse:
        args["sparsify"] = Sparsify("topk", density=0.5, dense_below=1)
    try:
        model = _compiled(arrangement, args)
        weights = _Weights()
        model.fit(x, y, batch_size=b, epochs=1, shuffle=False, verbose=0,
                  callbacks=[hk.callbacks.BroadcastGlobalVariablesCallback(0), weights])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    w = weights.seen
    opt = model.optimizer
    scale = opt.dynamic_scale if compat.KERAS3 else opt.loss_scale
    return {"first": float(np.max(np.abs(w[1] - w[0]))),
            "skipped": float(np.max(np.abs(w[2] - w[1]))),
            "third": float(np.max(np.abs(w[3] - w[2]))), "finite": bool(np.isfinite(w[3]).all()),
            "spread": float(np.max(np.ptp(np.stack(comm.allgather(w[3])), axis=0))),
            "scale": float(scale.numpy()),
            "outermost": hasattr(opt, "hetgrad") and compat.is_loss_scale_optimizer(opt)}


# every weight, dense and sparse (samples both ways: its count rides in a dense exchange)
WEIGHTS = (("samples", False), ("samples", True), ("plan", False), ("float", True))


def overflow() -> dict:
    """``{"arrangement/weight/dense|sparse": facts}`` for every arrangement and weight."""
    comm = hetgrad.init()
    return {f"{a}/{w}/{'sparse' if s else 'dense'}": _run(comm, a, w, s)
            for a in ARRANGEMENTS for w, s in WEIGHTS}
