"""This rank's weight ``w_i`` in ``sum_i w_i g_i``: the backward pass is seeded with it, so
the gradients arrive weighted and the reduce is a plain sum (Horovod refuses a different
``prescale_factor`` per rank)."""
from __future__ import annotations

import horovod.tensorflow as hvd
import tensorflow as tf


class FixedWeight:
    """A constant share, e.g. ``b_i / B`` of a plan with no partial final step."""

    fused = False

    def __init__(self, share: float):
        if not 0.0 < float(share) <= 1.0:
            raise ValueError(f"weight must be in (0, 1], got {share}")
        self.share = float(share)

    def __call__(self) -> tf.Tensor:
        return tf.constant(self.share, tf.float32)


class PlanWeight:
    """Per-step ``w_i`` from a partition plan: ``b_i / B`` in full steps and
    ``last_i / sum_j last_j`` in an epoch's partial final step. Exact, and needs no
    communication (every rank knows the plan); the step is read from ``step``, the
    aggregation's count of passes (:meth:`hetgrad.aggregate.Aggregation.count_step`).
    The shares live in variables, so :meth:`update` switches plans without retracing."""

    fused = False

    def __init__(self, plan, rank: int, step: tf.Variable):
        self.rank = rank
        self.step = step
        self.full = tf.Variable(0.0, trainable=False, name="hetgrad_full_share")
        self.last = tf.Variable(0.0, trainable=False, name="hetgrad_last_share")
        self.steps = tf.Variable(1, dtype=step.dtype, trainable=False,
                                 name="hetgrad_steps")
        self.update(plan)

    def update(self, plan) -> None:
        lasts = plan.last_batches()
        self.full.assign(plan.batches[self.rank] / plan.global_batch)
        self.last.assign(lasts[self.rank] / sum(lasts))
        self.steps.assign(plan.steps_per_epoch)

    def __call__(self) -> tf.Tensor:
        final = tf.equal(tf.math.floormod(self.step, self.steps), self.steps - 1)
        return tf.where(final, self.last, self.full)


NO_COUNT = ("hetgrad: weight=samples needs the batch size of every step: pass a "
            "hetgrad.keras.callbacks callback to fit, or call hetgrad.keras.count_samples(model)")


class SampleWeight:
    """``n_i / sum_j n_j`` from the samples this step holds (``count`` is set by the train
    step, see :func:`hetgrad.keras.count_samples`). A step with no count recorded fails with
    :data:`NO_COUNT` (never a silent 0/0).

    ``fused`` (a dense exchange, one backward pass per step): the pass is seeded with ``n_i``
    itself and ``n_i`` rides in the gradients' allreduce; the exchange divides the sum by
    ``sum_j n_j`` (no collective of its own). Otherwise one scalar allreduce before the pass
    gives the normalized weight (the sparse memory and accumulated passes need it)."""

    def __init__(self, name: str = "hetgrad", fused: bool = False):
        self.count = tf.Variable(0, dtype=tf.int32, trainable=False, name="hetgrad_local_count")
        self.name = name
        self.fused = fused

    def local_count(self) -> tf.Tensor:
        check = tf.debugging.assert_positive(self.count, message=NO_COUNT)
        with tf.control_dependencies([check]):
            return tf.cast(self.count, tf.float32)

    def __call__(self) -> tf.Tensor:
        n = self.local_count()
        if self.fused:
            return n
        total = hvd.allreduce(tf.reshape(n, [1]), op=hvd.Sum, name=f"{self.name}.count")
        return n / total[0]
