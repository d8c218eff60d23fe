"""Keras drop-ins, used like ``horovod.tensorflow.keras`` (``import hetgrad.keras as hvd``)::

    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))          # weight="samples"
    model.compile(optimizer=opt, loss=...)
    model.fit(ds, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                             hvd.callbacks.MetricAverageCallback()])

Works on every Keras flavour hetgrad supports (:mod:`hetgrad.compat`), on Horovod's
``horovod.tensorflow`` collectives only. The aggregation itself (weights, exchange, finite
check, timers) is :mod:`hetgrad.aggregate`; :mod:`.optimizer` hooks it into the optimizer.
"""
from __future__ import annotations

from horovod.tensorflow import (Average, Compression, Sum, allgather, allreduce, broadcast,
                                broadcast_variables, init, is_initialized, local_rank,
                                local_size, rank, shutdown, size)

from .. import compat
from ..aggregate import NONFINITE
from ..sparse import Sparsify
from . import callbacks
from .counting import count_samples
from .data import shard
from .optimizer import DistributedOptimizer, aggregation_of, set_plan
from .probing import probe
from .replicas import replicas_agree

__all__ = ["DistributedOptimizer", "Sparsify", "probe", "shard", "fit", "set_plan", "count_samples",
           "replicas_agree", "aggregation_of", "callbacks", "load_model", "NONFINITE", "init",
           "is_initialized", "shutdown", "rank", "size",
           "local_rank", "local_size", "allreduce", "allgather", "broadcast",
           "broadcast_variables", "Compression", "Average", "Sum",
           "BroadcastGlobalVariablesCallback", "WeightedMetricAverageCallback"]


def __getattr__(name: str):
    """``fit`` on first use (:mod:`.fitting` builds on the training loop, which uses this
    module's callbacks and optimizer)."""
    if name == "fit":
        from .fitting import fit
        return fit
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# the names Horovod users import from the module itself
BroadcastGlobalVariablesCallback = callbacks.BroadcastGlobalVariablesCallback
WeightedMetricAverageCallback = callbacks.MetricAverageCallback


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
