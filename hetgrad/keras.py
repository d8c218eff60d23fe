"""Keras drop-ins, used like ``horovod.tensorflow.keras``::

    opt = hetgrad.keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), weight=plan.weights()[rank])
    model.compile(optimizer=opt, ...)
    model.fit(ds, callbacks=[hetgrad.keras.BroadcastGlobalVariablesCallback(0),
                             hetgrad.keras.WeightedMetricAverageCallback(samples_per_epoch)])

With ``weight="samples"`` call :func:`count_samples` on the model so every step tells the
optimizer how many samples it holds (exact for partial final batches).
"""
from __future__ import annotations

import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvd_keras
import tensorflow as tf

from .allreduce import WeightedAllreduce

BroadcastGlobalVariablesCallback = hvd_keras.callbacks.BroadcastGlobalVariablesCallback


class _WeightedGradients:
    """Mixin placed before a Keras optimizer class: the backward pass is seeded with this
    rank's weight ``w_i`` (free), then the weighted gradients are summed over ranks."""

    _hetgrad_reduce: WeightedAllreduce

    # Keras 2.11+ optimizers (tf.keras.optimizers.*) call this from minimize().
    def compute_gradients(self, loss, var_list, tape=None):
        if not callable(loss) and tape is None:
            raise ValueError("compute_gradients needs a tape when loss is a tensor")
        tape = tape if tape is not None else tf.GradientTape()
        if callable(loss):
            with tape:
                tape.watch(var_list)
                loss = loss()
        w = tf.cast(self._hetgrad_reduce.local_weight(), loss.dtype)
        grads = tape.gradient(loss, var_list, output_gradients=tf.fill(tf.shape(loss), w))
        return list(zip(self._hetgrad_reduce.sum(grads), var_list))


class _WeightedGradientsLegacy:
    """The same for ``tf.keras.optimizers.legacy.*`` (OptimizerV2): ``grad_loss`` seeds it."""

    _hetgrad_reduce: WeightedAllreduce

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        if grad_loss is not None:
            raise ValueError("hetgrad's DistributedOptimizer sets grad_loss itself")
        w = self._hetgrad_reduce.local_weight()
        gv = super()._compute_gradients(loss, var_list, grad_loss=w, tape=tape)
        grads = self._hetgrad_reduce.sum([g for g, _ in gv])
        return list(zip(grads, [v for _, v in gv]))


def plan_weight(plan, rank: int, iterations: tf.Variable):
    """Per-step ``w_i`` from a partition plan: ``b_i / B`` in full steps and
    ``last_i / sum_j last_j`` in an epoch's partial final step. Exact, and needs no
    communication (every rank knows the plan); the step is read from ``iterations``."""
    steps = plan.steps_per_epoch
    full = plan.batches[rank] / plan.global_batch
    lasts = plan.last_batches()
    last = lasts[rank] / sum(lasts)

    def weight():
        final = tf.equal(tf.math.floormod(iterations, steps), steps - 1)
        return tf.where(final, tf.constant(last, tf.float32), tf.constant(full, tf.float32))

    return weight


def DistributedOptimizer(optimizer, weight="samples", *, plan=None, rank: int | None = None,
                         compression=hvd.Compression.none, sparse_as_dense: bool = False,
                         name: str | None = None):
    """Wrap a Keras optimizer so gradients are combined as ``sum_i (b_i/B) g_i``.

    ``weight``: this rank's share ``b_i / B`` (float, e.g. ``plan.weights()[hvd.rank()]``);
    ``"plan"`` with ``plan=`` (and ``rank=``, default ``hvd.rank()``) for exact per-step plan
    weights including the partial final step (no extra communication; one optimizer step per
    batch, counted by ``iterations`` from the start of an epoch); or ``"samples"`` to weight by
    the samples in each step, for data of unknown batch sizes (needs :func:`count_samples`,
    costs one scalar allreduce per step).
    Returns a new optimizer of a subclass of ``type(optimizer)`` built from its config, like
    Horovod's. ``optimizer.hetgrad_local_count`` is the per-step sample counter.
    """
    base = type(optimizer)
    legacy = isinstance(optimizer, tf.keras.optimizers.legacy.Optimizer)
    mixin = _WeightedGradientsLegacy if legacy else _WeightedGradients
    cls = type(f"HetgradDistributed{base.__name__}", (mixin, base), {})
    opt = cls.from_config(optimizer.get_config())
    if weight == "samples":
        counter = tf.Variable(0, dtype=tf.int32, trainable=False, name="hetgrad_local_count")
        reduce = WeightedAllreduce(local_count=counter, compression=compression,
                                   sparse_as_dense=sparse_as_dense, name=name or "hetgrad")
    elif weight == "plan":
        if plan is None:
            raise ValueError("weight='plan' needs plan=")
        counter = None
        reduce = WeightedAllreduce(plan_weight(plan, hvd.rank() if rank is None else rank,
                                               opt.iterations),
                                   compression=compression, sparse_as_dense=sparse_as_dense,
                                   name=name or "hetgrad")
    elif isinstance(weight, (int, float)):
        counter = None
        reduce = WeightedAllreduce(float(weight), compression=compression,
                                   sparse_as_dense=sparse_as_dense, name=name or "hetgrad")
    else:
        raise ValueError(f"weight must be a float share or 'samples', got {weight!r}")
    opt._hetgrad_reduce = reduce
    opt.hetgrad_local_count = counter
    return opt


def count_samples(model: tf.keras.Model) -> None:
    """Make each train step store its batch size in the optimizer's sample counter."""
    counter = getattr(model.optimizer, "hetgrad_local_count", None)
    if counter is None:
        raise ValueError("model.optimizer is not a hetgrad DistributedOptimizer(weight='samples')")
    inner = model.train_step

    def train_step(data):
        x = data[0] if isinstance(data, (tuple, list)) else data
        counter.assign(tf.shape(tf.nest.flatten(x)[0])[0])
        return inner(data)

    model.train_step = train_step
    model.train_function = None  # rebuild with the new step


class WeightedMetricAverageCallback(tf.keras.callbacks.Callback):
    """Epoch metrics averaged over ranks weighted by samples (Horovod's averages equally).

    ``samples`` is this rank's samples per epoch (its shard size). Keras' epoch metrics are
    sample-weighted means over the local shard, so ``sum_i m_i n_i / sum_i n_i`` is the metric
    over all data.
    """

    def __init__(self, samples: int):
        super().__init__()
        self.samples = float(samples)

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or hvd.size() == 1:
            return
        keys = sorted(k for k in logs if not k.startswith("val_"))
        local = tf.constant([float(logs[k]) * self.samples for k in keys] + [self.samples],
                            tf.float64)
        total = hvd.allreduce(local, op=hvd.Sum, name=f"hetgrad.metrics.{epoch}").numpy()
        for k, v in zip(keys, total[:-1]):
            logs[k] = float(v / total[-1])
