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


def local_variables() -> dict:
    """Horovod's local variables on uneven batches, one step each (train_on_batch, no
    callback): ``PartialDistributedOptimizer(local_layers=[first])`` -- the first layer moves
    by this rank's weighted gradient ``w_i g_i``, the second by the full-batch gradient --
    ``BroadcastGlobalVariablesCallback(local_variables=)`` and ``op=Sum``."""
    batches, x, y, mine = _setup()
    rank, w = htf.rank(), batches[htf.rank()] / sum(batches)

    def stepped(opt, data=(x[0][mine], y[0][mine]), model=None):
        model = model or _model()
        model.compile(optimizer=opt, loss=LOSS)
        model.train_on_batch(*data)
        return model

    partial = _model()
    partial = stepped(hk.PartialDistributedOptimizer(keras.optimizers.SGD(LR),
                                                     local_layers=[partial.layers[1]]),
                      model=partial)
    exact = stepped(keras.optimizers.SGD(LR), (x[0], y[0]))
    own = stepped(keras.optimizers.SGD(LR * w))          # this rank's step, weighted
    out = {"local_layer_vs_own": float(np.max(np.abs(partial.layers[1].kernel.numpy()
                                                     - own.layers[1].kernel.numpy()))),
           "shared_layer_vs_exact": float(np.max(np.abs(partial.layers[2].kernel.numpy()
                                                        - exact.layers[2].kernel.numpy())))}
    model = _model(seed=7 + 100 * rank)                  # every rank its own weights
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss=LOSS)
    first = list(model.layers[1].variables)
    model.fit(x[0][mine], y[0][mine], batch_size=len(y[0][mine]), epochs=1, verbose=0,
              callbacks=[hk.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=first)])
    out["local_kept"] = float(np.max(np.abs(model.layers[1].kernel.numpy()
                                            - _model(seed=7 + 100 * rank).layers[1].kernel.numpy())))
    out["shared_from_root"] = float(np.max(np.abs(model.layers[2].kernel.numpy()
                                                  - _model(seed=7).layers[2].kernel.numpy())))
    start = _flat(_model())
    summed = stepped(hk.DistributedOptimizer(keras.optimizers.SGD(LR), op=htf.Sum))
    averaged = stepped(hk.DistributedOptimizer(keras.optimizers.SGD(LR), weight=1 / htf.size()))
    out["sum_vs_size_times_average"] = float(np.max(np.abs(
        (_flat(summed) - start) - htf.size() * (_flat(averaged) - start))))
    return out


def elastic_state() -> dict:
    """``hk.elastic.KerasState`` as Horovod's elastic loop uses it: ``sync`` takes rank 0's
    weights and attributes, ``restore`` goes back to the last ``commit``."""
    rank = htf.rank()
    model = _model(seed=7 + 100 * rank)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss=LOSS)
    state = hk.elastic.KerasState(model, batch=20 + rank, epoch=10 + rank)
    state.sync()
    synced = _flat(model)
    out = {"synced_vs_root": float(np.max(np.abs(synced - _flat(_model(seed=7))))),
           "synced_attrs": [state.batch, state.epoch]}
    model.set_weights([w + 1 for w in model.get_weights()])
    state.batch, state.epoch = 21, 11
    state.restore()
    out["restored"] = [float(np.max(np.abs(_flat(model) - synced))), state.batch, state.epoch]
    model.set_weights([w + 1 for w in model.get_weights()])
    state.batch, state.epoch = 21, 11
    state.commit()
    state.restore()
    out["committed"] = [float(np.max(np.abs(_flat(model) - synced - 1))), state.batch,
                        state.epoch]
    return out


def horovod_compute_gradients() -> dict:
    """Keras 2's ``_compute_gradients`` (Horovod's: returns the exchanged gradients) +
    ``apply_gradients`` with ``backward_passes_per_step=2`` and a local variable, plain SGD on
    ``loss = (rank + 1) (x + z)``: ``x`` moves by the passes' summed mean gradient every second
    pass, the local ``z`` by its own weighted ``(rank + 1) / P`` per pass summed likewise."""
    from hetgrad.compat import KERAS3
    if KERAS3:
        return {}
    rank, size = htf.rank(), htf.size()
    opt = hk.DistributedOptimizer(keras.optimizers.SGD(1.0), backward_passes_per_step=2)
    x, z = tf.Variable([0.0]), tf.Variable([0.0])
    opt.register_local_var(z)

    @tf.function
    def step():
        gv = opt._compute_gradients(lambda: (rank + 1.0) * (x + z), var_list=[x, z])
        opt.apply_gradients(gv)

    values = []
    for _ in range(4):
        step()
        values.append([float(x.numpy()[0]), float(z.numpy()[0])])
    mean = (size + 1) / 2
    after_two = [-2 * mean, -2 * (rank + 1) / size]
    want = [[0.0, 0.0], after_two, after_two, [2 * v for v in after_two]]
    return {"values": values, "want": want, "iterations": int(opt.iterations.numpy())}
