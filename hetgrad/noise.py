"""The gradient noise scale measured in the training graph (the estimator: :mod:`hetgrad.gns`).

Each rank keeps ``[b_i n_i, b_i, 1, n]`` of its step (``n_i = |g_i|^2`` of its own mean
gradient, read off the weighted gradients it sends: ``w_i g_i``, or ``b_i g_i`` when the
count is fused; ``n = |g|^2`` of the exchanged mean) and sends the first three in the *next*
step's exchange, in an allreduce of their own that waits for nothing, so it rides an early
cycle of Horovod's (sent in the same step, after the last gradient, it cost a cycle more:
docs/results.md); then every rank adds that step's ``S`` and ``|G|^2`` to the epoch's sums
(the same numbers on every rank). A rank with no sample sends zeros. The last step of a run
is not counted. With ``every > 1`` only every ``every``-th step is measured (its cost is a
read of every gradient: docs/results.md); with a sparse exchange only its dense warm-up steps
(``when``), where the exchanged sum is the mean gradient itself. Measured on the dense exchange of
one backward pass per step without a loss scale; :func:`check_measurable` refuses the rest.
"""
from __future__ import annotations

import tensorflow as tf

from .errors import HetgradError


def squared_norm(grads: list) -> tf.Tensor:
    """``sum |g|^2`` over the tensors (an ``IndexedSlices``' repeated rows summed first)."""
    total = tf.constant(0.0, tf.float32)
    for g in grads:
        if g is None:
            continue
        total += 2.0 * tf.nn.l2_loss(dense([g])[0])   # one kernel, no temporary
    return total


def dense(grads: list) -> list:
    """The gradients as dense float32 tensors (an ``IndexedSlices``' repeated rows summed)."""
    return [None if g is None else tf.cast(tf.math.unsorted_segment_sum(
        g.values, g.indices, g.dense_shape[0]) if isinstance(g, tf.IndexedSlices) else g,
        tf.float32) for g in grads]


def preconditioned(grads: list, scales: list) -> list:
    """Each (dense) gradient times its variable's per-entry scale."""
    return [None if g is None else g * s for g, s in zip(grads, scales)]


class GradientNoise:
    """The per-step estimates of ``S`` and ``|G|^2`` summed over an epoch, in variables;
    with ``precondition`` (:func:`hetgrad.compat.adam_preconditioner`) those of the gradient
    Adam steps along, ``g / (sqrt(v_hat) + eps)`` (Pollux's preconditioned noise scale: Adam's
    progress per sample follows it, not the raw gradient's)."""

    def __init__(self, every: int = 1, name: str = "hetgrad", when=None, precondition=None,
                 gate=None):
        var = lambda name: tf.Variable(0.0, dtype=tf.float64, trainable=False,  # noqa: E731
                                       name=f"hetgrad_gns_{name}")
        self.s, self.g2, self.steps = var("s"), var("g2"), var("steps")
        self.pending = tf.Variable(tf.zeros(4), trainable=False, name="hetgrad_gns_pending")
        self.every, self.name, self.when = every, name, when   # when(): a step to measure?
        self.precondition, self.gate = precondition, gate   # gate(): a step to count?
        self.every_step = every == 1 and when is None   # measured without a conditional
        self.count = tf.Variable(0, dtype=tf.int64, trainable=False, name="hetgrad_gns_count")
        self.kept = tf.Variable(False, trainable=False, name="hetgrad_gns_kept")

    def step(self) -> None:
        """Before this step's exchange: send the last step's numbers, if it was measured, and
        add its estimates (nothing here waits for this step's gradients)."""
        if self.every_step:
            self._send()
        else:   # every rank counts the same steps: all take the same branch
            tf.cond(self.kept, self._send, lambda: tf.constant(False))

    def _send(self) -> tf.Tensor:
        import horovod.tensorflow as hvd
        last = self.pending.read_value()
        self.add(hvd.allreduce(last[:3], op=hvd.Sum, name=f"{self.name}.gns"), last[3])
        return tf.constant(True)

    def keep(self, weighted: list, seeded: tf.Tensor, mean: list, variables=None) -> None:
        """After this step's exchange: its numbers (``seeded``: the pass's ``[w_i, b_i]``),
        for the next step to send -- in every ``every``-th step only (the norms are a read of
        every gradient); ``variables``: the gradients' (to precondition them)."""
        def measure() -> tf.Tensor:
            mine, exchanged = weighted, mean
            if self.precondition is not None:
                mine, exchanged = self._preconditioned(mine, exchanged, variables)
            values = tf.concat([self.local(mine, seeded[0], seeded[1]),
                                tf.reshape(squared_norm(exchanged), [1])], 0)
            if self.gate is not None and self.every_step:   # held = 0: a step not counted
                values = tf.where(self.gate(), values, tf.zeros_like(values))
            self.pending.assign(values)
            return tf.constant(True)

        if self.every_step:
            measure()
            return
        due = tf.equal(self.count % self.every, 0)
        for test in (self.when, self.gate):
            if test is not None:
                due = tf.logical_and(due, test())
        self.kept.assign(tf.cond(due, measure, lambda: tf.constant(False)))
        self.count.assign_add(1)

    def _preconditioned(self, weighted: list, mean: list, variables) -> tuple[list, list]:
        """Both times Adam's per-entry step scales of this step (its ``v`` with the mean
        gradient taken in: a rank's ``|g_i|`` over it stays bounded)."""
        weighted, mean = dense(weighted), dense(mean)
        scales = self.precondition(variables, [tf.zeros(v.shape, tf.float32) if g is None
                                               else g for v, g in zip(variables, mean)])
        return preconditioned(weighted, scales), preconditioned(mean, scales)

    def local(self, weighted: list, seed: tf.Tensor, batch: tf.Tensor) -> tf.Tensor:
        """``[b_i n_i, b_i, held]`` from this rank's gradients seeded with ``seed`` (``w_i``,
        or ``b_i`` when fused: ``n_i = |weighted|^2 / seed^2`` either way)."""
        b = tf.cast(batch, tf.float32)
        bn = tf.math.divide_no_nan(b * squared_norm(weighted), tf.square(seed))
        held = tf.cast(b > 0, tf.float32)
        return tf.stack([bn * held, b, held])

    def add(self, summed: tf.Tensor, n: tf.Tensor) -> None:
        """A step's estimates from the summed vectors and ``n = |g|^2`` of its exchanged mean
        gradient; nothing when fewer than two ranks held samples."""
        sum_bn, total, held = summed[0], summed[1], summed[2]
        s = tf.math.divide_no_nan(sum_bn - total * n, held - 1.0)
        g2 = n - tf.math.divide_no_nan(s, total)
        ok = held >= 2.0
        none = tf.constant(0.0, tf.float64)
        self.s.assign_add(tf.where(ok, tf.cast(s, tf.float64), none))
        self.g2.assign_add(tf.where(ok, tf.cast(g2, tf.float64), none))
        self.steps.assign_add(tf.cast(ok, tf.float64))

    def take(self) -> tuple[float, float, int]:
        """The epoch's mean ``S``, mean ``|G|^2`` and its steps measured; the sums restart."""
        steps = int(self.steps.numpy())
        means = (float(self.s.numpy()) / max(steps, 1), float(self.g2.numpy()) / max(steps, 1))
        for v in (self.s, self.g2, self.steps):
            v.assign(0.0)
        return (*means, steps)


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
