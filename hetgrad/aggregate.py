"""Weighted gradient aggregation ``sum_i w_i g_i`` on Horovod: the one layer every exchange
plugs into.

An :class:`Aggregation` owns what every exchange shares: the **weight** ``w_i``
(:mod:`hetgrad.weights`; the backward pass is seeded with it, so the gradients arrive
weighted and the reduce is a plain sum), the **finite check** (:mod:`hetgrad.finite`) and the
**busy/wait timer** (:class:`~hetgrad.timing.StepTimer`). The exchange itself is a
:class:`~hetgrad.reducers.Reducer` (like a PyTorch DDP communication hook): the dense one in
:mod:`hetgrad.reducers`, the sparse one in :mod:`hetgrad.sparse`.
"""
from __future__ import annotations

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from .finite import NONFINITE, FiniteCheck, local_check
from .reducers import DenseReducer, Reducer
from .timing import StepTimer
from .weights import FixedWeight, PlanWeight, SampleWeight

__all__ = ["Aggregation", "FixedWeight", "PlanWeight", "SampleWeight", "NONFINITE", "scaled"]


def scaled(grads, factor) -> list:
    """Every gradient times ``factor`` (``None`` stays ``None``)."""
    def scale(g):
        if g is None:
            return None
        if isinstance(g, tf.IndexedSlices):
            return tf.IndexedSlices(g.values * tf.cast(factor, g.values.dtype), g.indices,
                                    g.dense_shape)
        return g * tf.cast(factor, g.dtype)
    return [scale(g) for g in grads]


def _zeros_if(flag: tf.Tensor, grads: list) -> list:
    """``grads``, or zeros of their shapes where ``flag`` holds (an ``IndexedSlices``' values
    zeroed): one conditional for them all, not one per tensor (two branch graphs each to
    trace: 0.06-0.08 s of the first step's tracing for a model of 8 variables, 0.03 s as
    one; ad hoc, one process)."""
    present = [g for g in grads if g is not None]
    if not present:
        return list(grads)
    dense = [g.values if isinstance(g, tf.IndexedSlices) else g for g in present]
    cleared = tf.cond(flag, lambda: [tf.zeros_like(t) for t in dense],
                      lambda: [tf.identity(t) for t in dense])
    return _refilled(grads, [tf.IndexedSlices(t, g.indices, g.dense_shape)
                             if isinstance(g, tf.IndexedSlices) else t
                             for g, t in zip(present, cleared)])


def _refilled(grads: list, values: list) -> list:
    """``grads`` with its entries that are not None replaced by ``values``, in order."""
    it = iter(values)
    return [None if g is None else next(it) for g in grads]


def finite_everywhere(grads: list, name: str) -> tf.Tensor:
    """Whether every rank's ``grads`` are finite: one scalar allreduce of the count of
    NaN/Inf entries."""
    bad = [tf.reduce_sum(tf.cast(tf.logical_not(tf.math.is_finite(g)), tf.float32))
           for g in grads if g is not None]
    total = hvd.allreduce(tf.reshape(tf.add_n(bad), [1]), op=hvd.Sum, name=f"{name}.finite")
    return tf.equal(total[0], 0.0)


def new_step_counter() -> tf.Variable:
    """The passes an aggregation has taken (0 at the start of a run or of a resumed epoch)."""
    return tf.Variable(0, dtype=tf.int64, trainable=False, name="hetgrad_step")


