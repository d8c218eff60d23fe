"""``DistributedOptimizer``: an :class:`~hetgrad.aggregate.Aggregation` hooked into the
optimizer class of the running Keras flavour (:mod:`.hooks`), and what keeps it outermost:
mixed precision's ``LossScaleOptimizer`` goes inside it (:mod:`.loss_scale`), so every rank
exchanges before the loss scale decides, and a step that overflows on one rank is skipped on
all of them."""
from __future__ import annotations

import warnings

import horovod.tensorflow as hvd
import tensorflow as tf

from .. import compat
from ..aggregate import Aggregation, FixedWeight, PlanWeight, new_step_counter
from ..reducers import DenseReducer, Reducer
from ..sparse.reducer import SparseReducer
from ..sparse.settings import Sparsify
from ..weights import horovod_weight, make_weight
from .counting import count_on_compile
from .found import aggregation_in, aggregation_of
from .hooks import hooked_class
from .loss_scale import inside_loss_scale


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
                         average_aggregated_gradients: bool = False, name: str | None = None,
                         **horovod_keywords):
    """Wrap a Keras optimizer so gradients are combined as ``sum_i w_i g_i``.

    ``weight``: ``"samples"`` (the default without ``plan=``) weights each rank by the samples
    of the step, exact for any batch sizes (Keras' train step of a model compiled with this
    optimizer records them; where none does, the ranks weigh equally and rank 0 says so);
    ``"plan"`` (the default with ``plan=``; ``rank=``, default ``hvd.rank()``) uses the plan's
    exact per-step shares, partial final step included, with no extra communication
    (:func:`set_plan` switches plans); a float is a fixed share ``b_i / B``. ``reducer``: the
    exchange (default :class:`~hetgrad.reducers.DenseReducer` with ``compression`` and
    ``sparse_as_dense``); ``sparsify`` (a policy name or a :class:`hetgrad.sparse.Sparsify`)
    makes it the in-graph top-k exchange with error feedback instead.
    ``check_finite`` (off by default, as in Horovod, and under a loss scale; ``hk.fit`` and
    ``hetgrad train`` turn it on for the optimizer they wrap): a NaN/Inf in this rank's local
    gradients fails its step with :data:`~hetgrad.aggregate.NONFINITE`, naming the rank. ``backward_passes_per_step`` N: accumulate N steps'
    weighted gradients locally, exchange and apply their sum (their mean with
    ``average_aggregated_gradients``) every N-th step, as Horovod does.

    Mixed precision: under a ``mixed_float16`` policy the optimizer is first wrapped in a
    ``LossScaleOptimizer`` (Keras would wrap one around hetgrad's at ``compile``), so the loss
    scale sees the exchanged gradients: a step that overflows on any rank is skipped on every
    rank, and the scale stays the same everywhere (:mod:`.loss_scale`).

    Returns a new optimizer of a subclass of ``type(optimizer)`` built from its config, like
    Horovod's, under the same class name (a saved model loads in any Keras, without hetgrad);
    its ``from_config`` keeps the aggregation.
    Horovod's other keywords: :func:`horovod_weight`; ``register_local_var(var)`` keeps a
    variable's gradient on its rank.
    """
    weight = horovod_weight(weight, **horovod_keywords)
    args = dict(weight=weight, plan=plan, rank=rank, reducer=reducer, sparsify=sparsify,
                compression=compression,
                sparse_as_dense=sparse_as_dense, check_finite=check_finite,
                backward_passes_per_step=backward_passes_per_step,
                average_aggregated_gradients=average_aggregated_gradients, name=name)
    if int(backward_passes_per_step) != backward_passes_per_step or backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be an integer >= 1, got "
                         f"{backward_passes_per_step}")
    if aggregation_in(optimizer) is not None:
        raise ValueError("the optimizer is already a hetgrad DistributedOptimizer")
    optimizer = inside_loss_scale(optimizer)   # mixed_float16: the loss scale goes inside
    base = type(optimizer)
    cls = hooked_class(base, compat.optimizer_kind(optimizer),
                       lambda config: DistributedOptimizer(base.from_config(config), **args))
    opt = super(cls, cls).from_config(optimizer.get_config())  # base's from_config, as cls
    opt._hetgrad_args = args
    opt._hetgrad_passes = int(backward_passes_per_step)
    opt._hetgrad_average_passes = bool(average_aggregated_gradients)
    opt.hetgrad = _aggregation(opt, weight, plan, rank, reducer, sparsify, compression,
                               sparse_as_dense, check_finite, name or "hetgrad")
    _check_inter_op_threads()
    count_on_compile(compat.keras.Model)   # Keras' train steps record their batch size
    return opt


