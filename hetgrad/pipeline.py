"""This rank's input pipeline for one epoch: its shard of the plan, in an order seeded by
``(seed, rank, epoch)``, so a resumed run sees exactly the batches an uninterrupted one would
(and a new plan after a rebalance takes effect at once)."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from .partition import Plan


def epoch_batches(xy: tuple[tf.Tensor, tf.Tensor], plan: Plan, rank: int, seed: int,
                  epoch: int) -> tf.data.Dataset:
    """Batches of ``plan.batches[rank]`` from ``rank``'s shard of the tensors ``xy``."""
    x, y = xy
    lo, n = plan.shard_starts[rank], plan.shard_sizes[rank]
    order = np.random.default_rng([seed, rank, epoch]).permutation(n) + lo
    return (tf.data.Dataset.from_tensor_slices(order)
            .batch(plan.batches[rank])
            .map(lambda idx: (tf.gather(x, idx), tf.gather(y, idx)))
            .prefetch(2))


def batch_size_at(plan: Plan, rank: int, step: int) -> int:
    """Samples of ``rank`` in ``step`` of an epoch (the last step may be partial)."""
    return plan.last_batches()[rank] if step == plan.steps_per_epoch - 1 else plan.batches[rank]
