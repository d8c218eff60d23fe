"""Top-k gradient sparsification with error feedback and aggregation-aware selection.

Three separate concerns, each swappable:

- :class:`Residuals` (memory): error feedback; what a rank did not send is kept and added to its
  next gradient, optionally with DGC-style momentum correction.
- selection policies (:data:`POLICIES`): which k entries each rank offers. ``topk`` looks only at
  magnitudes; ``recent`` and ``sticky`` favour indices the *global union* chose lately so that
  ranks agree; ``leader`` lets one rank (cyclic) choose for everyone (ScaleCom's CLT-k).
- exchanges (:data:`EXCHANGES`): ``allgather`` (values + indices of every rank, summed locally)
  or ``union`` (allgather indices, then one dense allreduce over the union U of every rank's
  compensated values at U, so the residual keeps only what was truly not sent).

All ranks work on one flat float32 vector (the concatenation of the gradients that are large
enough to sparsify); k is chosen per tensor (density x size) and the index space is global.
The exchange runs on the ranks' control channel (:mod:`hetgrad.comm`: mpi4py, or Horovod's
collectives under Gloo) between the gradient computation and ``apply_gradients``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .errors import ConfigError, InputFileError

F32 = 4  # bytes per value
I32 = 4  # bytes per index


class Residuals:
    """Error-feedback memory over a flat vector: ``acc = residual + g`` and, after sending,
    ``residual = acc - sent``. With ``momentum > 0``, DGC momentum correction: a velocity
    ``u = m u + g`` is accumulated instead of ``g`` and both are cleared where sent."""

    def __init__(self, size: int, momentum: float = 0.0):
        self.residual = np.zeros(size, np.float32)
        self.momentum = float(momentum)
        self.velocity = np.zeros(size, np.float32) if momentum else None

    def compensate(self, grad: np.ndarray) -> np.ndarray:
        if self.velocity is not None:
            self.velocity *= self.momentum
            self.velocity += grad
            return self.residual + self.velocity
        return self.residual + grad

    def update(self, acc: np.ndarray, sent_idx: np.ndarray) -> None:
        """Keep the part of ``acc`` that was not sent (``sent_idx`` were sent in full)."""
        self.residual = acc.copy()
        self.residual[sent_idx] = 0.0
        if self.velocity is not None:
            self.velocity[sent_idx] = 0.0


@dataclass
class SelectionState:
    """What every rank knows about past rounds: the last global union and when each index
    was last in a union (for ``recent``)."""

    size: int
    step: int = 0
    prev_union: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    last_chosen: np.ndarray | None = None

    def __post_init__(self):
        if self.last_chosen is None:
            self.last_chosen = np.full(self.size, -10**9, np.int64)

    def record(self, union: np.ndarray) -> None:
        self.prev_union = union
        self.last_chosen[union] = self.step
        self.step += 1


def _top(scores: np.ndarray, k: int) -> np.ndarray:
    if k >= scores.size:
        return np.arange(scores.size)
    return np.argpartition(scores, scores.size - k)[scores.size - k:]


@dataclass
class Segments:
    """Per-tensor slices of the flat vector and each one's k."""

    offsets: list[int]
    sizes: list[int]
    ks: list[int]

    @classmethod
    def of(cls, sizes: Sequence[int], density: float) -> "Segments":
        offsets = list(np.cumsum([0, *sizes[:-1]]))
        ks = [max(1, int(np.ceil(density * s))) for s in sizes]
        return cls([int(o) for o in offsets], list(sizes), ks)

    @property
    def k(self) -> int:
        return sum(self.ks)

    def select(self, scores: np.ndarray) -> np.ndarray:
        """Global indices of the top-k scores within each tensor."""
        return np.concatenate([o + _top(scores[o:o + s], k)
                               for o, s, k in zip(self.offsets, self.sizes, self.ks)])


def select_topk(acc, seg: Segments, state: SelectionState, **_) -> np.ndarray:
    return seg.select(np.abs(acc))


def select_recent(acc, seg: Segments, state: SelectionState, *, window: int = 5,
                  boost: float = 2.0, **_) -> np.ndarray:
    """Magnitude, multiplied by ``boost`` for indices in a global union of the last ``window``
    steps: entries that were large recently tend to stay large."""
    score = np.abs(acc)
    recent = state.step - state.last_chosen <= window
    score[recent] *= boost
    return seg.select(score)


def select_sticky(acc, seg: Segments, state: SelectionState, *, fresh: float = 0.1,
                  **_) -> np.ndarray:
    """Take ``(1 - fresh) k`` entries per tensor from the previous global union (largest first)
    and only the rest from elsewhere by magnitude."""
    score = np.abs(acc)
    if state.prev_union.size:
        # lift every previous-union entry above every other one, order kept within each group
        lifted = score.copy()
        lifted[state.prev_union] += score.max() + 1.0
        picks = []
        for o, s, k in zip(seg.offsets, seg.sizes, seg.ks):
            k_old = int(np.floor((1 - fresh) * k))
            old = o + _top(lifted[o:o + s], k_old) if k_old else np.zeros(0, np.int64)
            rest = score[o:o + s].copy()
            rest[old - o] = -1.0
            picks.append(np.concatenate([old, o + _top(rest, k - k_old)]))
        return np.concatenate(picks)
    return seg.select(score)


