"""Models saved with hetgrad's optimizer name the optimizer's own class (any Keras loads them);
:func:`load_model` loads one with hetgrad's optimizer around the saved one, state carried
over, to train on."""
from __future__ import annotations

from .. import compat
from .optimizer import DistributedOptimizer


def load_model(filepath, *, custom_objects: dict | None = None, compile: bool = True,
               **optimizer_args):
    """``keras.models.load_model``, then the model's optimizer wrapped in
    :func:`DistributedOptimizer` (``optimizer_args`` as there) with its saved state (slots,
    iterations, loss scale): it trains on with hetgrad's weights. Models saved with a hetgrad
    optimizer name the optimizer's own class, so plain Keras loads them too."""
    objects = dict(custom_objects or {})
    for name in dir(compat.keras.optimizers):   # files saved by hetgrad before 2026-12-05
        base = getattr(compat.keras.optimizers, name)
        if isinstance(base, type) and issubclass(base, compat.keras.optimizers.Optimizer):
            objects.setdefault(f"HetgradDistributed{base.__name__}", base)
    model = compat.keras.models.load_model(filepath, custom_objects=objects, compile=compile)
    if compile and getattr(model, "optimizer", None) is not None:
        _rewrap(model, optimizer_args)
    return model


def _rewrap(model, optimizer_args: dict) -> None:
    """Compile ``model`` again with its optimizer wrapped by hetgrad, state carried over."""
    saved = model.optimizer
    compat.build_optimizer(saved, model.trainable_variables)
    wrapped = DistributedOptimizer(saved, **optimizer_args)
    compat.build_optimizer(wrapped, model.trainable_variables)
    for mine, theirs in zip(compat.optimizer_variables(wrapped),
                            compat.optimizer_variables(saved), strict=True):
        mine.assign(theirs)
    compat.recompile(model, wrapped)
