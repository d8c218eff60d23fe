"""``DistributedOptimizer``: hooks an :class:`~hetgrad.aggregate.Aggregation` into the
optimizer class of the running Keras flavour.

Where the flavour lets us, the backward pass is *seeded* with this rank's weight ``w_i``
(free): Keras 2 through ``compute_gradients`` (``grad_loss`` for the legacy OptimizerV2), Keras
3 through ``scale_loss``, which its train step applies inside the tape. Gradients that reach
``apply_gradients``/``apply`` without that (a custom train step, ``LossScaleOptimizer`` around
the wrapped optimizer) are weighted there instead, so no path skips the exchange.
"""
from __future__ import annotations

import warnings

import horovod.tensorflow as hvd
import tensorflow as tf

from .. import compat
from ..aggregate import (Aggregation, DenseReducer, FixedWeight, PlanWeight, Reducer,
                         SampleWeight, scaled)
from ..sparse.reducer import SparseReducer
from ..sparse.settings import Sparsify


class _Hooked:
    """What every flavour's mixin shares: weight (unless the pass was seeded), then exchange
    -- or, with ``backward_passes_per_step`` N > 1, add to local accumulators and exchange
    and apply once every N steps. ``_hetgrad_seeded`` is Python state of the trace (set and
    cleared within one traced step)."""

    hetgrad: Aggregation
    _hetgrad_seeded = False
    _hetgrad_passes = 1
    _hetgrad_average_passes = False
    _hetgrad_acc: list | None = None

    def _hetgrad_weighted(self, grads) -> list:
        seeded, self._hetgrad_seeded = self._hetgrad_seeded, False
        return list(grads) if seeded else scaled(grads, self.hetgrad.local_weight())

    def _hetgrad_apply(self, grads, variables, apply_fn):
        """``apply_fn(exchanged_grads)`` now, or every N-th step on the accumulated sum."""
        grads = self._hetgrad_weighted(grads)
        if self._hetgrad_passes == 1:
            return apply_fn(self.hetgrad.exchange(grads))
        self._hetgrad_build(variables)
        acc, count = self._hetgrad_acc
        count.assign_add(1)
        for a, g in zip(acc, grads):
            if g is not None:
                a.assign_add(tf.convert_to_tensor(g))
        scale = 1.0 / self._hetgrad_passes if self._hetgrad_average_passes else 1.0

        def update():
            summed = [None if g is None else a * scale for a, g in zip(acc, grads)]
            apply_fn(self.hetgrad.exchange(summed))
            for a in acc:
                a.assign(tf.zeros_like(a))
            return tf.constant(True)

        def skip():  # the step still counts (plan weights read the step from iterations)
            self.iterations.assign_add(1)
            return tf.constant(False)

        return tf.cond(tf.equal(count % self._hetgrad_passes, 0), update, skip)

    def _hetgrad_build(self, variables) -> None:
        """Accumulators, and the optimizer's own slots (no variable may be born in a cond)."""
        with tf.init_scope():
            if self._hetgrad_acc is None:
                self._hetgrad_acc = (
                    [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False)
                     for v in compat.tf_variables(variables)],
                    tf.Variable(0, dtype=tf.int64, trainable=False))
            compat.build_optimizer(self, variables)


class _Keras2(_Hooked):
    """Keras 2.11+ optimizers: ``minimize`` calls ``compute_gradients`` (seeded here) then
    ``apply_gradients`` (exchanged here, as is a custom train step's)."""

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
        self._hetgrad_seeded = True
        return list(zip(grads, var_list))

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        if not grads_and_vars:  # nothing to exchange; Keras treats it as a no-op
            return super().apply_gradients(grads_and_vars, *args, **kwargs)
        grads, variables = zip(*grads_and_vars)
        apply = super().apply_gradients
        return self._hetgrad_apply(
            grads, variables, lambda g: apply(zip(g, variables), *args, **kwargs))


class _Keras2Legacy(_Keras2):
    """Keras 2's ``optimizers.legacy.*`` (OptimizerV2): ``grad_loss`` seeds the pass."""

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        if grad_loss is not None:
            raise ValueError("hetgrad's DistributedOptimizer sets grad_loss itself")
        gv = super()._compute_gradients(loss, var_list, grad_loss=self.hetgrad.local_weight(),
                                        tape=tape)
        self._hetgrad_seeded = True
        return gv


class _Keras3(_Hooked):
    """Keras 3 optimizers: the train step calls ``scale_loss`` inside the tape, then
    ``apply_gradients`` -> ``apply``."""

    def scale_loss(self, loss):
        self._hetgrad_seeded = True
        return super().scale_loss(loss) * tf.cast(self.hetgrad.local_weight(), loss.dtype)

    def apply(self, grads, trainable_variables=None):
        variables = (trainable_variables if trainable_variables is not None
                     else self._trainable_variables)
        apply = super().apply
        return self._hetgrad_apply(grads, variables, lambda g: apply(g, trainable_variables))


MIXINS = {"keras3": _Keras3, "keras2": _Keras2, "legacy": _Keras2Legacy}


