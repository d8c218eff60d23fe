"""The one-line switch for ``horovod.tensorflow`` (``import hetgrad.tensorflow as hvd``) in
custom training loops::

    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    tape = hvd.DistributedGradientTape(tape)                 # weight="samples"
    grads = tape.gradient(loss, model.trainable_variables, samples=len(x))
    opt.apply_gradients(zip(grads, model.trainable_variables))
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables, root_rank=0)

``DistributedGradientTape`` returns ``sum_i w_i g_i`` (:class:`hetgrad.tape.DistributedGradientTape`:
``samples=`` or ``weight=``/``plan=`` make uneven batches exact; without them the ranks weigh
equally, as Horovod's average). ``broadcast_variables`` takes Keras 3 variables too. Every
other name of ``horovod.tensorflow`` (``allgather_object``, ``join``, ``elastic``,
``SyncBatchNormalization``, ...) is Horovod's own, looked up there.
"""
from __future__ import annotations

import horovod.tensorflow as _hvd
import tensorflow as tf
from horovod.tensorflow import (Adasum, Average, Compression, Sum, allgather, allreduce,
                                alltoall, broadcast, init, is_initialized, local_rank,
                                local_size, mpi_threads_supported, rank, shutdown, size)
from tensorflow.python.ops.resource_variable_ops import is_resource_variable

from ..compat import tf_variables
from ..tape import DistributedGradientTape


def broadcast_variables(variables, root_rank: int = 0) -> None:
    """Set every rank's ``variables`` to ``root_rank``'s (Keras 2 or 3 variables, tf.Variables,
    an optimizer's ``variables`` -- a list or its method). In place where Horovod can
    (:func:`in_place`): one op, nothing traced; else Horovod's default, a traced function
    assigning each (0.2-0.35 s of a 4-rank job's first fit on 2 cores, 8 variables)."""
    if callable(variables):
        variables = variables()
    variables = tf_variables(list(variables))
    _hvd.broadcast_variables(variables, root_rank=root_rank, inplace=in_place(variables))


IN_PLACE_DTYPES = (tf.float16, tf.float32, tf.float64, tf.int32, tf.int64)


def in_place(variables) -> bool:
    """Whether Horovod's in-place broadcast takes these tf.Variables: outside a traced
    function (inside, its op per device may be named apart on different ranks), resource
    variables of the common dtypes, each of its own name (it keys each tensor by its
    variable's name: two unnamed tf.Variables, or a Keras 3 subclassed model's kernels,
    would collide). Every rank answers alike: Horovod broadcasts by name either way, so
    the names must be the same on every rank."""
    names = [v.name for v in variables]
    return (tf.executing_eagerly() and len(set(names)) == len(names)
            and all(is_resource_variable(v) and v.dtype in IN_PLACE_DTYPES for v in variables))


def __getattr__(name: str):
    """Any other ``horovod.tensorflow`` name, as Horovod has it."""
    try:
        return getattr(_hvd, name)
    except AttributeError:
        raise AttributeError(f"module 'hetgrad.tensorflow' has no attribute {name!r} (nor "
                             "has horovod.tensorflow)") from None


__all__ = ["DistributedGradientTape", "broadcast_variables", "init", "is_initialized",
           "shutdown", "rank", "size", "local_rank", "local_size", "mpi_threads_supported",
           "allreduce", "allgather", "alltoall", "broadcast", "Compression", "Average", "Sum",
           "Adasum"]