POLICIES: dict[str, Callable] = {"topk": select_topk, "recent": select_recent,
                                 "sticky": select_sticky, "leader": select_topk}
EXCHANGES = ("allgather", "union")


@dataclass
class StepStats:
    k: int
    union: int
    buildup: float
    bytes_sent: int
    bytes_received: int
    aggregator_send_entries: int


class SparseExchanger:
    """One rank's side of the sparse aggregation of a flat gradient vector.

    ``step(grad, weight)`` returns the aggregate ``sum_i weight_i * grad_i`` as the ranks'
    sparse contributions (exact on the selected entries), plus the step's statistics.
    """

    def __init__(self, comm, sizes: Sequence[int], *, policy: str = "topk", density: float = 0.01,
                 exchange: str = "union", momentum: float = 0.0, **policy_args):
        if policy not in POLICIES:
            raise ConfigError(f"unknown policy {policy!r}; choose from {sorted(POLICIES)}",
                              field="sparsify")
        if exchange not in EXCHANGES:
            raise ConfigError(f"unknown exchange {exchange!r}; choose from {EXCHANGES}",
                              field="exchange")
        if not 0.0 < density <= 1.0:
            raise ConfigError(f"density must be in (0, 1], got {density}", field="density")
        self.comm = comm
        self.policy, self.exchange = policy, exchange
        self.seg = Segments.of(list(sizes), density)
        n = sum(sizes)
        self.memory = Residuals(n, momentum)
        self.state = SelectionState(n)
        self.policy_args = policy_args

    def state_dict(self) -> dict[str, np.ndarray]:
        """This rank's memory and selection history, for a checkpoint."""
        d = {"residual": self.memory.residual, "step": np.int64(self.state.step),
             "prev_union": self.state.prev_union, "last_chosen": self.state.last_chosen}
        if self.memory.velocity is not None:
            d["velocity"] = self.memory.velocity
        return d

    def load_state_dict(self, d) -> None:
        """Continue from :meth:`state_dict` (bit for bit)."""
        if d["residual"].shape != self.memory.residual.shape:
            raise InputFileError(f"checkpointed residual has {d['residual'].size} entries, the "
                                 f"model's sparse tensors {self.memory.residual.size}",
                                 field="resume")
        self.memory.residual = np.array(d["residual"], np.float32)
        if self.memory.velocity is not None:
            self.memory.velocity = np.array(d["velocity"], np.float32)
        self.state.step = int(d["step"])
        self.state.prev_union = np.array(d["prev_union"], np.int64)
        self.state.last_chosen = np.array(d["last_chosen"], np.int64)

    def _choose(self, acc: np.ndarray) -> np.ndarray:
        if self.policy == "leader":  # the cyclic leader decides the mask for everyone
            leader = self.state.step % self.comm.size
            mine = select_topk(acc, self.seg, self.state) if self.comm.rank == leader else None
            return np.sort(self.comm.bcast(mine, root=leader))
        return np.sort(POLICIES[self.policy](acc, self.seg, self.state, **self.policy_args))

    def step(self, grad: np.ndarray, weight: float) -> tuple[np.ndarray, StepStats]:
        size = self.comm.size
        acc = self.memory.compensate(np.asarray(grad, np.float32) * np.float32(weight))
        idx = self._choose(acc).astype(np.int32)
        k = self.seg.k
        out = np.zeros_like(acc)
        if self.policy == "leader":
            union = idx
            out[union] = self.comm.allreduce_sum(acc[union])
            sent = union
            sent_b = k * F32 + (k * I32 if self.comm.rank == self.state.step % size else 0)
            recv_b = k * F32 + k * I32
        elif self.exchange == "allgather":
            all_idx = np.concatenate(self.comm.allgather(idx))
            all_vals = np.concatenate(self.comm.allgather(acc[idx]))
            np.add.at(out, all_idx, all_vals)
            union = np.unique(all_idx)
            sent = idx
            sent_b = idx.size * (F32 + I32)
            recv_b = (all_idx.size - idx.size) * (F32 + I32)
        else:  # union: agree on U, then one dense allreduce over U
            union = np.unique(np.concatenate(self.comm.allgather(idx)))
            out[union] = self.comm.allreduce_sum(acc[union])
            sent = union
            ring = 2 * (size - 1) / size  # ring allreduce moves this many vectors per rank
            sent_b = idx.size * I32 + int(ring * union.size * F32)
            recv_b = (size - 1) * idx.size * I32 + int(ring * union.size * F32)
        self.memory.update(acc, sent)
        self.state.record(union.astype(np.int64))
        stats = StepStats(k=k, union=int(union.size), buildup=union.size / k,
                          bytes_sent=int(sent_b), bytes_received=int(recv_b),
                          aggregator_send_entries=int(union.size))
        return out, stats
