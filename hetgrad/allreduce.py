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

from typing import Callable, Sequence

import horovod.tensorflow as hvd
import tensorflow as tf


class WeightedAllreduce:
    """Weighted sum of the ranks' gradients (dense or ``tf.IndexedSlices``).

    ``weight`` is this rank's ``b_i / B`` (a float, or a callable giving it per step) for plan
    weighting, or ``None`` for sample
    weighting, where ``local_count`` (a scalar variable) must hold the samples of the current
    step; then ``w_i = n_i / sum_j n_j`` (one scalar allreduce). The fast path is to seed the
    backward pass with ``w_i`` (``tape.gradient(..., output_gradients=w_i)``), which costs
    nothing, and :meth:`sum` the result; ``__call__`` scales given gradients instead.
    ``sparse_as_dense`` densifies IndexedSlices; otherwise they are allgathered, as Horovod does.
    """

    def __init__(self, weight: float | Callable[[], tf.Tensor] | None = None, *,
                 local_count: tf.Variable | None = None,
                 compression=hvd.Compression.none, sparse_as_dense: bool = False,
                 name: str = "hetgrad"):
        if weight is None and local_count is None:
            raise ValueError("give weight (plan weighting) or local_count (sample weighting)")
        if weight is not None and not callable(weight) and not (0.0 < float(weight) <= 1.0):
            raise ValueError(f"weight must be in (0, 1], got {weight}")
        self.weight = weight if weight is None or callable(weight) else float(weight)
        self.local_count = local_count
        self.compression = compression
        self.sparse_as_dense = sparse_as_dense
        self.name = name

    def local_weight(self) -> tf.Tensor:
        """This rank's ``w_i`` for the current step (weights sum to 1 over ranks)."""
        if callable(self.weight):
            return tf.cast(self.weight(), tf.float32)
        if self.weight is not None:
            return tf.constant(self.weight, tf.float32)
        n = tf.cast(tf.reshape(self.local_count, [1]), tf.float32)
        total = hvd.allreduce(n, op=hvd.Sum, name=f"{self.name}.count")
        return (n / total)[0]

    def sum(self, grads: Sequence[tf.Tensor | tf.IndexedSlices | None]) -> list:
        """``sum_i`` of already weighted gradients: one fused group for the dense ones."""
        out: list = list(grads)
        dense_idx = []
        for i, g in enumerate(grads):
            if g is None:
                continue
            if isinstance(g, tf.IndexedSlices) and self.sparse_as_dense:
                g = out[i] = tf.convert_to_tensor(g)
            if isinstance(g, tf.IndexedSlices):  # allgathered values + indices
                out[i] = hvd.allreduce(g, op=hvd.Sum, name=f"{self.name}.sparse{i}")
            else:
                dense_idx.append(i)
        if dense_idx:
            reduced = hvd.grouped_allreduce([out[i] for i in dense_idx], op=hvd.Sum,
                                            compression=self.compression,
                                            name=f"{self.name}.dense")
            for i, r in zip(dense_idx, reduced):
                out[i] = r
        return out

    def __call__(self, grads: Sequence[tf.Tensor | tf.IndexedSlices | None]) -> list:
        """Scale unweighted per-rank mean gradients by ``w_i`` and sum them."""
        w = self.local_weight()

        def scale(g):
            if g is None:
                return None
            if isinstance(g, tf.IndexedSlices):
                return tf.IndexedSlices(g.values * tf.cast(w, g.values.dtype), g.indices,
                                        g.dense_shape)
            return g * tf.cast(w, g.dtype)

        return self.sum([scale(g) for g in grads])