def PartialDistributedOptimizer(optimizer, name: str | None = None, local_layers=None,
                                **kwargs):
    """:func:`DistributedOptimizer` whose ``local_layers``' trainable variables keep their
    gradients on each rank (Horovod's ``PartialDistributedOptimizer``)."""
    opt = DistributedOptimizer(optimizer, name=name, **kwargs)
    for layer in local_layers or ():
        for var in layer.trainable_weights:
            opt.register_local_var(var)
    return opt


def _aggregation(opt, weight, plan, rank, reducer, sparsify, compression, sparse_as_dense,
                 check_finite, name) -> Aggregation:
    """The aggregation of the new optimizer ``opt`` (see :func:`DistributedOptimizer`)."""
    loss_scaled = compat.is_loss_scale_optimizer(opt)
    # off by default (Horovod's behaviour), and under a loss scale, which skips such steps
    check_finite = bool(check_finite) and not loss_scaled
    if reducer is not None and sparsify is not None:
        raise ValueError("give DistributedOptimizer a reducer or sparsify=, not both")
    if sparsify is not None:
        reducer = SparseReducer(sparsify if isinstance(sparsify, Sparsify)
                                else Sparsify(sparsify), name=name)
    elif reducer is None:
        reducer = DenseReducer(compression=compression, sparse_as_dense=sparse_as_dense,
                               name=name)
    step = new_step_counter()
    # the count rides in the exchange by seeding the pass with n_i, not w_i <= 1: not under a
    # loss scale (n_i times larger float16 gradients overflow where one process would not)
    fuse_count = reducer.carries_count and opt._hetgrad_passes == 1 and not loss_scaled
    return Aggregation(make_weight(weight, plan, rank, step, name, fuse_count), reducer,
                       check_finite=check_finite, step=step,
                       skip_together=loss_scaled and reducer.check_local)


def set_plan(optimizer, plan) -> None:
    """Use ``plan``'s shares from the next step on (after a re-partition between epochs).

    A no-op for ``weight="samples"`` (it counts whatever arrives); a fixed float share cannot
    follow a new plan and raises."""
    weight = aggregation_of(optimizer).weight
    if isinstance(weight, PlanWeight):
        weight.update(plan)
    elif isinstance(weight, FixedWeight):
        raise ValueError("a fixed float weight cannot follow a new plan; use weight='plan'")


def start_plan(optimizer, plan) -> None:
    """:func:`set_plan` at a run's start, where a fixed share (the plain average, a float the
    user gave) is kept as given rather than refused."""
    if not isinstance(aggregation_of(optimizer).weight, FixedWeight):
        set_plan(optimizer, plan)


def hetgrad_outermost(model) -> bool:
    """If ``model``'s optimizer is a ``LossScaleOptimizer`` around a hetgrad optimizer, compile
    the model again with hetgrad's around a new ``LossScaleOptimizer`` of the same settings;
    whether it did. An optimizer that has taken steps cannot be rearranged (its state would
    be lost): that is an error naming the fix."""
    outer = getattr(model, "optimizer", None)
    if not compat.is_loss_scale_optimizer(outer):
        return False
    inner = compat.inner_optimizer(outer)
    if getattr(inner, "hetgrad", None) is None:
        return False
    if compat.optimizer_variables(outer) and int(outer.iterations.numpy()) > 0:
        raise ValueError(
            "a LossScaleOptimizer wraps hetgrad's DistributedOptimizer and has taken steps: a "
            "rank whose step overflows would skip the exchange the others wait in. Wrap the "
            "other way round: hk.DistributedOptimizer(LossScaleOptimizer(opt)), or make hetgrad's "
            "optimizer after setting the mixed_float16 policy")
    if compat.is_loss_scale_optimizer(inner):   # hetgrad's has a loss scale already
        compat.recompile(model, inner)
        return True
    base = inner._hetgrad_base.from_config(inner.get_config())
    hetgrad = DistributedOptimizer(compat.loss_scale_optimizer(base, like=outer),
                                   **inner._hetgrad_args)
    hetgrad.hetgrad = inner.hetgrad.loss_scaled()   # the same weight, exchange and steps
    compat.recompile(model, hetgrad)
    if model.built:   # (Keras builds the optimizer before the step is traced)
        compat.build_optimizer(hetgrad, model.trainable_variables)
    return True
