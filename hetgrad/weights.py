"""This rank's weight ``w_i`` in ``sum_i w_i g_i``: the backward pass is seeded with it, so
the gradients arrive weighted and the reduce is a plain sum (Horovod refuses a different
``prescale_factor`` per rank)."""
from __future__ import annotations

import sys

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
        self.batch = tf.Variable([0.0, 0.0], trainable=False, name="hetgrad_local_batch")
        self.steps = tf.Variable(1, dtype=step.dtype, trainable=False,
                                 name="hetgrad_steps")
        self.update(plan)

    def update(self, plan) -> None:
        lasts = plan.last_batches()
        self.full.assign(plan.batches[self.rank] / plan.global_batch)
        self.last.assign(lasts[self.rank] / sum(lasts))
        self.batch.assign([plan.batches[self.rank], lasts[self.rank]])
        self.steps.assign(plan.steps_per_epoch)

    def _final(self) -> tf.Tensor:
        return tf.equal(tf.math.floormod(self.step, self.steps), self.steps - 1)

    def __call__(self) -> tf.Tensor:
        return tf.where(self._final(), self.last, self.full)

    def local_batch(self) -> tf.Tensor:
        """``b_i`` of this step (the final step's own)."""
        return tf.where(self._final(), self.batch[1], self.batch[0])


UNCOUNTED = ("hetgrad: warning: the batch size of this step is not known here (a train step that is "
             "not Keras', e.g. apply_gradients in your own loop): the ranks are weighted "
             "equally, Horovod's average, exact for equal batches only. For uneven batches give "
             "DistributedOptimizer weight=b_i/B or plan=, or the tape gradient(..., samples=n)")


def _say() -> int:
    print(UNCOUNTED, file=sys.stderr, flush=True)
    return 0


class SampleWeight:
    """``n_i / sum_j n_j`` from the samples this step holds (``count``, set by the train step:
    :func:`hetgrad._keras.counting.count_samples` makes Keras' train steps do it). A step whose
    count was not set counts every rank as one -- Horovod's plain average -- and rank 0 says
    so once (:data:`UNCOUNTED`); the count is used up by the exchange (:meth:`used`).

    ``fused`` (a dense exchange, one backward pass per step): the pass is seeded with ``n_i``
    itself and ``n_i`` rides in the gradients' allreduce; the exchange divides the sum by
    ``sum_j n_j`` (no collective of its own). Otherwise one scalar allreduce before the pass
    gives the normalized weight (the sparse memory and accumulated passes need it)."""

    def __init__(self, name: str = "hetgrad", fused: bool = False):
        self.count = tf.Variable(-1, dtype=tf.int32, trainable=False,   # -1: not counted
                                 name="hetgrad_local_count")
        self.said = tf.Variable(False, trainable=False, name="hetgrad_said_uncounted")
        self.name = name
        self.fused = fused

    def local_count(self) -> tf.Tensor:
        """This step's ``n_i`` (1 when the step did not set it)."""
        n = self.count.read_value()
        known = n >= 0
        said = tf.cond(known | self.said, lambda: tf.constant(True), self._say_uncounted)
        with tf.control_dependencies([said]):
            return tf.where(known, tf.cast(n, tf.float32), 1.0)

    def local_batch(self) -> tf.Tensor:
        return self.local_count()

    def used(self) -> None:
        """The step's exchange is done: the next one counts anew."""
        self.count.assign(-1)

    def _say_uncounted(self) -> tf.Tensor:
        ops = [self.said.assign(True)]
        if hvd.rank() == 0:
            ops.append(tf.py_function(_say, [], tf.int32))
        with tf.control_dependencies(ops):
            return tf.constant(True)

    def __call__(self) -> tf.Tensor:
        n = self.local_count()
        if self.fused:
            return n
        total = hvd.allreduce(tf.reshape(n, [1]), op=hvd.Sum, name=f"{self.name}.count")
        return n / total[0]


def make_weight(weight, plan, rank: int | None, step: tf.Variable, name: str, fused: bool):
    """The weight ``weight`` names: ``"samples"`` (the default without ``plan``),
    ``"plan"`` (the default with it), or a float share."""
    if weight is None:
        weight = "samples" if plan is None else "plan"
    if weight == "samples":
        return SampleWeight(name, fused=fused)
    if weight == "plan":
        if plan is None:
            raise ValueError("weight='plan' needs plan=")
        return PlanWeight(plan, hvd.rank() if rank is None else rank, step)
    if isinstance(weight, (int, float)) and not isinstance(weight, bool):
        return FixedWeight(weight)
    raise ValueError(f"weight must be a float share, 'plan' or 'samples', got {weight!r}")


HOROVOD_IGNORED = ("device_dense", "device_sparse", "gradient_predivide_factor", "num_groups",
                   "groups")


def horovod_weight(weight, op=hvd.Average, process_set=None, scale_local_gradients=True,
                   **ignored):
    """The weight Horovod's ``op`` means -- ``Average``: the weighted sum, ``Sum``: every rank's
    gradient as it is -- with Horovod's other keywords checked: ``device_dense``,
    ``device_sparse``, ``gradient_predivide_factor``, ``num_groups``, ``groups`` accepted
    (placement and fusion are Horovod's business), ``process_set`` the global one only,
    ``scale_local_gradients`` True only."""
    unknown = sorted(set(ignored) - set(HOROVOD_IGNORED))
    if unknown:
        raise TypeError(f"unexpected keyword argument(s) {unknown}")
    if process_set is not None and process_set is not hvd.global_process_set:
        raise ValueError("hetgrad exchanges over all ranks: process_set must be the global one")
    if not scale_local_gradients:
        raise ValueError("hetgrad weighs local gradients like every other: "
                         "scale_local_gradients=False is not supported")
    if op == hvd.Sum:
        if weight is not None:
            raise ValueError("op=Sum is a plain sum: give no weight")
        return 1.0
    if op != hvd.Average:
        raise ValueError("hetgrad combines gradients as a weighted sum: op must be Average "
                         "(the weighted sum) or Sum")
    return weight
