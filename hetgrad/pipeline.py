"""This rank's input pipeline for one epoch: its shard of the plan, in an order seeded by
``(seed, rank, epoch)``, so a resumed run sees exactly the batches an uninterrupted one would
(and a new plan after a rebalance takes effect at once)."""
from __future__ import annotations

import tensorflow as tf

from .partition import Plan


def epoch_batches(xy, plan: Plan, rank: int, seed: int, epoch) -> tf.data.Dataset:
    """Batches of ``plan.batches[rank]`` from ``rank``'s shard of ``xy`` (a tensor or a
    nested structure of tensors of equal length, e.g. ``(x, y)`` or ``({"a": a}, y)``)."""
    order = shard_order(plan.shard_sizes[rank], plan.shard_starts[rank], seed, rank, epoch)
    return (tf.data.Dataset.from_tensor_slices(order)
            .batch(plan.batches[rank])
            .map(lambda idx: tf.nest.map_structure(lambda t: tf.gather(t, idx), xy))
            .prefetch(2))


def shard_order(n: int, start: int, seed: int, rank: int, epoch) -> tf.Tensor:
    """A permutation of the shard ``[start, start + n)``, a pure function of
    ``(seed, rank, epoch)`` (``epoch`` may be a tensor: ``hk.shard`` draws one per epoch)."""
    key = tf.stack([tf.constant(seed * 65_537 + rank, tf.int64), tf.cast(epoch, tf.int64)])
    return tf.argsort(tf.random.stateless_uniform([n], seed=key)) + start


def batch_size_at(plan: Plan, rank: int, step: int) -> int:
    """Samples of ``rank`` in ``step`` of an epoch (the last step may be partial)."""
    return plan.last_batches()[rank] if step == plan.steps_per_epoch - 1 else plan.batches[rank]
