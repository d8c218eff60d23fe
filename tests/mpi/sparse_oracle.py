"""A numpy re-statement of :mod:`hetgrad.sparse` (test oracle only, never on a training path):
the same selection, exchanges and memory on a flat vector, exchanged through
:mod:`hetgrad.comm`'s control channel. Tests feed it and the graph path the same gradients."""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from hetgrad.sparse import Sparsify


def _top(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest scores; ties to the lower index (as ``tf.math.top_k``)."""
    order = np.argsort(-scores, kind="stable")
    return np.sort(order[:k])


class OracleExchanger:
    """One rank's sparse exchange of a flat vector made of tensors of ``sizes`` entries."""

    def __init__(self, comm, sizes: Sequence[int], settings: Sparsify):
        self.comm, self.s = comm, settings
        self.sizes = list(sizes)
        self.offsets = [int(o) for o in np.cumsum([0, *self.sizes[:-1]])]
        n = sum(self.sizes)
        self.residual = np.zeros(n, np.float32)
        self.velocity = np.zeros(n, np.float32) if settings.momentum else None
        self.step = 0
        self.last = np.full(n, np.iinfo(np.int32).min // 2, np.int64)
        self.prev = [(np.zeros(0, np.int64), np.zeros(0, np.float32)) for _ in self.sizes]
        self.set_density(settings.density_at(0))

    def set_density(self, density: float) -> None:
        self.ks = [self.s.k_of(n, density) for n in self.sizes]
        self.dense = self.s.dense_at(density)

    def _pieces(self, v):
        return [v[o:o + n] for o, n in zip(self.offsets, self.sizes)]

    def _select(self, t: int, acc: np.ndarray) -> np.ndarray:
        s, k = self.s, self.ks[t]
        score = np.abs(acc)
        if s.policy == "recent":
            o = self.offsets[t]
            recent = self.step - self.last[o:o + len(acc)] <= s.window
            score = np.where(recent, score * np.float32(s.boost), score)
        if s.policy != "sticky":
            return _top(score, k)
        union, aggregate = self.prev[t]
        n_keep = min(k - s.fresh_of(k), union.size)
        keep = union[np.argsort(-np.abs(aggregate), kind="stable")[:n_keep]]
        score[keep] = -1.0
        return np.concatenate([keep, _top(score, k - n_keep)])

    def step_once(self, grad: np.ndarray) -> tuple[np.ndarray, int]:
        """The aggregate of every rank's (already weighted) ``grad``, and |U|."""
        s, comm = self.s, self.comm
        grad = np.asarray(grad, np.float32)
        if s.clip_norm is not None:
            limit = s.clip_norm / math.sqrt(comm.size)
            norm = float(np.sqrt(np.sum(grad.astype(np.float64) ** 2)))
            grad = grad * np.float32(limit / max(norm, limit))
        if self.velocity is not None:
            self.velocity = np.float32(s.momentum) * self.velocity + grad
            grad = self.velocity
        acc = self.residual + grad
        if self.dense:   # a dense warm-up step: everything, velocity kept
            union = np.arange(acc.size)
            out = comm.allreduce_sum(acc)
            self.residual = np.zeros_like(acc)
            self._observe(union, out)
            return out, int(union.size)
        parts = self._pieces(acc)
        idx = np.concatenate([o + self._select(t, a) for t, (o, a)
                              in enumerate(zip(self.offsets, parts))]).astype(np.int64)
        out = np.zeros_like(acc)
        if s.policy == "leader":
            mine = np.sort(idx) if self.step % comm.size == comm.rank else np.zeros_like(idx)
            union = comm.allreduce_sum(mine)
            out[union] = comm.allreduce_sum(acc[union])
            sent = union
        elif s.exchange == "allgather":
            every = np.concatenate(comm.allgather(idx))
            np.add.at(out, every, np.concatenate(comm.allgather(acc[idx])))
            union, sent = np.unique(every), idx
        else:
            union = np.unique(np.concatenate(comm.allgather(idx)))
            out[union] = comm.allreduce_sum(acc[union])
            sent = union
        self.residual = acc.copy()
        self.residual[sent] = 0.0
        if self.velocity is not None and s.mask_momentum:
            self.velocity[sent] = 0.0
        self._observe(union, out)
        return out, int(union.size)

    def _observe(self, union: np.ndarray, out: np.ndarray) -> None:
        self.last[union] = self.step
        for t, (o, n) in enumerate(zip(self.offsets, self.sizes)):
            mine = union[(union >= o) & (union < o + n)]
            self.prev[t] = (mine - o, out[mine])
        self.step += 1
