"""The gradient noise scale measured in the training graph (the estimator: :mod:`hetgrad.gns`).

Each rank writes ``[b_i n_i, b_i, held, n]`` of a measured step into a row of a variable
(``n_i = |g_i|^2`` of its own mean gradient, read off the weighted gradients it sends:
``w_i g_i``, or ``b_i g_i`` when the count is fused; ``n = |g|^2`` of the exchanged mean,
the same on every rank; ``held`` 0 on a rank with no sample). Nothing is exchanged during
the steps: at the epoch's end every rank sums the first three columns over the ranks at once
(:meth:`GradientNoise.take`) and gets each step's ``S`` and ``|G|^2``
(:meth:`~hetgrad.gns.EpochNoise.from_rows`, in :data:`BUCKETS` of interleaved steps; before,
a small allreduce of three numbers per step, docs/results.md). A measured step reads one
block of about 1/16 of each large gradient (:class:`Blocks`: unbiased, at a 16th of the
reads; an embedding's ``IndexedSlices`` is made dense first); with ``every > 1`` only every
``every``-th step is measured (a variable: it may change between epochs); with a sparse
exchange only its dense warm-up steps (``when``), where the exchanged sum is the mean
gradient itself. Measured on the dense exchange of one backward pass per step without a
loss scale; :func:`check_measurable` refuses the rest.
"""
from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from .errors import HetgradError
from .gns import EpochNoise


def squared_norm(grads: list, counts: list | None = None) -> tf.Tensor:
    """``sum_k c_k |g_k|^2`` over the tensors (``c_k`` = ``counts[k]``, or 1; an
    ``IndexedSlices``' repeated rows summed first)."""
    total = tf.constant(0.0, tf.float32)
    for k, g in enumerate(grads):
        if g is None:
            continue
        sq = 2.0 * tf.nn.l2_loss(dense([g])[0])   # one kernel, no temporary
        total += sq if counts is None or counts[k] == 1 else counts[k] * sq
    return total


def dense(grads: list) -> list:
    """The gradients as dense float32 tensors (an ``IndexedSlices``' repeated rows summed)."""
    return [None if g is None else tf.cast(tf.math.unsorted_segment_sum(
        g.values, g.indices, g.dense_shape[0]) if isinstance(g, tf.IndexedSlices) else g,
        tf.float32) for g in grads]


def preconditioned(grads: list, scales: list) -> list:
    """Each (dense) gradient times its variable's per-entry scale."""
    return [None if g is None else g * s for g, s in zip(grads, scales)]


ALIGN = 16          # entries: a block begins on 64 bytes (TensorFlow can slice it in place)
READ_WHOLE = 16384  # a gradient of up to this many entries is read whole in a measured step
BLOCKS = 16         # a larger one: one block of 1/BLOCKS of its entries
EVERY = 4           # a run measures every 4th step unless told (its cost within the noise of
#                     the step time, docs/results.md; the adaptive batch's first choice: every)
MEASURED = 64       # an adaptive batch's epoch measures at least this many steps (every_for)
BUCKETS = 8         # of interleaved measured steps (a median of means where the mean fails)


class Blocks:
    """Which entries of each gradient a measured step reads: all of a small one; of a larger
    one (over ``whole`` entries), one of about ``blocks`` contiguous blocks of its flattened
    entries (:meth:`layout`: ``count`` of them, the last one shorter), drawn anew each step
    (from the step count: the same on every rank) and independently per gradient, its squares
    counted ``count`` times. Every entry is read with probability ``1/count``, so the sums of
    squares stay unbiased at ``1/count`` of the reads."""

    def __init__(self, blocks: int = BLOCKS, whole: int = READ_WHOLE):
        self.blocks, self.whole = blocks, whole

    def layout(self, entries: int | None) -> tuple[int | None, int]:
        """``(length, count)`` of the blocks of a tensor of ``entries``; count 1: read whole."""
        if entries is None or entries <= self.whole or self.blocks <= 1:
            return entries, 1
        length = math.ceil(entries / self.blocks / ALIGN) * ALIGN
        return length, math.ceil(entries / length)

    def draw(self, shapes: list, step: tf.Tensor) -> list[tuple]:
        """Per gradient of ``shapes``: ``(cut, count)``, ``cut(t)`` this step's block of a
        tensor of that shape (flattened) and ``count`` what its squares count for."""
        out = []
        for k, shape in enumerate(shapes):
            entries = tf.TensorShape(shape).num_elements()
            length, count = self.layout(entries)
            if count == 1:
                out.append((lambda t: t, 1))
                continue
            j = tf.random.stateless_uniform([], tf.stack([step, tf.constant(k, tf.int64)]), 0,
                                            count, tf.int64, alg="philox")
            begin = tf.reshape(j * length, [1])
            size = tf.minimum(tf.constant([length], tf.int64), entries - begin)
            out.append((lambda t, b=begin, n=size: tf.slice(tf.reshape(t, [-1]), b, n), count))
        return out