def _weight_of(weight, plan, rank: int | None, iterations, name: str, fuse_count: bool):
    if weight is None:
        weight = "samples" if plan is None else "plan"
    if weight == "samples":
        return SampleWeight(name, fused=fuse_count)
    if weight == "plan":
        if plan is None:
            raise ValueError("weight='plan' needs plan=")
        return PlanWeight(plan, hvd.rank() if rank is None else rank, iterations)
    if isinstance(weight, (int, float)) and not isinstance(weight, bool):
        return FixedWeight(weight)
    raise ValueError(f"weight must be a float share, 'plan' or 'samples', got {weight!r}")


ONE_INTER_OP_THREAD = (
    "hetgrad: TF has 1 inter-op thread, so a gradient's exchange waits behind the backward "
    "pass (25 M parameters: 10-20 % slower steps); call "
    "tf.config.threading.set_inter_op_parallelism_threads(2) (docs/results.md#overhead)")


def _check_inter_op_threads() -> None:
    """Warn (rank 0, once) where the exchange cannot overlap compute."""
    if tf.config.threading.get_inter_op_parallelism_threads() == 1 and hvd.rank() == 0:
        warnings.warn(ONE_INTER_OP_THREAD, RuntimeWarning, stacklevel=3)


def DistributedOptimizer(optimizer, weight=None, *, plan=None, rank: int | None = None,
                         reducer: Reducer | None = None, sparsify=None,
                         compression=hvd.Compression.none,
                         sparse_as_dense: bool = False, check_finite: bool | None = None,
                         backward_passes_per_step: int = 1,
                         average_aggregated_gradients: bool = False, name: str | None = None):
    """Wrap a Keras optimizer so gradients are combined as ``sum_i w_i g_i``.

    ``weight``: ``"samples"`` (the default without ``plan=``) weights each rank by the samples
    of the step, exact for any batch sizes, at one scalar allreduce per step (the batch size is
    recorded by :func:`count_samples`, which hetgrad's callbacks install in ``fit``);
    ``"plan"`` (the default with ``plan=``; ``rank=``, default ``hvd.rank()``) uses the plan's
    exact per-step shares, partial final step included, with no extra communication
    (:func:`set_plan` switches plans); a float is a fixed share ``b_i / B``. ``reducer``: the
    exchange (default :class:`~hetgrad.aggregate.DenseReducer` with ``compression`` and
    ``sparse_as_dense``); ``sparsify`` (a policy name or a :class:`hetgrad.sparse.Sparsify`)
    makes it the in-graph top-k exchange with error feedback instead.
    ``check_finite`` (default on, off for a ``LossScaleOptimizer``, which skips non-finite
    steps itself): a NaN/Inf in this rank's local gradients fails its step with
    :data:`~hetgrad.aggregate.NONFINITE`. ``backward_passes_per_step`` N: accumulate N steps'
    weighted gradients locally, exchange and apply their sum (their mean with
    ``average_aggregated_gradients``) every N-th step, as Horovod does. Returns a new
    optimizer of a subclass of ``type(optimizer)`` built from its config, like Horovod's; its
    ``from_config`` keeps the aggregation.
    """
    args = dict(weight=weight, plan=plan, rank=rank, reducer=reducer, sparsify=sparsify,
                compression=compression,
                sparse_as_dense=sparse_as_dense, check_finite=check_finite,
                backward_passes_per_step=backward_passes_per_step,
                average_aggregated_gradients=average_aggregated_gradients, name=name)
    if int(backward_passes_per_step) != backward_passes_per_step or backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be an integer >= 1, got "
                         f"{backward_passes_per_step}")
    base = type(optimizer)
    mixin = MIXINS[compat.optimizer_kind(optimizer)]
    cls = type(f"HetgradDistributed{base.__name__}", (mixin, base),
               {"from_config": classmethod(
                   lambda c, config, custom_objects=None:
                   DistributedOptimizer(base.from_config(config), **args))})
    opt = super(cls, cls).from_config(optimizer.get_config())  # base's from_config, as cls
    name = name or "hetgrad"
    if check_finite is None:
        check_finite = not compat.is_loss_scale_optimizer(opt)
    if reducer is not None and sparsify is not None:
        raise ValueError("give DistributedOptimizer a reducer or sparsify=, not both")
    if sparsify is not None:
        reducer = SparseReducer(sparsify if isinstance(sparsify, Sparsify)
                                else Sparsify(sparsify), name=name)
    elif reducer is None:
        reducer = DenseReducer(compression=compression, sparse_as_dense=sparse_as_dense,
                               name=name)
    opt._hetgrad_passes = int(backward_passes_per_step)
    opt._hetgrad_average_passes = bool(average_aggregated_gradients)
    fuse_count = reducer.carries_count and opt._hetgrad_passes == 1
    opt.hetgrad = Aggregation(_weight_of(weight, plan, rank, opt.iterations, name, fuse_count),
                              reducer, check_finite=check_finite)
    _check_inter_op_threads()
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
