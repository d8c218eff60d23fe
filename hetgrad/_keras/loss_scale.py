"""Mixed precision with hetgrad: the ``LossScaleOptimizer`` belongs *inside* hetgrad's
optimizer. Then every rank exchanges its (scaled, weighted) gradients first and the loss scale
judges the exchanged sum, the same on every rank: a step that overflows anywhere is skipped
everywhere and the scale stays agreed. The other way round -- Keras wraps one around the
optimizer it is given at ``compile`` under ``mixed_float16`` -- the rank that overflows would
skip the exchange the others wait in, for ever.

:func:`inside_loss_scale` puts the loss scale inside when hetgrad's optimizer is made under a
``mixed_float16`` policy (Keras then wraps nothing);
:func:`hetgrad._keras.optimizer.hetgrad_outermost` turns a model's
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
