"""Horovod-habit cases on 3 ranks, each against one process on the concatenated batch.

Every rank holds a different slice of one seeded global batch (uneven: 5/11/16 samples, or
equal: 8 each). Every rank returns {case: max |difference|} plus the few non-numeric facts
(the case ``parity:run`` of a test world, tests/world.py; ``tmp`` a directory for files).
"""
import os

import numpy as np
import tensorflow as tf

import hetgrad.keras as hk
from hetgrad import compat

keras = compat.keras


def run(tmp: str) -> dict:
    hk.init()
    rank, size = hk.rank(), hk.size()
    UNEVEN = [5, 11, 16][:size]
    rng = np.random.default_rng(3)
    X = rng.normal(size=(sum(UNEVEN), 12)).astype(np.float32)
    Y = rng.integers(0, 3, size=sum(UNEVEN))
    LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    results: dict = {"flavour": compat.FLAVOUR}

    def share(batches):
        lo = sum(batches[:rank])
        return slice(lo, lo + batches[rank])

    def model_of(seed=7, cls=None):
        keras.utils.set_random_seed(seed)
        inp = keras.Input((12,))
        h = keras.layers.Dense(16, activation="tanh")(inp)
        return (cls or keras.Model)(inp, keras.layers.Dense(3)(h))

    def flat(model):
        return np.concatenate([w.ravel() for w in model.get_weights()])

    def reference(n, start=None, optimizer=None, epochs=1):
        """One process, ``epochs`` full-batch steps on the first ``n`` samples."""
        model = model_of()
        if start is not None:
            model.set_weights(start)
        model.compile(optimizer=optimizer or keras.optimizers.SGD(0.5), loss=LOSS)
        for _ in range(epochs):
            model.train_on_batch(X[:n], Y[:n])
        return model

    def fit_local(model, batches, epochs=1, callbacks=()):
        part = share(batches)
        return model.fit(X[part], Y[part], batch_size=batches[rank], epochs=epochs, verbose=0,
                         shuffle=False, callbacks=[hk.callbacks.BroadcastGlobalVariablesCallback(0),
                                                   *callbacks])

    def diff(model, ref) -> float:
        return float(np.max(np.abs(flat(model) - flat(ref))))

    def compiled(opt, seed=7, cls=None):
        model = model_of(seed, cls)
        model.compile(optimizer=opt, loss=LOSS)
        return model

    # 1. the one-line switch with equal batches equals Horovod's average (= the full batch)
    EQUAL = [8] * size
    m = compiled(hk.DistributedOptimizer(keras.optimizers.SGD(0.5)))
    fit_local(m, EQUAL)
    results["default_equal"] = diff(m, reference(sum(EQUAL)))

    # 2. train_on_batch with no callback and no count_samples: Keras' train step counts the
    # uneven batches itself (the model was compiled with hetgrad's optimizer)
    m = compiled(hk.DistributedOptimizer(keras.optimizers.SGD(0.5)))
    m.train_on_batch(X[share(UNEVEN)], Y[share(UNEVEN)])
    results["uncounted_train_on_batch"] = diff(m, reference(sum(UNEVEN)))

    # 3. ranks start from different weights: the broadcast makes rank 0's the start everywhere
    m = compiled(hk.DistributedOptimizer(keras.optimizers.SGD(0.5)), seed=100 + rank)
    fit_local(m, UNEVEN)
    start0 = model_of(100).get_weights()
    results["broadcast"] = diff(m, reference(sum(UNEVEN), start=start0))
    gathered = hk.allgather(tf.constant(flat(m)[None]))
    results["broadcast_spread"] = float(np.max(np.ptp(gathered.numpy(), axis=0)))

    # 4. sample-weighted metric average: the epoch loss over all data
    m = compiled(hk.DistributedOptimizer(keras.optimizers.SGD(0.5)))
    hist = fit_local(m, UNEVEN, callbacks=[hk.callbacks.MetricAverageCallback()])
    full = model_of()
    full.compile(loss=LOSS)
    results["metric_average"] = abs(hist.history["loss"][0] - float(full.evaluate(X, Y, verbose=0)))

    # 5. learning-rate warm-up and schedule (logged lr at each epoch's end)
    m = compiled(hk.DistributedOptimizer(keras.optimizers.SGD(0.5)))
    hist = fit_local(m, UNEVEN, epochs=2, callbacks=[
        hk.callbacks.LearningRateWarmupCallback(0.5, warmup_epochs=2, steps_per_epoch=1)])
    results["warmup_lr"] = hist.history["lr"]
    m = compiled(hk.DistributedOptimizer(keras.optimizers.SGD(0.5)))
    hist = fit_local(m, UNEVEN, epochs=3, callbacks=[
        hk.callbacks.LearningRateScheduleCallback(0.5, 0.1, start_epoch=1)])
    results["schedule_lr"] = hist.history["lr"]

    # 6. get_config / from_config keeps the aggregation
    opt = hk.DistributedOptimizer(keras.optimizers.SGD(0.5))
    again = opt.__class__.from_config(opt.get_config())
    results["from_config_is_hetgrad"] = hasattr(again, "hetgrad") and again is not opt
    m = compiled(again)
    fit_local(m, UNEVEN)
    results["from_config"] = diff(m, reference(sum(UNEVEN)))

    # 7. save with the optimizer, load with hetgrad.keras.load_model: it still aggregates
    formats = ["keras"] + ([] if compat.KERAS3 else ["h5"])
    for fmt in formats:
        path = os.path.join(tmp, f"model.{fmt}")
        m = compiled(hk.DistributedOptimizer(keras.optimizers.SGD(0.5)))
        fit_local(m, UNEVEN)
        if rank == 0:
            m.save(path)
        hk.allreduce(tf.constant(0.0))  # a barrier: the file is complete before anyone reads it
        loaded = hk.load_model(path)
        results[f"load_{fmt}_is_hetgrad"] = hasattr(loaded.optimizer, "hetgrad")
        start = loaded.get_weights()
        fit_local(loaded, UNEVEN)
        results[f"load_{fmt}"] = diff(loaded, reference(sum(UNEVEN), start=start))

    # 8. a custom train step that calls apply_gradients itself (not seeded: weighted in apply)
    class CustomStep(keras.Model):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = LOSS(y, self(x, training=True))
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
            return {"loss": loss}

    m = compiled(hk.DistributedOptimizer(keras.optimizers.SGD(0.5)), cls=CustomStep)
    fit_local(m, UNEVEN)
    results["custom_step"] = diff(m, reference(sum(UNEVEN)))

    # 9. fp16 compression of the exchange (close, not exact) and no aggregation (far)
    m = compiled(hk.DistributedOptimizer(keras.optimizers.SGD(0.5),
                                         compression=hk.Compression.fp16))
    fit_local(m, UNEVEN)
    results["fp16"] = diff(m, reference(sum(UNEVEN)))
    m = compiled(keras.optimizers.SGD(0.5))
    fit_local(m, UNEVEN)
    results["local"] = diff(m, reference(sum(UNEVEN)))

    # 10. mixed precision's loss scaling wrapped by hetgrad
    lso = (keras.optimizers.LossScaleOptimizer if compat.KERAS3
           else keras.mixed_precision.LossScaleOptimizer)
    m = compiled(hk.DistributedOptimizer(lso(keras.optimizers.SGD(0.5))))
    fit_local(m, UNEVEN)
    results["loss_scale"] = diff(m, reference(sum(UNEVEN)))

    # 11. embeddings: IndexedSlices allgathered, or densified with sparse_as_dense
    def embedding_model():
        keras.utils.set_random_seed(7)
        inp = keras.Input((4,))
        h = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(50, 8)(inp))
        return keras.Model(inp, keras.layers.Dense(3)(h))

    TOKENS = rng.integers(0, 50, size=(sum(UNEVEN), 4))
    ref = embedding_model()
    ref.compile(optimizer=keras.optimizers.SGD(0.5), loss=LOSS)
    ref.train_on_batch(TOKENS, Y)
    for dense in (False, True):
        m = embedding_model()
        m.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.5),
                                                    sparse_as_dense=dense), loss=LOSS)
        hk.count_samples(m)
        m.train_on_batch(TOKENS[share(UNEVEN)], Y[share(UNEVEN)])
        results[f"embedding_sparse_as_dense_{dense}"] = diff(m, ref)

    # 12. not a Keras optimizer of this flavour: refused at construction
    try:
        hk.DistributedOptimizer(tf.Module())
        results["not_an_optimizer"] = "accepted"
    except Exception as exc:  # noqa: BLE001
        results["not_an_optimizer"] = str(exc)

    # 13. gradient accumulation: backward_passes_per_step=2 over two uneven steps equals one
    # step on all their samples; the first step leaves the weights alone
    X2 = rng.normal(size=(2 * sum(UNEVEN), 12)).astype(np.float32)
    Y2 = rng.integers(0, 3, size=2 * sum(UNEVEN))
    m = compiled(hk.DistributedOptimizer(keras.optimizers.SGD(0.5), backward_passes_per_step=2,
                                         average_aggregated_gradients=True))
    hk.count_samples(m)
    before = flat(m)
    for k in range(2):
        part = share(UNEVEN)
        lo = k * sum(UNEVEN)
        m.train_on_batch(X2[lo + part.start:lo + part.stop], Y2[lo + part.start:lo + part.stop])
        if k == 0:
            results["accumulate_first_step_moved"] = float(np.max(np.abs(flat(m) - before)))
    full = model_of()
    full.compile(optimizer=keras.optimizers.SGD(0.5), loss=LOSS)
    full.train_on_batch(X2, Y2)
    results["accumulate"] = diff(m, full)
    results["accumulate_iterations"] = int(m.optimizer.iterations.numpy())

    # 15. broadcast_variables of two unnamed tf.Variables (one name twice: not in place) and
    # of named ones (in place): rank 0's values everywhere
    import hetgrad.tensorflow as htf  # noqa: E402
    unnamed = [tf.Variable(1.0 + rank), tf.Variable(2.0 * (rank + 1))]
    named = [tf.Variable(float(rank), name="named_w"), tf.Variable(rank, tf.int64, name="n")]
    chosen = [float(htf.in_place(unnamed)), float(htf.in_place(named))]
    htf.broadcast_variables(unnamed, root_rank=0)
    htf.broadcast_variables(named, root_rank=0)
    everywhere = hk.allgather(tf.constant([chosen + [float(v.numpy()) for v in unnamed + named]]))
    results["broadcast_named"] = everywhere.numpy().tolist()   # a row per rank

    # 14. what a Horovod user imports from the module
    import horovod.tensorflow as hvd  # noqa: E402
    results["reexports"] = [hk.rank() == hvd.rank(), hk.size() == hvd.size(),
                            hk.local_rank() == hvd.local_rank(), hk.broadcast is hvd.broadcast,
                            hk.allreduce is hvd.allreduce, hk.init is hvd.init]

    return results
