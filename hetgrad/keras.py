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
from .rebalance import StepTimer

BroadcastGlobalVariablesCallback = hvd_keras.callbacks.BroadcastGlobalVariablesCallback


NONFINITE = "hetgrad: non-finite local gradient"


def _assert_finite(grads: list) -> list:
    """Fail this rank's step (before the exchange) if a local gradient holds NaN or Inf."""
    values = [g.values if isinstance(g, tf.IndexedSlices) else g for g in grads if g is not None]
    finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in values])
    check = tf.debugging.Assert(finite, [NONFINITE])
    with tf.control_dependencies([check]):
        return [None if g is None else
                tf.IndexedSlices(tf.identity(g.values), g.indices, g.dense_shape)
                if isinstance(g, tf.IndexedSlices) else tf.identity(g) for g in grads]


class _Exchange:
    """Shared by both mixins: optional finiteness check, busy/wait timing, weighted sum."""

    _hetgrad_reduce: WeightedAllreduce
    hetgrad_timer: StepTimer
    hetgrad_check_finite: bool

    def _hetgrad_exchange(self, grads: list) -> list:
        if self.hetgrad_check_finite:
            grads = _assert_finite(grads)
        t_ready = self.hetgrad_timer.ready(grads)
        out = self._hetgrad_reduce.sum(grads)
        self.hetgrad_timer.done(t_ready, out)
        return out


class _WeightedGradients(_Exchange):
    """Mixin placed before a Keras optimizer class: the backward pass is seeded with this
    rank's weight ``w_i`` (free), then the weighted gradients are summed over ranks."""

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
        return list(zip(self._hetgrad_exchange(grads), var_list))


class _WeightedGradientsLegacy(_Exchange):
    """The same for ``tf.keras.optimizers.legacy.*`` (OptimizerV2): ``grad_loss`` seeds it."""

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        if grad_loss is not None:
            raise ValueError("hetgrad's DistributedOptimizer sets grad_loss itself")
        w = self._hetgrad_reduce.local_weight()
        gv = super()._compute_gradients(loss, var_list, grad_loss=w, tape=tape)
        grads = self._hetgrad_exchange([g for g, _ in gv])
        return list(zip(grads, [v for _, v in gv]))


class PlanWeight:
    """Per-step ``w_i`` from a partition plan: ``b_i / B`` in full steps and
    ``last_i / sum_j last_j`` in an epoch's partial final step. Exact, and needs no
    communication (every rank knows the plan); the step is read from ``iterations``.
    The shares live in variables, so :meth:`update` switches plans without retracing."""

    def __init__(self, plan, rank: int, iterations: tf.Variable):
        self.rank = rank
        self.iterations = iterations
        self.full = tf.Variable(0.0, trainable=False, name="hetgrad_full_share")
        self.last = tf.Variable(0.0, trainable=False, name="hetgrad_last_share")
        self.steps = tf.Variable(1, dtype=iterations.dtype, trainable=False,
                                 name="hetgrad_steps")
        self.update(plan)

    def update(self, plan) -> None:
        lasts = plan.last_batches()
        self.full.assign(plan.batches[self.rank] / plan.global_batch)
        self.last.assign(lasts[self.rank] / sum(lasts))
        self.steps.assign(plan.steps_per_epoch)

    def __call__(self) -> tf.Tensor:
        final = tf.equal(tf.math.floormod(self.iterations, self.steps), self.steps - 1)
        return tf.where(final, self.last, self.full)


def DistributedOptimizer(optimizer, weight="samples", *, plan=None, rank: int | None = None,
                         compression=hvd.Compression.none, sparse_as_dense: bool = False,
                         check_finite: bool = True, name: str | None = None):
    """Wrap a Keras optimizer so gradients are combined as ``sum_i (b_i/B) g_i``.

    ``weight``: this rank's share ``b_i / B`` (float, e.g. ``plan.weights()[hvd.rank()]``);
    ``"plan"`` with ``plan=`` (and ``rank=``, default ``hvd.rank()``) for exact per-step plan
    weights including the partial final step (no extra communication; one optimizer step per
    batch, counted by ``iterations`` from the start of an epoch; :func:`set_plan` switches
    plans); or ``"samples"`` to weight by the samples in each step, for data of unknown batch
    sizes (needs :func:`count_samples`, costs one scalar allreduce per step).
    ``check_finite``: a NaN/Inf in this rank's local gradients fails its step with
    :data:`NONFINITE` in the error (so the culprit rank is the one that reports it).
    Returns a new optimizer of a subclass of ``type(optimizer)`` built from its config, like
    Horovod's. ``optimizer.hetgrad_local_count`` is the per-step sample counter and
    ``optimizer.hetgrad_timer`` the :class:`~hetgrad.rebalance.StepTimer` of this rank.
    """
    base = type(optimizer)
    legacy = isinstance(optimizer, tf.keras.optimizers.legacy.Optimizer)
    mixin = _WeightedGradientsLegacy if legacy else _WeightedGradients
    cls = type(f"HetgradDistributed{base.__name__}", (mixin, base), {})
    opt = cls.from_config(optimizer.get_config())
    counter = None
    opts = dict(compression=compression, sparse_as_dense=sparse_as_dense, name=name or "hetgrad")
    if weight == "samples":
        counter = tf.Variable(0, dtype=tf.int32, trainable=False, name="hetgrad_local_count")
        reduce = WeightedAllreduce(local_count=counter, **opts)
    elif weight == "plan":
        if plan is None:
            raise ValueError("weight='plan' needs plan=")
        reduce = WeightedAllreduce(PlanWeight(plan, hvd.rank() if rank is None else rank,
                                              opt.iterations), **opts)
    elif isinstance(weight, (int, float)):
        reduce = WeightedAllreduce(float(weight), **opts)
    else:
        raise ValueError(f"weight must be a float share, 'plan' or 'samples', got {weight!r}")
    opt._hetgrad_reduce = reduce
    opt.hetgrad_local_count = counter
    opt.hetgrad_timer = StepTimer()
    opt.hetgrad_check_finite = bool(check_finite)
    return opt


def set_plan(optimizer, plan) -> None:
    """Use ``plan``'s shares from the next step on (after a re-partition between epochs).

    A no-op for ``weight="samples"`` (it counts whatever arrives); a fixed float share cannot
    follow a new plan and raises."""
    reduce = getattr(optimizer, "_hetgrad_reduce", None)
    if reduce is None:
        raise ValueError("not a hetgrad DistributedOptimizer")
    if isinstance(reduce.weight, PlanWeight):
        reduce.weight.update(plan)
    elif reduce.weight is not None:
        raise ValueError("a fixed float weight cannot follow a new plan; use weight='plan'")


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
