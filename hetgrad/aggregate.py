"""Weighted gradient aggregation ``sum_i w_i g_i`` on Horovod: the one layer every exchange
plugs into.

An :class:`Aggregation` owns the three things every exchange shares:

- the **weight** ``w_i`` of this rank in the current step (:class:`FixedWeight`,
  :class:`PlanWeight`, :class:`SampleWeight`); the backward pass is seeded with it, so the
  gradients arrive already weighted and the reduce is a plain sum;
- the **finite check** (a NaN/Inf in this rank's local gradients fails its step before the
  exchange, with :data:`NONFINITE` in the error, so the culprit is the rank that reports it);
- the **busy/wait timer** around the exchange (:class:`~hetgrad.timing.StepTimer`).

The exchange itself is a :class:`Reducer` (like a PyTorch DDP communication hook):
:class:`DenseReducer` (one fused ``grouped_allreduce``) here, the sparse one in
:mod:`hetgrad.sparse`. Horovod refuses a different ``prescale_factor`` per rank, hence
local weighting and ``op=hvd.Sum``.
"""
from __future__ import annotations

from typing import Sequence

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from .timing import StepTimer

NONFINITE = "hetgrad: non-finite local gradient"


class FixedWeight:
    """A constant share, e.g. ``b_i / B`` of a plan with no partial final step."""

    def __init__(self, share: float):
        if not 0.0 < float(share) <= 1.0:
            raise ValueError(f"weight must be in (0, 1], got {share}")
        self.share = float(share)

    def __call__(self) -> tf.Tensor:
        return tf.constant(self.share, tf.float32)


class PlanWeight:
    """Per-step ``w_i`` from a partition plan: ``b_i / B`` in full steps and
    ``last_i / sum_j last_j`` in an epoch's partial final step. Exact, and needs no
    communication (every rank knows the plan); the step is read from ``iterations``.
    The shares live in variables, so :meth:`update` switches plans without retracing."""

    def __init__(self, plan, rank: int, iterations: tf.Variable):
        self.rank = rank
        self.iterations = iterations
        self.full = tf.Variable(0.0, trainable=False, name="hetgrad_full_share")
        self.last = tf.Variable(0.0, trainable=False, name="hetgrad_last_share")
        self.steps = tf.Variable(1, dtype=iterations.dtype, trainable=False,
                                 name="hetgrad_steps")
        self.update(plan)

    def update(self, plan) -> None:
        lasts = plan.last_batches()
        self.full.assign(plan.batches[self.rank] / plan.global_batch)
        self.last.assign(lasts[self.rank] / sum(lasts))
        self.steps.assign(plan.steps_per_epoch)

    def __call__(self) -> tf.Tensor:
        final = tf.equal(tf.math.floormod(self.iterations, self.steps), self.steps - 1)
        return tf.where(final, self.last, self.full)


NO_COUNT = ("hetgrad: weight=samples needs the batch size of every step: pass a "
            "hetgrad.keras.callbacks callback to fit, or call hetgrad.keras.count_samples(model)")


class SampleWeight:
    """``n_i / sum_j n_j`` from the samples this step holds (``count`` is set by the train
    step, see :func:`hetgrad.keras.count_samples`); one scalar allreduce per step. A step
    with no count recorded fails with :data:`NO_COUNT` (never a silent 0/0)."""

    def __init__(self, name: str = "hetgrad"):
        self.count = tf.Variable(0, dtype=tf.int32, trainable=False, name="hetgrad_local_count")
        self.name = name

    def __call__(self) -> tf.Tensor:
        check = tf.debugging.assert_positive(self.count, message=NO_COUNT)
        with tf.control_dependencies([check]):
            n = tf.cast(tf.reshape(self.count, [1]), tf.float32)
        total = hvd.allreduce(n, op=hvd.Sum, name=f"{self.name}.count")
        return (n / total)[0]


class Reducer:
    """Sums already weighted gradients over the ranks. Subclasses with per-rank state (e.g.
    sparse residuals) return it from :meth:`state_dict` so checkpoints keep it."""

    def reduce(self, grads: list) -> list:
        raise NotImplementedError

    def build(self, shapes) -> None:
        """Create per-rank state for gradients of these shapes now (before a restore)."""

    def state_dict(self) -> dict[str, np.ndarray]:
        return {}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Continue from :meth:`state_dict`; stateless reducers accept only empty state."""
        if state:
            raise ValueError(f"{type(self).__name__} keeps no state, got {sorted(state)}")


class DenseReducer(Reducer):
    """One fused ``grouped_allreduce(op=Sum)`` for the dense gradients; ``tf.IndexedSlices``
    (embeddings) are allgathered, as Horovod does, unless ``sparse_as_dense``."""

    def __init__(self, *, compression=hvd.Compression.none, sparse_as_dense: bool = False,
                 name: str = "hetgrad"):
        self.compression = compression
        self.sparse_as_dense = sparse_as_dense
        self.name = name

    def reduce(self, grads: Sequence) -> list:
        out: list = list(grads)
        dense_idx = []
        for i, g in enumerate(grads):
            if g is None:
                continue
            if isinstance(g, tf.IndexedSlices) and self.sparse_as_dense:
                g = out[i] = tf.convert_to_tensor(g)
            if isinstance(g, tf.IndexedSlices):  # allgathered values + indices
                out[i] = hvd.allreduce(g, op=hvd.Sum, name=f"{self.name}.sparse{i}")
            else:
                dense_idx.append(i)
        if dense_idx:
            reduced = hvd.grouped_allreduce([out[i] for i in dense_idx], op=hvd.Sum,
                                            compression=self.compression,
                                            name=f"{self.name}.dense")
            for i, r in zip(dense_idx, reduced):
                out[i] = r
        return out


def assert_finite(grads: list) -> list:
    """The gradients, made to depend on a check that fails the step if one holds NaN/Inf."""
    values = [g.values if isinstance(g, tf.IndexedSlices) else g for g in grads if g is not None]
    finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in values])
    check = tf.debugging.Assert(finite, [NONFINITE])
    with tf.control_dependencies([check]):
        return [None if g is None else
                tf.IndexedSlices(tf.identity(g.values), g.indices, g.dense_shape)
                if isinstance(g, tf.IndexedSlices) else tf.identity(g) for g in grads]


class Aggregation:
    """This rank's side of one weighted exchange: ``weight()`` seeds the backward pass,
    :meth:`exchange` checks, times and reduces the weighted gradients."""

    def __init__(self, weight, reducer: Reducer | None = None, *, check_finite: bool = True):
        self.weight = weight
        self.reducer = reducer if reducer is not None else DenseReducer()
        self.check_finite = bool(check_finite)
        self.timer = StepTimer()

    def local_weight(self) -> tf.Tensor:
        """This rank's ``w_i`` for the current step (the weights sum to 1 over ranks)."""
        return tf.cast(self.weight(), tf.float32)

    def exchange(self, grads: list) -> list:
        if self.check_finite:
            grads = assert_finite(grads)
        t_ready = self.timer.ready(grads)
        out = self.reducer.reduce(grads)
        self.timer.done(t_ready, out)
        return out