def merged(drawn: list[tuple], tensors: list) -> tuple[list, list]:
    """This step's entries of ``tensors`` (:meth:`Blocks.draw`) and what their squares count:
    those read whole in one flat vector (a model of many small tensors: a few ops, not a few
    per tensor), then each block."""
    whole = [tf.reshape(t, [-1]) for (_, count), t in zip(drawn, tensors) if count == 1]
    blocks = [(cut(t), count) for (cut, count), t in zip(drawn, tensors) if count > 1]
    parts = ([(tf.concat(whole, 0), 1)] if whole else []) + blocks
    return [t for t, _ in parts], [count for _, count in parts]


def every_for(steps: int, most: int = EVERY, least: int = MEASURED) -> int:
    """Measure one step in this many of an epoch of ``steps``: ``most``, fewer between where
    that would leave under ``least`` measured (a step of 2 ranks is one degree of freedom;
    every 4th of epochs of 40-70 steps made the goodput runs' noise scale jump 100-fold
    between epochs, docs/results.md)."""
    return max(1, min(most, steps // least))


class GradientNoise:
    """Each measured step's ``[b_i n_i, b_i, held, n]`` of this rank, one row each in a
    variable (:meth:`keep`), and the epoch's estimates from them (:meth:`take`, every rank at
    once: the rows summed over the ranks there, no message of the estimator's during the
    steps); with ``precondition`` (:func:`hetgrad.compat.adam_preconditioner`) those of the
    gradient Adam steps along, ``g / (sqrt(v_hat) + eps)`` (Pollux's preconditioned noise
    scale: Adam's progress per sample follows it, not the raw gradient's)."""

    def __init__(self, every: int = 1, name: str = "hetgrad", when=None, precondition=None,
                 gate=None, blocks: Blocks | None = None, capacity: int = 256):
        # the epoch's measured steps (a ring: past its rows, the latest; take() then grows it)
        self.rows = tf.Variable(tf.zeros([capacity, 4]), trainable=False,
                                name=f"{name}_gns_rows", shape=tf.TensorShape([None, 4]))
        self.written = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{name}_gns_written")
        # steps measured: one in `every` (a variable: the adaptive batch measures fewer after
        # its first choice, hetgrad.adapt) and of those the ones when() allows
        self.every = tf.Variable(every, dtype=tf.int64, trainable=False,
                                 name=f"{name}_gns_every")
        self.when = when
        self.blocks = blocks or Blocks()
        self.precondition, self.gate = precondition, gate   # gate(): a step to count?
        self.count = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{name}_gns_count")

    def keep(self, weighted: list, seeded: tf.Tensor, mean: list, variables=None) -> None:
        """After this step's exchange: its row (``seeded``: the pass's ``[w_i, b_i]``), in
        every ``every``-th step only; ``variables``: the gradients' (to precondition them)."""
        def write() -> tf.Tensor:
            row = self._measured(weighted, seeded, mean, variables)
            at = self.written % tf.shape(self.rows, out_type=tf.int64)[0]
            self.rows.scatter_nd_update(tf.reshape(at, [1, 1]), row[None])
            self.written.assign_add(1)
            return tf.constant(True)
        due = tf.equal(self.count % self.every, 0)
        if self.when is not None:
            due = tf.logical_and(due, self.when())
        tf.cond(due, write, lambda: tf.constant(False))
        self.count.assign_add(1)

    def _measured(self, weighted: list, seeded: tf.Tensor, mean: list, variables) -> tf.Tensor:
        """``[b_i n_i, b_i, held, n]`` of this step, from a block of each large gradient
        (:class:`Blocks`), preconditioned when asked; zeros in a step the gate does not count."""
        present = [k for k, g in enumerate(mean) if g is not None]
        mine, exchanged = dense([weighted[k] for k in present]), dense([mean[k] for k in present])
        drawn = self.blocks.draw([g.shape for g in exchanged], self.count.read_value())
        (mine, counts), (exchanged, _) = merged(drawn, mine), merged(drawn, exchanged)
        if self.precondition is not None:   # Adam's v with the mean gradient taken in
            moments, _ = merged(drawn, [self.precondition.moment(variables[k]) for k in present])
            scales = self.precondition(moments, exchanged)
            mine, exchanged = preconditioned(mine, scales), preconditioned(exchanged, scales)
        values = tf.concat([self.local(mine, seeded[0], seeded[1], counts),
                            tf.reshape(squared_norm(exchanged, counts), [1])], 0)
        if self.gate is not None:   # held = 0: a step not counted
            values = tf.where(self.gate(), values, tf.zeros_like(values))
        return values

    def local(self, weighted: list, seed: tf.Tensor, batch: tf.Tensor,
              counts: list | None = None) -> tf.Tensor:
        """``[b_i n_i, b_i, held]`` from this rank's gradients seeded with ``seed`` (``w_i``,
        or ``b_i`` when fused: ``n_i = |weighted|^2 / seed^2`` either way)."""
        b = tf.cast(batch, tf.float32)
        bn = tf.math.divide_no_nan(b * squared_norm(weighted, counts), tf.square(seed))
        held = tf.cast(b > 0, tf.float32)
        return tf.stack([bn * held, b, held])

    @property
    def capacity(self) -> int:
        """Rows the variable holds."""
        return int(tf.shape(self.rows)[0])

    def reserve(self, steps: int) -> None:
        """Room for an epoch of ``steps`` steps (measured or not); the rows written so far
        are dropped (steps outside the epochs: the probe's)."""
        if self.capacity < steps:
            self.rows.assign(tf.zeros([steps, 4]))
        self.written.assign(0)

    def take_rows(self) -> np.ndarray:
        """This rank's rows since the last take, oldest first (past the variable's rows, the
        latest that many; the variable then grows for the next epoch)."""
        written, rows = int(self.written.numpy()), self.rows.numpy()
        self.written.assign(0)
        if written <= len(rows):
            return rows[:written]
        self.reserve(written)
        return np.roll(rows, -(written % len(rows)), axis=0)

    def take(self, sum_over_ranks) -> EpochNoise:
        """The epoch's estimates over its measured steps, with their spread (every rank
        calls it: ``sum_over_ranks(array)`` sums the ranks' arrays, e.g.
        :meth:`hetgrad.comm.Comm.allreduce_sum`; ``n`` is the same on every rank)."""
        rows = self.take_rows().astype(np.float64)
        if len(rows):   # (as many on every rank)
            rows[:, :3] = sum_over_ranks(np.ascontiguousarray(rows[:, :3]))
        return EpochNoise.from_rows(rows, BUCKETS)


def check_measurable(optimizer, field: str = "gns", every: int = 1) -> None:
    """Refuse ``gns`` (or what needs it, ``field``) where the estimate would not be of one
    pass's mean gradients."""
    from . import compat
    from .sparse.reducer import SparseReducer
    from .weights import FixedWeight
    agg = optimizer.hetgrad
    sparse = isinstance(agg.reducer, SparseReducer)
    refused = [(sparse and not agg.reducer.settings.dense_warmup(),
                "with sparsification outside a dense warm-up (--density-warmup, without "
                "momentum correction or local clipping)"),
               (not sparse and not agg.reducer.carries_count, "with a compressed exchange"),
               (compat.is_loss_scale_optimizer(optimizer), "with a loss scale (mixed precision)"),
               (getattr(optimizer, "_hetgrad_passes", 1) > 1,
                "with backward_passes_per_step > 1"),
               (isinstance(agg.weight, FixedWeight),
                "with a fixed float weight (no batch size to weigh by)")]
    why = next((why for refuse, why in refused if refuse), None)
    if why:
        raise HetgradError(f"the gradient noise scale is not measured {why} yet", field=field)
    precondition = compat.adam_preconditioner(optimizer)
    agg.noise = GradientNoise(
        every, when=(lambda: agg.reducer.send_all.read_value()) if sparse else None,
        precondition=precondition,
        gate=(lambda: optimizer.iterations >= PRECONDITIONED_AFTER) if precondition else None)


PRECONDITIONED_AFTER = 10   # Adam's steps before its second moment is a scale to trust
