"""Horovod's paths with no hetgrad callback (cases of a test world, tests/world.py): ``fit``
and ``train_on_batch`` with the default optimizer, a ``GradientTape`` loop through
``hetgrad.tensorflow``, and an optimizer's bare ``apply_gradients`` in a loop of one's own --
uneven batches on every rank, against one process."""
import numpy as np
import tensorflow as tf

import hetgrad.keras as hk
import hetgrad.tensorflow as htf
from hetgrad.compat import keras

STEPS, LR = 3, 0.5


def _setup():
    rank, size = htf.rank(), htf.size()
    batches = [5, 11, 16][:size]
    rng = np.random.default_rng(42)
    x = rng.normal(size=(STEPS, sum(batches), 12)).astype(np.float32)
    y = rng.integers(0, 3, size=(STEPS, sum(batches)))
    lo = sum(batches[:rank])
    return batches, x, y, slice(lo, lo + batches[rank])


def _model(seed: int = 7):
    keras.utils.set_random_seed(seed)
    inp = keras.Input((12,))
    h = keras.layers.Dense(16, activation="tanh")(inp)
    return keras.Model(inp, keras.layers.Dense(3)(h))


LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _flat(model) -> np.ndarray:
    return np.concatenate([w.ravel() for w in model.get_weights()])


def _one_process(x, y, parts=None) -> np.ndarray:
    """SGD on every step's whole batch; with ``parts`` (slices) on the mean of the parts'
    gradients instead (Horovod's average)."""
    model, opt = _model(), keras.optimizers.SGD(LR)
    for k in range(STEPS):
        pieces = parts or [slice(None)]
        grads = None
        for part in pieces:
            with tf.GradientTape() as tape:
                loss = LOSS(y[k][part], model(x[k][part], training=True))
            g = tape.gradient(loss, model.trainable_variables)
            grads = g if grads is None else [a + b for a, b in zip(grads, g)]
        opt.apply_gradients(zip([g / len(pieces) for g in grads], model.trainable_variables))
    return _flat(model)


def _tape_loop(mine, x, y, compiled: bool = False, **tape_kw) -> np.ndarray:
    """Horovod's tensorflow2_mnist loop with ``hetgrad.tensorflow`` (``compiled``: its step a
    ``tf.function``, traced twice): every rank starts from other weights, rank 0's are
    broadcast after the first step."""
    model, opt = _model(seed=7 + 100 * htf.rank()), keras.optimizers.SGD(LR)
    htf.broadcast_variables(model.variables, root_rank=0)

    def step(xb, yb, first: bool):
        with tf.GradientTape() as tape:
            loss = LOSS(yb, model(xb, training=True))
        tape = htf.DistributedGradientTape(tape, **tape_kw.get("init", {}))
        grads = tape.gradient(loss, model.trainable_variables, **tape_kw.get("call", {}))
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if first:
            htf.broadcast_variables(opt.variables, root_rank=0)
        return loss

    step = tf.function(step) if compiled else step
    for k in range(STEPS):
        step(x[k][mine], y[k][mine], k == 0)
    return _flat(model)


def _keras_paths(mine, x, y) -> dict:
    """The default ``hk.DistributedOptimizer``, no callback: ``fit``, ``train_on_batch``, and
    its bare ``apply_gradients`` in a loop of one's own."""
    out = {}
    for path in ("fit", "train_on_batch", "apply_gradients"):
        model = _model()
        opt = hk.DistributedOptimizer(keras.optimizers.SGD(LR))
        model.compile(optimizer=opt, loss=LOSS)
        for k in range(STEPS):
            if path == "fit":
                model.fit(x[k][mine], y[k][mine], batch_size=len(y[k][mine]), epochs=1,
                          verbose=0, shuffle=False)
            elif path == "train_on_batch":
                model.train_on_batch(x[k][mine], y[k][mine])
            else:
                with tf.GradientTape() as tape:
                    loss = LOSS(y[k][mine], model(x[k][mine], training=True))
                grads = tape.gradient(loss, model.trainable_variables)
                opt.apply_gradients(zip(grads, model.trainable_variables))
        out[path] = _flat(model)
    return out


def run() -> dict:
    batches, x, y, mine = _setup()
    exact = _one_process(x, y)
    parts = [slice(sum(batches[:r]), sum(batches[:r + 1])) for r in range(len(batches))]
    average = _one_process(x, y, parts)
    got = {
        "tape_samples": _tape_loop(mine, x, y, call={"samples": batches[htf.rank()]}),
        "tape_share": _tape_loop(mine, x, y, init={"weight": batches[htf.rank()] / sum(batches)}),
        "tape_default": _tape_loop(mine, x, y),
        "tape_function": _tape_loop(mine, x, y, True, call={"samples": batches[htf.rank()]}),
        **_keras_paths(mine, x, y),
    }
    out = {f"{k}_vs_exact": float(np.max(np.abs(v - exact))) for k, v in got.items()}
    out.update({f"{k}_vs_average": float(np.max(np.abs(v - average))) for k, v in got.items()})
    out["average_vs_exact"] = float(np.max(np.abs(average - exact)))
    out["moved"] = float(np.max(np.abs(exact - _flat(_model()))))
    out["weights"] = {k: v.tolist() for k, v in got.items()}
    return out
