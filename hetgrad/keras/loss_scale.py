"""Mixed precision with hetgrad: the ``LossScaleOptimizer`` belongs *inside* hetgrad's
optimizer. Then every rank exchanges its (scaled, weighted) gradients first and the loss scale
judges the exchanged sum, the same on every rank: a step that overflows anywhere is skipped
everywhere and the scale stays agreed. The other way round -- Keras wraps one around the
optimizer it is given at ``compile`` under ``mixed_float16`` -- the rank that overflows would
skip the exchange the others wait in, for ever.

:func:`inside_loss_scale` puts the loss scale inside when hetgrad's optimizer is made under a
``mixed_float16`` policy (Keras then wraps nothing); :func:`hetgrad_outermost` turns a model's
``LossScaleOptimizer(hetgrad)`` -- the policy set after the optimizer was made, or the user's
own wrapping -- the right way round before its first step (hetgrad's callbacks, ``hk.fit`` and
``hk.probe`` call it).
"""
from __future__ import annotations

from .. import compat


def inside_loss_scale(optimizer):
    """``optimizer`` in a ``LossScaleOptimizer`` under a ``mixed_float16`` global policy
    (unless it is one already)."""
    if compat.mixed_float16() and not compat.is_loss_scale_optimizer(optimizer):
        return compat.loss_scale_optimizer(optimizer)
    return optimizer


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
    from .optimizer import DistributedOptimizer
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
