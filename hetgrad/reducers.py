"""How the ranks' weighted gradients are summed: the :class:`Reducer` interface (like a
PyTorch DDP communication hook) and :class:`DenseReducer`, Horovod's allreduces; the sparse
one is in :mod:`hetgrad.sparse`. :class:`~hetgrad.aggregate.Aggregation` calls them.
"""
from __future__ import annotations

from typing import Sequence

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf


class Reducer:
    """Sums already weighted gradients over the ranks. Subclasses with per-rank state (e.g.
    sparse residuals) return it from :meth:`state_dict` so checkpoints keep it.

    ``carries_count``: :meth:`reduce_with` sums per-rank numbers (the sample count) in the
    same exchange, exactly (uncompressed).
    ``check_local``: the finite check must look at each rank's own gradients before the
    exchange (the default checks the exchanged sum)."""

    carries_count = False
    check_local = False

    def reduce(self, grads: list) -> list:
        raise NotImplementedError

    def reduce_with(self, grads: list, extra: list) -> tuple[list, list]:
        """The summed gradients and the sums of the ``extra`` float32 vectors, riding the
        same exchange (reducers that cannot carry them do not define it)."""
        raise NotImplementedError

    def build(self, shapes) -> None:
        """Create per-rank state for gradients of these shapes now (before a restore)."""

    def state_dict(self) -> dict[str, np.ndarray]:
        return {}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Continue from :meth:`state_dict`; stateless reducers accept only empty state."""
        if state:
            raise ValueError(f"{type(self).__name__} keeps no state, got {sorted(state)}")


class DenseReducer(Reducer):
    """Dense gradients through ``op=Sum`` allreduces, one per tensor as Horovod's optimizer
    does (Horovod fuses them in its background thread, and a gradient the backward pass
    produced early is exchanged while the pass goes on), or one ``grouped_allreduce`` with
    ``grouped`` (waits for the last gradient: 6-10 % slower per step at 1 M parameters on 2
    ranks, docs/results.md); ``tf.IndexedSlices`` (embeddings) are allgathered, as Horovod
    does, unless ``sparse_as_dense``."""

    def __init__(self, *, compression=hvd.Compression.none, sparse_as_dense: bool = False,
                 grouped: bool = False, name: str = "hetgrad"):
        self.compression = compression
        self.sparse_as_dense = sparse_as_dense
        self.grouped = grouped
        self.name = name
        # a count in fp16 is exact only up to 2048: carried only when uncompressed
        self.carries_count = compression is hvd.Compression.none

    def reduce(self, grads: Sequence) -> list:
        return self._reduce(grads, [])[0]

    def reduce_with(self, grads, extra):
        # the extras wait for the gradients, so Horovod fuses their exchange with theirs
        # instead of negotiating it alone at the start of the step
        ready = [g for g in grads if g is not None and not isinstance(g, tf.IndexedSlices)]
        with tf.control_dependencies(ready):
            extra = [tf.identity(e) for e in extra]
        return self._reduce(grads, extra)

    def _reduce(self, grads: Sequence, extra: list) -> tuple[list, list]:
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
        summed = self._sum([out[i] for i in dense_idx] + extra)
        for i, r in zip(dense_idx, summed):
            out[i] = r
        return out, summed[len(dense_idx):]

    def _sum(self, tensors: list) -> list:
        if not tensors:
            return []
        if self.grouped:
            return hvd.grouped_allreduce(tensors, op=hvd.Sum, compression=self.compression,
                                         name=f"{self.name}.dense")
        return [hvd.allreduce(t, op=hvd.Sum, compression=self.compression,
                              name=f"{self.name}.dense{i}") for i, t in enumerate(tensors)]
