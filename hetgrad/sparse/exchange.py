"""How the ranks combine what they offer, with Horovod collectives in the graph.

Indices are global (tensor ``t``'s local index plus its offset), so one collective serves
every tensor; the small tensors (biases), sent whole, ride in the same collective as an
``extra`` flat vector, so a step has no separate allreduce for them. Each function returns,
per tensor: the local indices this rank's memory sent in full, the union of the indices
(sorted, the same on every rank), the aggregate on the union, and the dense aggregate; and
the sum of ``extra`` over the ranks."""
from __future__ import annotations

from typing import NamedTuple

import horovod.tensorflow as hvd
import tensorflow as tf


class Layout(NamedTuple):
    """Where each sparsified tensor sits in the global index space."""

    sizes: list[int]
    offsets: list[int]

    @classmethod
    def of(cls, sizes: list[int]) -> "Layout":
        offsets = [0]
        for n in sizes[:-1]:
            offsets.append(offsets[-1] + n)
        return cls(list(sizes), offsets)

    def split_sorted(self, union: tf.Tensor) -> list[tf.Tensor]:
        """A sorted global index vector cut into each tensor's local indices."""
        bounds = tf.searchsorted(union, tf.constant(self.offsets + [sum(self.sizes)], tf.int32))
        counts = bounds[1:] - bounds[:-1]
        parts = tf.split(union, counts, num=len(self.sizes))
        return [p - off for p, off in zip(parts, self.offsets)]


class Outcome(NamedTuple):
    sent: list[tf.Tensor]
    union: list[tf.Tensor]
    aggregate: list[tf.Tensor]
    dense: list[tf.Tensor]
    extra: tf.Tensor      # the ranks' ``extra`` vectors summed


def reduce_all(accs: list[tf.Tensor], extra: tf.Tensor, layout: Layout, name: str) -> Outcome:
    """Every entry of every rank, summed by one allreduce (a dense step)."""
    total = hvd.allreduce(tf.concat([*accs, extra], 0), op=hvd.Sum, name=f"{name}.all")
    *parts, extra_sum = tf.split(total, [*layout.sizes, int(extra.shape[0])],
                                 num=len(layout.sizes) + 1)
    every = [tf.range(n, dtype=tf.int32) for n in layout.sizes]
    return Outcome(every, every, parts, parts, extra_sum)


def union_of(gidx: tf.Tensor, name: str) -> tf.Tensor:
    """The sorted union of every rank's global indices (one allgather)."""
    return tf.sort(tf.unique(hvd.allgather(gidx, name=f"{name}.indices")).y)


def leaders_choice(gidx: tf.Tensor, is_leader: tf.Tensor, name: str) -> tf.Tensor:
    """The leader's sorted indices on every rank: an allreduce of them and of zeros."""
    mine = tf.where(is_leader, tf.sort(gidx), tf.zeros_like(gidx))
    return hvd.allreduce(mine, op=hvd.Sum, name=f"{name}.leader")


def reduce_on(union: tf.Tensor, accs: list[tf.Tensor], extra: tf.Tensor, layout: Layout,
              name: str) -> Outcome:
    """Every rank's full value at every index of ``union``, and its ``extra``, summed by one
    allreduce."""
    local = layout.split_sorted(union)
    values = tf.concat([*(tf.gather(a, i) for a, i in zip(accs, local)), extra], 0)
    total = hvd.allreduce(values, op=hvd.Sum, name=f"{name}.values")
    *parts, extra_sum = tf.split(total, [*(tf.size(i) for i in local), tf.size(extra)],
                                 num=len(local) + 1)
    dense = [tf.scatter_nd(tf.expand_dims(i, 1), v, [n])
             for i, v, n in zip(local, parts, layout.sizes)]
    return Outcome(local, local, parts, dense, extra_sum)


def gather_and_sum(idx: list[tf.Tensor], accs: list[tf.Tensor], extra: tf.Tensor,
                   layout: Layout, name: str) -> Outcome:
    """Every rank's (index, value) pairs to every rank, summed locally: one allgather of
    the pairs, the float values carried bit for bit as int32 beside their indices. The
    ``extra`` entries go as pairs too, at the indices after the sparsified tensors'."""
    total, m = sum(layout.sizes), int(extra.shape[0])
    gidx = tf.concat([*(i + off for i, off in zip(idx, layout.offsets)),
                      tf.range(total, total + m, dtype=tf.int32)], 0)
    values = tf.concat([*(tf.gather(a, i) for a, i in zip(accs, idx)), extra], 0)
    pairs = hvd.allgather(tf.stack([gidx, tf.bitcast(values, tf.int32)], axis=1),
                          name=f"{name}.pairs")
    every_idx, every_val = pairs[:, 0], tf.bitcast(pairs[:, 1], tf.float32)
    starts = layout.offsets + [total]          # part T: the extra entries
    owner = tf.searchsorted(tf.constant(starts[1:], tf.int32), every_idx, side="right")
    T = len(layout.sizes)
    local = tf.dynamic_partition(every_idx - tf.gather(starts, owner), owner, T + 1)
    vals = tf.dynamic_partition(every_val, owner, T + 1)
    *dense, extra_sum = [tf.scatter_nd(tf.expand_dims(i, 1), v, [n])
                         for i, v, n in zip(local, vals, [*layout.sizes, m])]
    union = [tf.sort(tf.unique(i).y) for i in local[:T]]
    return Outcome(idx, union, [tf.gather(d, u) for d, u in zip(dense, union)], dense,
                   extra_sum)
