"""Weighted gradient aggregation: ``sum_i (b_i / B) g_i`` on Horovod.

Horovod refuses a different ``prescale_factor`` per rank, so each rank scales its own gradients
locally and the scaled tensors are reduced with ``op=hvd.Sum`` in one fused group.

Two weightings:
- ``plan``: the fixed share ``b_i / B`` from the partition plan.
- ``samples``: the samples actually in this step. Each rank sends ``n_i * g_i`` and ``n_i`` in the
  same group and divides by ``sum n_i`` afterwards, so a partial final batch stays exact at no
  extra round trip.
"""
from __future__ import annotations

from typing import Sequence

import horovod.tensorflow as hvd
import tensorflow as tf


class WeightedAllreduce:
    """Callable that aggregates a list of gradients (dense or ``tf.IndexedSlices``).

    ``weight`` is this rank's ``b_i / B`` (a float) for plan weighting, or ``None`` for sample
    weighting, where ``local_count`` (a scalar tensor or variable) must hold the samples of the
    current step. ``sparse_as_dense`` densifies IndexedSlices before the reduce; otherwise they
    are allgathered (values scaled first), as Horovod does.
    """

    def __init__(self, weight: float | None = None, *, local_count: tf.Variable | None = None,
                 compression=hvd.Compression.none, sparse_as_dense: bool = False,
                 name: str = "hetgrad"):
        if weight is None and local_count is None:
            raise ValueError("give weight (plan weighting) or local_count (sample weighting)")
        if weight is not None and not (0.0 < float(weight) <= 1.0):
            raise ValueError(f"weight must be in (0, 1], got {weight}")
        self.weight = None if weight is None else float(weight)
        self.local_count = local_count
        self.compression = compression
        self.sparse_as_dense = sparse_as_dense
        self.name = name

    def _local_scale(self) -> tf.Tensor:
        if self.weight is not None:
            return tf.constant(self.weight, tf.float32)
        return tf.cast(self.local_count, tf.float32)

    def __call__(self, grads: Sequence[tf.Tensor | tf.IndexedSlices | None]) -> list:
        if hvd.size() == 1 and self.weight is not None:
            return list(grads)
        scale = self._local_scale()
        dense_idx, sparse_idx, dense = [], [], []
        for i, g in enumerate(grads):
            if g is None:
                continue
            if isinstance(g, tf.IndexedSlices) and self.sparse_as_dense:
                g = tf.convert_to_tensor(g)
            if isinstance(g, tf.IndexedSlices):
                sparse_idx.append(i)
            else:
                dense_idx.append(i)
                dense.append(g * tf.cast(scale, g.dtype))
        counted = self.weight is None
        if counted:  # the normaliser travels in the same fused group
            dense.append(tf.reshape(scale, [1]))
        out: list = list(grads)
        if dense:
            reduced = hvd.grouped_allreduce(dense, op=hvd.Sum, compression=self.compression,
                                            name=f"{self.name}.dense")
        else:
            reduced = []
        total = reduced.pop()[0] if counted else None
        for i, r in zip(dense_idx, reduced):
            out[i] = r / tf.cast(total, r.dtype) if counted else r
        for i in sparse_idx:
            g = grads[i]
            if counted and not dense:
                raise ValueError("sample weighting needs at least one dense gradient")
            values = g.values * tf.cast(scale, g.values.dtype)
            if counted:
                values = values / tf.cast(total, values.dtype)
            summed = hvd.allreduce(tf.IndexedSlices(values, g.indices, g.dense_shape),
                                   op=hvd.Sum, name=f"{self.name}.sparse{i}")
            out[i] = summed
        return out


def plain_average(grads: Sequence[tf.Tensor]) -> list:
    """What Horovod does: ``(1/P) sum_i g_i`` (biased when local batches differ)."""
    return hvd.grouped_allreduce(list(grads), op=hvd.Average)
