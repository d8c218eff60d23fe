"""Where hetgrad's :class:`~hetgrad.aggregate.Aggregation` sits in an optimizer: on a hetgrad
``DistributedOptimizer``, or on the one a ``LossScaleOptimizer`` wraps."""
from __future__ import annotations

from .. import compat
from ..aggregate import Aggregation


def aggregation_of(optimizer) -> Aggregation:
    """The :class:`~hetgrad.aggregate.Aggregation` of a hetgrad optimizer."""
    agg = getattr(optimizer, "hetgrad", None)
    if not isinstance(agg, Aggregation):
        raise ValueError("not a hetgrad DistributedOptimizer")
    return agg


def aggregation_in(optimizer) -> Aggregation | None:
    """The aggregation of ``optimizer`` if it is hetgrad's, or of the one a
    ``LossScaleOptimizer`` wraps; None if neither is."""
    agg = getattr(optimizer, "hetgrad", None)
    if agg is None and compat.is_loss_scale_optimizer(optimizer):
        agg = getattr(compat.inner_optimizer(optimizer), "hetgrad", None)
    return agg
