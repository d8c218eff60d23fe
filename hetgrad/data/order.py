"""The one global order of a run. For epoch ``e`` a permutation ``pi_e`` of all ``N`` sample
indices (an index shuffle: no table of ``N`` entries is ever built); step ``k`` is the global
batch at positions ``[kB, (k+1)B)`` of ``pi_e`` -- the last step the tail, split the way the
plan in effect splits it -- and rank ``i`` reads the contiguous slice at offset
``o_i = b_0 + ... + b_{i-1}`` of length ``b_i``, ``b`` the batches of the plan in effect at
that step. So the samples of every step depend only on ``(seed, epoch, step)``: not on the
world size, the plan, nor on a re-plan -- only who computes which part of a step does. A
run's place in its data is ``(seed, epoch, step)``, the same on every rank."""
from __future__ import annotations

from ..partition import Plan


def step_span(plan: Plan, rank: int, step: int) -> tuple[int, int]:
    """``(first position, length)`` of ``rank``'s slice of ``step`` in the epoch's order."""
    last = step == plan.steps_per_epoch - 1
    sizes = plan.last_batches() if last else plan.batches
    return step * plan.global_batch + sum(sizes[:rank]), sizes[rank]


def rank_spans(plan: Plan, rank: int, first: int = 0,
               stop: int | None = None) -> tuple[list[int], list[int]]:
    """``rank``'s slices of steps ``first`` .. ``stop - 1`` (default: to the epoch's end), as
    lists of first positions and lengths."""
    steps = range(first, plan.steps_per_epoch if stop is None else stop)
    spans = [step_span(plan, rank, k) for k in steps]
    return [s for s, _ in spans], [n for _, n in spans]


def shuffle_positions(positions, seed: int, epoch, n: int):
    """``pi_epoch(positions)``: the sample indices at these positions of the epoch's order (a
    TF op; ``epoch`` may be a tensor)."""
    import tensorflow as tf
    key = tf.stack([tf.constant(seed, tf.int64), tf.cast(epoch, tf.int64)])
    # index_shuffle refuses an empty vector (a rank with no sample in a tiny final step):
    # shuffle one position more and leave it out
    padded = tf.concat([tf.cast(positions, tf.int64), tf.zeros([1], tf.int64)], 0)
    return tf.random.experimental.index_shuffle(padded, seed=key, max_index=n - 1)[:-1]


def epoch_indices(seed: int, epoch: int, n: int, positions=None):
    """The epoch's order as a numpy array (all ``n`` positions, or ``positions``)."""
    import numpy as np
    import tensorflow as tf
    pos = tf.range(n, dtype=tf.int64) if positions is None else np.asarray(positions)
    return shuffle_positions(pos, seed, epoch, n).numpy()
