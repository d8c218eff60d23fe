"""Keras drop-ins, used like ``horovod.tensorflow.keras`` (``import hetgrad.keras as hvd``)::

    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))          # weight="samples"
    model.compile(optimizer=opt, loss=...)
    model.fit(ds, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                             hvd.callbacks.MetricAverageCallback()])

and :func:`fit`, the whole pipeline in one call. Works on every Keras flavour hetgrad supports
(:mod:`hetgrad.compat`), on Horovod's ``horovod.tensorflow`` collectives only.

This package is the public face only: the implementation is :mod:`hetgrad._keras` (which
hetgrad's own modules use, never this package) and :mod:`hetgrad.keras.fitting` (``fit``, a
front end over :mod:`hetgrad.assembly` like ``hetgrad train``).
"""
from __future__ import annotations

from horovod.tensorflow import (Average, Compression, Sum, allgather, allreduce, broadcast,
                                broadcast_variables, init, is_initialized, local_rank,
                                local_size, rank, shutdown, size)

from .._keras.counting import count_samples
from ..data.reader import shard
from .._keras.optimizer import (DistributedOptimizer, PartialDistributedOptimizer,
                                aggregation_of, set_plan)
from .._keras.probing import probe
from .._keras.replicas import replicas_agree
from .._keras.saving import load_model
from ..aggregate import NONFINITE
from ..sparse import Sparsify
from . import callbacks, elastic
from .fitting import fit

__all__ = ["DistributedOptimizer", "PartialDistributedOptimizer", "Sparsify", "probe", "shard", "fit", "set_plan", "count_samples",
           "replicas_agree", "aggregation_of", "callbacks", "elastic", "load_model", "NONFINITE",
           "init",
           "is_initialized", "shutdown", "rank", "size",
           "local_rank", "local_size", "allreduce", "allgather", "broadcast",
           "broadcast_variables", "Compression", "Average", "Sum",
           "BroadcastGlobalVariablesCallback", "WeightedMetricAverageCallback"]

# the names Horovod users import from the module itself
BroadcastGlobalVariablesCallback = callbacks.BroadcastGlobalVariablesCallback
WeightedMetricAverageCallback = callbacks.MetricAverageCallback
