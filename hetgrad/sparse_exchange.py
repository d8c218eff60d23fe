"""Sparse aggregation as a :class:`~hetgrad.aggregate.Reducer`, so ``model.fit`` runs it
exactly like the dense exchange (same weights, finite check, timers, callbacks).

Tensors with at least ``dense_below`` entries are concatenated into one flat vector and
exchanged by :class:`~hetgrad.sparsify.SparseExchanger` (top-k with error feedback, numpy on
the control channel of :mod:`hetgrad.comm`), called from the train step through ``tf.py_function``; smaller tensors (biases) go
through the dense fused allreduce. The gradients arrive already weighted (the backward pass is
seeded with ``w_i``), so the exchanger sums them with weight 1.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf

from .aggregate import DenseReducer, Reducer
from .sparsify import SparseExchanger, StepStats


class SparseReducer(Reducer):
    """``sizes``: entries of each trainable variable, in the order the gradients come."""

    def __init__(self, comm, sizes: Sequence[int], *, policy: str = "topk",
                 density: float = 0.01, exchange: str = "union", dense_below: int = 1024,
                 name: str = "hetgrad"):
        self.sizes = [int(n) for n in sizes]
        self.sparse_ids = [i for i, n in enumerate(self.sizes) if n >= dense_below]
        self.dense_ids = [i for i, n in enumerate(self.sizes) if n < dense_below]
        self.exchanger = SparseExchanger(comm, [self.sizes[i] for i in self.sparse_ids],
                                         policy=policy, density=density, exchange=exchange)
        self.dense = DenseReducer(name=name)
        self.log: list[StepStats] = []

    def reduce(self, grads: Sequence) -> list:
        out: list = list(grads)
        if self.sparse_ids:
            parts = [tf.zeros([self.sizes[i]]) if grads[i] is None else
                     tf.reshape(tf.convert_to_tensor(grads[i]), [-1]) for i in self.sparse_ids]
            flat = tf.concat(parts, 0)
            agg = tf.py_function(self._step, [flat], tf.float32)
            agg.set_shape(flat.shape)
            pieces = tf.split(agg, [self.sizes[i] for i in self.sparse_ids])
            for i, piece in zip(self.sparse_ids, pieces):
                if grads[i] is not None:
                    out[i] = tf.reshape(piece, grads[i].shape)
        if self.dense_ids:
            small = self.dense.reduce([grads[i] for i in self.dense_ids])
            for i, g in zip(self.dense_ids, small):
                out[i] = g
        return out

    def _step(self, flat: tf.Tensor) -> np.ndarray:
        agg, stats = self.exchanger.step(flat.numpy(), 1.0)
        self.log.append(stats)
        return agg

    def take_log(self) -> list[StepStats]:
        """The statistics of the steps since the last call (k, union, bytes, ...)."""
        log, self.log = self.log, []
        return log

    def state_dict(self) -> dict[str, np.ndarray]:
        return self.exchanger.state_dict()

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self.exchanger.load_state_dict(state)
