"""Which entries of each tensor a rank offers: exact top-k (through DGC's sampled threshold
for big tensors) and the selection policies, each with its own per-tensor state."""
from __future__ import annotations

import math

import tensorflow as tf

from .settings import Sparsify

SAMPLE_SHARE = 0.01   # DGC samples about 1 % of a big tensor to estimate its threshold


def _prime_at_least(n: int) -> int:
    n = max(2, n)
    while any(n % p == 0 for p in range(2, math.isqrt(n) + 1)):
        n += 1
    return n


def top_indices(score: tf.Tensor, k: tf.Tensor, sample_above: int) -> tf.Tensor:
    """Local int32 indices of the ``k`` largest entries of the flat ``score`` (any order;
    ties go to the lower index). Tensors of ``sample_above`` entries or more use DGC's
    sampled threshold: a strided ~1 % sample gives a threshold a little below the k-th
    largest, and the exact top-k is taken among the entries above it (the full top-k when
    fewer than ``k`` are): the same set as ``tf.math.top_k``, 5-10x faster on a CPU."""
    n = int(score.shape[0])
    if n < sample_above:
        return tf.math.top_k(score, k, sorted=False).indices
    stride = _prime_at_least(int(1 / SAMPLE_SHARE))
    sample = score[::stride]
    m = int(sample.shape[0])
    want = tf.cast(tf.math.ceil(1.25 * tf.cast(k, tf.float32) * m / n), tf.int32) + 3
    threshold = tf.reduce_min(tf.math.top_k(sample, tf.minimum(want, m), sorted=False).values)
    candidates = tf.cast(tf.where(score >= threshold)[:, 0], tf.int32)

    def among_candidates():
        best = tf.math.top_k(tf.gather(score, candidates), k, sorted=False).indices
        return tf.gather(candidates, best)

    return tf.cond(tf.size(candidates) >= k, among_candidates,
                   lambda: tf.math.top_k(score, k, sorted=False).indices)


class Policy:
    """Chooses the local indices a rank offers in tensor ``t``; :meth:`observe` sees the
    exchange's outcome there (the union's local indices and the aggregate on them)."""

    def __init__(self, settings: Sparsify, sizes: list[int], rank: int, size: int):
        self.settings, self.sizes, self.rank, self.size = settings, sizes, rank, size

    def select(self, t: int, acc: tf.Tensor, k: tf.Tensor, fresh: tf.Tensor,
               step: tf.Tensor) -> tf.Tensor:
        return top_indices(tf.abs(acc), k, self.settings.sample_above)

    def observe(self, t: int, union: tf.Tensor, aggregate: tf.Tensor, step: tf.Tensor) -> None:
        pass

    def variables(self) -> dict[str, tf.Variable]:
        return {}


class Recent(Policy):
    """Magnitude x ``boost`` where the entry was in a global union in the last ``window``
    exchanges: entries that were large lately tend to stay large, so ranks agree more."""

    def __init__(self, *args):
        super().__init__(*args)
        self.last = [tf.Variable(tf.fill([n], tf.int32.min // 2), trainable=False,
                                 name=f"hetgrad_last_chosen_{t}")
                     for t, n in enumerate(self.sizes)]

    def select(self, t, acc, k, fresh, step):
        s = self.settings
        recent = step - self.last[t] <= s.window
        score = tf.abs(acc) * tf.where(recent, s.boost, 1.0)
        return top_indices(score, k, s.sample_above)

    def observe(self, t, union, aggregate, step):
        self.last[t].scatter_nd_update(tf.expand_dims(union, 1), tf.fill(tf.shape(union), step))

    def variables(self):
        return {f"last_chosen_{t}": v for t, v in enumerate(self.last)}


def _growing(dtype, name: str) -> tf.Variable:
    return tf.Variable(tf.zeros([0], dtype), shape=tf.TensorShape([None]), trainable=False,
                       name=name)


class Sticky(Policy):
    """``k - fresh`` entries of the last union with the largest last *aggregate* -- known
    alike on every rank, so every rank keeps the same ones -- and ``fresh`` by local magnitude
    elsewhere: ``|U| <= k (1 + (P - 1) fresh / k)``."""

    def __init__(self, *args):
        super().__init__(*args)
        self.prev = [(_growing(tf.int32, f"hetgrad_prev_union_{t}"),
                      _growing(tf.float32, f"hetgrad_prev_aggregate_{t}"))
                     for t in range(len(self.sizes))]

    def select(self, t, acc, k, fresh, step):
        union, aggregate = self.prev[t]
        n_keep = tf.minimum(k - fresh, tf.size(union))
        keep = tf.gather(union.value(), tf.math.top_k(tf.abs(aggregate), n_keep).indices)
        score = tf.tensor_scatter_nd_update(tf.abs(acc), tf.expand_dims(keep, 1),
                                            -tf.ones_like(keep, tf.float32))
        return tf.concat([keep, top_indices(score, k - n_keep, self.settings.sample_above)], 0)

    def observe(self, t, union, aggregate, step):
        self.prev[t][0].assign(union)
        self.prev[t][1].assign(aggregate)

    def variables(self):
        out = {f"prev_union_{t}": u for t, (u, _) in enumerate(self.prev)}
        out.update({f"prev_aggregate_{t}": a for t, (_, a) in enumerate(self.prev)})
        return out


class Leader(Policy):
    """Rank ``step mod P`` takes its top-k; the exchange makes its choice everyone's."""

    def select(self, t, acc, k, fresh, step):
        return tf.cond(tf.equal(step % self.size, self.rank),
                       lambda: super(Leader, self).select(t, acc, k, fresh, step),
                       lambda: tf.zeros([k], tf.int32))


POLICIES = {"topk": Policy, "recent": Recent, "sticky": Sticky, "leader": Leader}