class Aggregation:
    """This rank's side of one weighted exchange: ``weight()`` seeds the backward pass,
    :meth:`exchange` checks, times and reduces the weighted gradients."""

    def __init__(self, weight, reducer: Reducer | None = None, *, check_finite: bool = True,
                 step: tf.Variable | None = None, skip_together: bool = False):
        self.weight = weight
        self.skip_together = skip_together
        self.step = step if step is not None else new_step_counter()
        self.reducer = reducer if reducer is not None else DenseReducer()
        self.check = FiniteCheck(getattr(self.reducer, "name", "hetgrad")) \
            if check_finite else None
        self.timer: StepTimer | None = StepTimer()   # None: untimed (benchmarks only)
        # this rank holds no sample of the pass (set by a train step that counted none, or
        # by a weight of 0; cleared by :meth:`weighted`)
        self.idle = tf.Variable(False, trainable=False, name="hetgrad_idle")
        self.noise = None   # a hetgrad.noise.GradientNoise when the noise scale is measured
        # the pass's w_i and b_i, read when it is seeded (the step count moves on before the
        # exchange, and a plan's b_i follows it)
        self.seed = tf.Variable([0.0, 0.0], trainable=False, name="hetgrad_seed")
        # a step of this rank alone, nothing exchanged: the probe's (it times training's
        # traced step without the wait for the others, hetgrad._keras.probing)
        self.alone = tf.Variable(False, trainable=False, name="hetgrad_alone")
        self.traces = 0   # graphs built around :meth:`exchange` (a step traced: Python runs)

    @property
    def check_finite(self) -> bool:
        return self.check is not None

    def loss_scaled(self) -> "Aggregation":
        """This aggregation (the same weight, reducer, step count and idle flag) for an
        optimizer with a loss scale inside: no finite check of its own (the loss scale skips
        such steps), and a stateful reducer's exchange skipped together."""
        if isinstance(self.weight, SampleWeight):
            self.weight.fused = False   # seeded with w_i <= 1, not n_i (float16 overflow)
        scaled_ = Aggregation(self.weight, self.reducer, check_finite=False, step=self.step,
                              skip_together=self.reducer.check_local)
        scaled_.idle = self.idle
        return scaled_

    def own_variables(self) -> list[tf.Variable]:
        """hetgrad's own variables of this exchange (step count, flags, the plan's shares, the
        timer's, the noise scale's; not a reducer's): what a probe through it puts back."""
        parts = (self, self.weight, self.timer, self.check, self.noise)
        return [v for part in parts if part is not None for v in vars(part).values()
                if isinstance(v, tf.Variable)]

    def count_step(self) -> None:
        """One more backward pass taken (every pass, exchanged or accumulated, skipped by a
        loss scale or not): what a plan's per-step weights read."""
        self.step.assign_add(1)

    def local_weight(self) -> tf.Tensor:
        """What this rank's backward pass is seeded with: ``w_i`` (the weights sum to 1 over
        the ranks), or ``n_i`` for a fused sample weight (divided out after the exchange)."""
        w = tf.cast(self.weight(), tf.float32)
        kept = [self.idle.assign(self.idle | tf.equal(w, 0.0))]
        if self.noise is not None:
            b = tf.cast(self.weight.local_batch(), tf.float32)
            kept.append(self.seed.assign(tf.stack([w, b])))
        with tf.control_dependencies(kept):
            return tf.identity(w)

    def weighted(self, grads: list, seeded: bool = False) -> list:
        """This pass's ``w_i g_i``: ``grads`` times :meth:`local_weight` (unless the pass was
        seeded with it); exact zeros on a rank with no sample in the pass (:attr:`idle`),
        whose gradient of an empty batch may be NaN (BatchNormalization's is)."""
        if not seeded:
            grads = scaled(grads, self.local_weight())
        idle = self.idle.read_value()
        with tf.control_dependencies([idle]):
            cleared = self.idle.assign(False)
        with tf.control_dependencies([cleared]):
            return _zeros_if(idle, grads)

    def exchange(self, grads: list, variables=None) -> list:
        """The exchanged sum of this rank's weighted ``grads`` (``skip_together``: a step with
        NaN/Inf on any rank gives NaN everywhere, for a loss scale to skip, before a reducer
        with per-rank state (sparse memory) takes it in); in a step :attr:`alone` (the
        probe's) the ``grads`` themselves, nothing exchanged, checked or timed."""
        if not tf.executing_eagerly():
            self.traces += 1
        present = [g for g in grads if g is not None]
        if getattr(self.reducer, "sparse_as_dense", False):   # (both branches give dense)
            present = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                       for g in present]
        kept = variables and [v for g, v in zip(grads, variables) if g is not None]
        out = _refilled(grads, tf.cond(self.alone, lambda: self._alone(present),
                                       lambda: self._together(present, kept)))
        if isinstance(self.weight, SampleWeight):
            self.weight.used()
        return out

    def _alone(self, grads: list) -> list:
        """This rank's own gradients, as the exchange would scale them (a fused count's
        ``n_i`` divided out)."""
        if not self.weight.fused:
            return list(grads)
        return scaled(grads, tf.math.divide_no_nan(1.0, self.weight.local_count()))

    def _together(self, grads: list, variables) -> list:
        if not self.skip_together:
            return self._exchange(grads, variables)
        ok = finite_everywhere(grads, getattr(self.reducer, "name", "hetgrad"))
        return tf.cond(ok, lambda: list(self._exchange(grads, variables)),
                       lambda: [g * np.float32(np.nan) for g in grads])

    def _exchange(self, grads: list, variables=None) -> list:
        check_before = self.check is not None and self.reducer.check_local
        if check_before:
            grads = local_check(grads)
        t_ready = self.timer.ready(grads) if self.timer is not None else None
        if self.weight.fused:   # n_i in the same exchange
            out, sums = self.reducer.reduce_with(
                grads, [tf.reshape(self.weight.local_count(), [1])])
            out = scaled(out, 1.0 / sums[0][0])
        else:
            out = self.reducer.reduce(grads)
        if self.noise is not None:
            self.noise.keep(grads, self.seed.read_value(), out, variables)
        if self.check is not None and not check_before:
            out = self.check.after_exchange(out, grads)
        if self.timer is not None:
            self.timer.done(t_ready, out)
        return out
