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
    """Mixin placed before a Keras optimizer class: aggregate gradients before applying them."""

    _hetgrad_reduce: WeightedAllreduce

    def _hetgrad_aggregate(self, grads_and_vars):
        grads_and_vars = list(grads_and_vars)
        grads = self._hetgrad_reduce([g for g, _ in grads_and_vars])
        return list(zip(grads, [v for _, v in grads_and_vars]))

    # Keras 2.11+ optimizers (tf.keras.optimizers.*) call this from minimize().
    def compute_gradients(self, loss, var_list, tape=None):
        return self._hetgrad_aggregate(super().compute_gradients(loss, var_list, tape))


class _WeightedGradientsLegacy:
    """The same for ``tf.keras.optimizers.legacy.*`` (OptimizerV2)."""

    _hetgrad_reduce: WeightedAllreduce

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        gv = super()._compute_gradients(loss, var_list, grad_loss=grad_loss, tape=tape)
        grads = self._hetgrad_reduce([g for g, _ in gv])
        return list(zip(grads, [v for _, v in gv]))


def DistributedOptimizer(optimizer, weight: float | str = "samples", *,
                         compression=hvd.Compression.none, sparse_as_dense: bool = False,
                         name: str | None = None):
    """Wrap a Keras optimizer so gradients are combined as ``sum_i (b_i/B) g_i``.

    ``weight``: this rank's share ``b_i / B`` (float, e.g. ``plan.weights()[hvd.rank()]``), or
    ``"samples"`` to weight by the samples in each step (needs :func:`count_samples`).
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
