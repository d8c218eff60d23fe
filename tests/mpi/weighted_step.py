"""One optimizer step on 3 ranks with unequal batches vs one process on the concatenated batch.

Every rank builds the same model and the same global batch from a seed, trains on its own
slice, and also computes the single-process reference; every rank returns the max
differences (the case ``weighted_step:run`` of a test world, tests/world.py).
"""

import numpy as np
import horovod.tensorflow as hvd
import tensorflow as tf

import hetgrad.keras as hk
from hetgrad import compat
from hetgrad.partition import Plan
from hetgrad.sparse import Sparsify


def run() -> dict:
    rank, size = hvd.rank(), hvd.size()
    BATCHES = [5, 11, 16][:size]
    B = sum(BATCHES)
    rng = np.random.default_rng(42)
    X = rng.normal(size=(B, 12)).astype(np.float32)
    TOKENS = rng.integers(0, 50, size=(B, 4))
    Y = rng.integers(0, 3, size=B)
    lo = sum(BATCHES[:rank])
    mine = slice(lo, lo + BATCHES[rank])

    def dense_model():
        tf.keras.utils.set_random_seed(7)
        inp = tf.keras.Input((12,))
        h = tf.keras.layers.Dense(16, activation="tanh")(inp)
        return tf.keras.Model(inp, tf.keras.layers.Dense(3)(h))

    def embedding_model():
        tf.keras.utils.set_random_seed(7)
        inp = tf.keras.Input((4,))
        h = tf.keras.layers.Embedding(50, 8)(inp)  # gradient is tf.IndexedSlices
        h = tf.keras.layers.GlobalAveragePooling1D()(h)
        return tf.keras.Model(inp, tf.keras.layers.Dense(3)(h))

    def step(build, opt, x, y, counted=False, fit=False):
        """Weights after one step: ``train_on_batch``, or ``fit`` with hetgrad's callbacks."""
        model = build()
        model.compile(optimizer=opt,
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        if counted:
            hk.count_samples(model)
        if fit:
            model.fit(x, y, batch_size=len(y), epochs=1, verbose=0, shuffle=False,
                      callbacks=[hk.callbacks.BroadcastGlobalVariablesCallback(0)])
        else:
            model.train_on_batch(x, y)
        return np.concatenate([w.ravel() for w in model.get_weights()])

    def horovod_average():
        """Horovod's plain average: its own optimizer where it aggregates (Keras 2); under Keras 3
        it silently does not, so the same sum with equal shares through hetgrad."""
        if compat.KERAS3:
            return hk.DistributedOptimizer(sgd(), weight=1.0 / size)
        import horovod.tensorflow.keras as hvd_keras
        return hvd_keras.DistributedOptimizer(sgd(), op=hvd.Average)

    sgd = lambda: tf.keras.optimizers.SGD(0.5)  # noqa: E731
    results = {"flavour": compat.FLAVOUR}
    for name, build, x in (("dense", dense_model, X), ("embedding", embedding_model, TOKENS)):
        ref = step(build, sgd(), x, Y)  # one process, concatenated batch
        w = BATCHES[rank] / B
        # no aggregation at all: what a silently skipped allreduce gives
        results[f"{name}_local"] = step(build, sgd(), x[mine], Y[mine])
        # the one-line switch: no weight, no count_samples call, model.fit with a hetgrad callback
        results[f"{name}_default"] = step(build, hk.DistributedOptimizer(sgd()), x[mine], Y[mine],
                                          fit=True)
        results[f"{name}_plan"] = step(build, hk.DistributedOptimizer(sgd(), weight=w), x[mine],
                                       Y[mine])
        results[f"{name}_samples"] = step(build, hk.DistributedOptimizer(sgd(), weight="samples"),
                                          x[mine], Y[mine], counted=True)
        two_steps = Plan(speeds=[1.0] * size, global_batch=B, dataset_size=2 * B, batches=BATCHES,
                         shard_starts=[2 * sum(BATCHES[:r]) for r in range(size)],
                         shard_sizes=[2 * b for b in BATCHES], steps_per_epoch=2)
        results[f"{name}_planobj"] = step(
            build, hk.DistributedOptimizer(sgd(), weight="plan", plan=two_steps), x[mine], Y[mine])
        if not compat.KERAS3:  # Keras 2's OptimizerV2 family
            results[f"{name}_legacy"] = step(
                build, hk.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(0.5), weight=w),
                x[mine], Y[mine])
        results[f"{name}_horovod_avg"] = step(build, horovod_average(), x[mine], Y[mine])
        results[f"{name}_initial"] = np.concatenate([v.ravel() for v in build().get_weights()])
        for key in [k for k in results
                    if k.startswith(name) and isinstance(results[k], np.ndarray)]:
            if key.endswith("_initial"):
                continue
            results[key] = float(np.max(np.abs(results[key] - ref)))
        results[f"{name}_step_size"] = float(np.max(np.abs(results.pop(f"{name}_initial") - ref)))

    # Partial final batch: this step holds only part of each rank's batch; sample weighting must
    # still equal one process on the concatenated partial batch.
    PART = [2, 7, 3][:size]
    plo = sum(PART[:rank])
    xp, yp = X[:sum(PART)], Y[:sum(PART)]
    ref = step(dense_model, sgd(), xp, yp)
    got = step(dense_model, hk.DistributedOptimizer(sgd(), weight="samples"),
               xp[plo:plo + PART[rank]],
               yp[plo:plo + PART[rank]], counted=True)
    results["partial_samples"] = float(np.max(np.abs(got - ref)))
    stale = step(dense_model, hk.DistributedOptimizer(sgd(), weight=BATCHES[rank] / B),
                 xp[plo:plo + PART[rank]], yp[plo:plo + PART[rank]])
    results["partial_plan"] = float(np.max(np.abs(stale - ref)))
    # the same partial step as the final step of a plan: per-step plan weights are exact
    one_step = Plan(speeds=[1.0] * size, global_batch=B, dataset_size=sum(PART), batches=BATCHES,
                    shard_starts=[sum(PART[:r]) for r in range(size)], shard_sizes=PART,
                    steps_per_epoch=1)
    got = step(dense_model, hk.DistributedOptimizer(sgd(), weight="plan", plan=one_step),
               xp[plo:plo + PART[rank]], yp[plo:plo + PART[rank]])
    results["partial_planobj"] = float(np.max(np.abs(got - ref)))

    # A plan switch between steps (what --rebalance and --adaptive-batch do): step 1 under plan
    # A (another global batch), then set_plan(B) and step 2 on B's batches must equal one
    # process stepping from the same weights on the concatenated batch -- through the already
    # traced train function.
    def plan_of(batches, steps=10):
        return Plan(speeds=[1.0] * size, global_batch=sum(batches),
                    dataset_size=steps * sum(batches), batches=list(batches),
                    shard_starts=[steps * sum(batches[:r]) for r in range(size)],
                    shard_sizes=[steps * b for b in batches], steps_per_epoch=steps)

    A = [4, 6, 8][:size]
    a_lo = sum(A[:rank])
    model = dense_model()
    opt = hk.DistributedOptimizer(sgd(), weight="plan", plan=plan_of(A))
    model.compile(optimizer=opt,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.train_on_batch(X[a_lo:a_lo + A[rank]], Y[a_lo:a_lo + A[rank]])
    w1 = model.get_weights()
    hk.set_plan(opt, plan_of(BATCHES))
    model.train_on_batch(X[mine], Y[mine])
    ref_model = dense_model()
    ref_model.set_weights(w1)
    ref_model.compile(optimizer=sgd(),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    ref_model.train_on_batch(X, Y)
    flat = lambda ws: np.concatenate([w.ravel() for w in ws])  # noqa: E731
    results["switched_plan"] = float(np.max(np.abs(flat(model.get_weights())
                                                    - flat(ref_model.get_weights()))))
    results["switched_step_size"] = float(np.max(np.abs(flat(w1) - flat(ref_model.get_weights()))))

    # Sparse (top-k, union exchange) with the same uneven batches: on the union U the step is the
    # full-batch step exactly (every rank sends its full weighted value there), elsewhere in the
    # sparsified kernel nothing moves; the small tensors (dense_below) are exact everywhere.
    init = flat(dense_model().get_weights())
    full = step(dense_model, sgd(), X, Y)
    sparse = step(dense_model, hk.DistributedOptimizer(
        sgd(), weight=BATCHES[rank] / B, sparsify=Sparsify("topk", density=0.1, dense_below=100)),
        X[mine], Y[mine])
    moved, want = sparse - init, full - init
    kernel = slice(0, 12 * 16)                         # the one tensor of >= 100 entries
    on_u = np.zeros(init.size, bool)
    on_u[kernel] = moved[kernel] != 0
    results["sparse_union_size"] = int(on_u.sum())
    results["sparse_on_union"] = float(np.max(np.abs(moved[on_u] - want[on_u])))
    results["sparse_off_union_kernel"] = float(np.max(np.abs(moved[kernel][~on_u[kernel]])))
    results["sparse_dropped_step"] = float(np.max(np.abs(want[kernel][~on_u[kernel]])))
    results["sparse_small_tensors"] = float(np.max(np.abs(moved[kernel.stop:]
                                                       - want[kernel.stop:])))

    return results
