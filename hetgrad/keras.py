"""Keras drop-ins, used like ``horovod.tensorflow.keras``::

    opt = hetgrad.keras.DistributedOptimizer(keras.optimizers.SGD(0.1), weight="plan", plan=plan)
    model.compile(optimizer=opt, ...)
    model.fit(ds, callbacks=[hetgrad.keras.BroadcastGlobalVariablesCallback(0),
                             hetgrad.keras.WeightedMetricAverageCallback(samples_per_epoch)])

With ``weight="samples"`` call :func:`count_samples` on the model so every step tells the
optimizer how many samples it holds (exact for partial final batches). The aggregation itself
(weights, exchange, finite check, timers) is :mod:`hetgrad.aggregate`; this module only hooks it
into the optimizer classes of the running Keras flavour (:mod:`hetgrad.compat`).
"""
from __future__ import annotations

import horovod.tensorflow as hvd
import tensorflow as tf

from . import compat
from .aggregate import (NONFINITE, Aggregation, DenseReducer, FixedWeight, PlanWeight,
                        Reducer, SampleWeight)

__all__ = ["DistributedOptimizer", "set_plan", "count_samples", "aggregation_of",
           "WeightedMetricAverageCallback", "BroadcastGlobalVariablesCallback", "NONFINITE"]


def __getattr__(name: str):
    if name == "BroadcastGlobalVariablesCallback":  # Horovod's, loaded only when asked for
        return compat.horovod_keras().callbacks.BroadcastGlobalVariablesCallback
    raise AttributeError(name)


class _WeightedGradients:
    """Mixin placed before a Keras 2.11+ optimizer class (``minimize`` calls this): the
    backward pass is seeded with this rank's weight ``w_i`` (free), then exchanged."""

    hetgrad: Aggregation

    def compute_gradients(self, loss, var_list, tape=None):
        if not callable(loss) and tape is None:
            raise ValueError("compute_gradients needs a tape when loss is a tensor")
        tape = tape if tape is not None else tf.GradientTape()
        if callable(loss):
            with tape:
                tape.watch(var_list)
                loss = loss()
        w = tf.cast(self.hetgrad.local_weight(), loss.dtype)
        grads = tape.gradient(loss, var_list, output_gradients=tf.fill(tf.shape(loss), w))
        return list(zip(self.hetgrad.exchange(grads), var_list))


class _WeightedGradientsLegacy:
    """The same for Keras 2's ``optimizers.legacy.*`` (OptimizerV2): ``grad_loss`` seeds it."""

    hetgrad: Aggregation

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        if grad_loss is not None:
            raise ValueError("hetgrad's DistributedOptimizer sets grad_loss itself")
        w = self.hetgrad.local_weight()
        gv = super()._compute_gradients(loss, var_list, grad_loss=w, tape=tape)
        grads = self.hetgrad.exchange([g for g, _ in gv])
        return list(zip(grads, [v for _, v in gv]))


def _weight_of(weight, plan, rank: int | None, iterations, name: str):
    if weight == "samples":
        return SampleWeight(name)
    if weight == "plan":
        if plan is None:
            raise ValueError("weight='plan' needs plan=")
        return PlanWeight(plan, hvd.rank() if rank is None else rank, iterations)
    if isinstance(weight, (int, float)):
        return FixedWeight(weight)
    raise ValueError(f"weight must be a float share, 'plan' or 'samples', got {weight!r}")


def DistributedOptimizer(optimizer, weight="samples", *, plan=None, rank: int | None = None,
                         reducer: Reducer | None = None, compression=hvd.Compression.none,
                         sparse_as_dense: bool = False, check_finite: bool = True,
                         name: str | None = None):
    """Wrap a Keras optimizer so gradients are combined as ``sum_i (b_i/B) g_i``.

    ``weight``: this rank's share ``b_i / B`` (float, e.g. ``plan.weights()[hvd.rank()]``);
    ``"plan"`` with ``plan=`` (and ``rank=``, default ``hvd.rank()``) for exact per-step plan
    weights including the partial final step (no extra communication; one optimizer step per
    batch, counted by ``iterations`` from the start of an epoch; :func:`set_plan` switches
    plans); or ``"samples"`` to weight by the samples in each step, for data of unknown batch
    sizes (needs :func:`count_samples`, costs one scalar allreduce per step).
    ``reducer``: the exchange (default :class:`~hetgrad.aggregate.DenseReducer` with
    ``compression`` and ``sparse_as_dense``; e.g. :class:`~hetgrad.sparse_exchange.SparseReducer`).
    ``check_finite``: a NaN/Inf in this rank's local gradients fails its step with
    :data:`NONFINITE` in the error. Returns a new optimizer of a subclass of
    ``type(optimizer)`` built from its config, like Horovod's; :func:`aggregation_of` gives
    its :class:`~hetgrad.aggregate.Aggregation` (weight, reducer, timer).
    """
    compat.require_keras2("hetgrad.keras.DistributedOptimizer")
    base = type(optimizer)
    mixin = _WeightedGradientsLegacy if compat.is_legacy_optimizer(optimizer) else _WeightedGradients
    cls = type(f"HetgradDistributed{base.__name__}", (mixin, base), {})
    opt = cls.from_config(optimizer.get_config())
    name = name or "hetgrad"
    if reducer is None:
        reducer = DenseReducer(compression=compression, sparse_as_dense=sparse_as_dense,
                               name=name)
    opt.hetgrad = Aggregation(_weight_of(weight, plan, rank, opt.iterations, name), reducer,
                              check_finite=check_finite)
    return opt


def aggregation_of(optimizer) -> Aggregation:
    """The :class:`~hetgrad.aggregate.Aggregation` of a hetgrad optimizer."""
    agg = getattr(optimizer, "hetgrad", None)
    if not isinstance(agg, Aggregation):
        raise ValueError("not a hetgrad DistributedOptimizer")
    return agg


def set_plan(optimizer, plan) -> None:
    """Use ``plan``'s shares from the next step on (after a re-partition between epochs).

    A no-op for ``weight="samples"`` (it counts whatever arrives); a fixed float share cannot
    follow a new plan and raises."""
    weight = aggregation_of(optimizer).weight
    if isinstance(weight, PlanWeight):
        weight.update(plan)
    elif isinstance(weight, FixedWeight):
        raise ValueError("a fixed float weight cannot follow a new plan; use weight='plan'")


def count_samples(model) -> None:
    """Make each train step store its batch size in the optimizer's sample counter."""
    weight = aggregation_of(model.optimizer).weight
    if not isinstance(weight, SampleWeight):
        raise ValueError("model.optimizer is not a hetgrad DistributedOptimizer(weight='samples')")
    inner = model.train_step

    def train_step(data):
        x = data[0] if isinstance(data, (tuple, list)) else data
        weight.count.assign(tf.shape(tf.nest.flatten(x)[0])[0])
        return inner(data)

    model.train_step = train_step
    model.train_function = None  # rebuild with the new step


class WeightedMetricAverageCallback(compat.keras.callbacks.Callback):
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
