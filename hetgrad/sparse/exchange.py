"""How the ranks combine what they offer, with Horovod collectives in the graph.

Indices are global (tensor ``t``'s local index plus its offset), so one collective serves
every tensor. Each function returns, per tensor: the local indices this rank's memory
sent in full, the union of the indices (sorted, the same on every rank), the aggregate on
the union, and the dense aggregate."""
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


def union_of(gidx: tf.Tensor, name: str) -> tf.Tensor:
    """The sorted union of every rank's global indices (one allgather)."""
    return tf.sort(tf.unique(hvd.allgather(gidx, name=f"{name}.indices")).y)


def leaders_choice(gidx: tf.Tensor, is_leader: tf.Tensor, name: str) -> tf.Tensor:
    """The leader's sorted indices on every rank: an allreduce of them and of zeros."""
    mine = tf.where(is_leader, tf.sort(gidx), tf.zeros_like(gidx))
    return hvd.allreduce(mine, op=hvd.Sum, name=f"{name}.leader")


def reduce_on(union: tf.Tensor, accs: list[tf.Tensor], layout: Layout, name: str) -> Outcome:
    """Every rank's full value at every index of ``union``, summed by one allreduce."""
    local = layout.split_sorted(union)
    values = tf.concat([tf.gather(a, i) for a, i in zip(accs, local)], 0)
    total = hvd.allreduce(values, op=hvd.Sum, name=f"{name}.values")
    parts = tf.split(total, [tf.size(i) for i in local], num=len(local))
    dense = [tf.scatter_nd(tf.expand_dims(i, 1), v, [n])
             for i, v, n in zip(local, parts, layout.sizes)]
    return Outcome(local, local, parts, dense)


def gather_and_sum(idx: list[tf.Tensor], accs: list[tf.Tensor], layout: Layout,
                   name: str) -> Outcome:
    """Every rank's (index, value) pairs to every rank, summed locally: one allgather of
    the pairs, the float values carried bit for bit as int32 beside their indices."""
    gidx = tf.concat([i + off for i, off in zip(idx, layout.offsets)], 0)
    values = tf.concat([tf.gather(a, i) for a, i in zip(accs, idx)], 0)
    pairs = hvd.allgather(tf.stack([gidx, tf.bitcast(values, tf.int32)], axis=1),
                          name=f"{name}.pairs")
    every_idx, every_val = pairs[:, 0], tf.bitcast(pairs[:, 1], tf.float32)
    owner = tf.searchsorted(tf.constant(layout.offsets[1:], tf.int32), every_idx,
                            side="right")
    T = len(layout.sizes)
    local = tf.dynamic_partition(every_idx - tf.gather(layout.offsets, owner), owner, T)
    vals = tf.dynamic_partition(every_val, owner, T)
    dense = [tf.scatter_nd(tf.expand_dims(i, 1), v, [n])
             for i, v, n in zip(local, vals, layout.sizes)]
    union = [tf.sort(tf.unique(i).y) for i in local]
    return Outcome(idx, union, [tf.gather(d, u) for d, u in zip(dense, union)], dense)
