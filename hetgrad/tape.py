"""``DistributedGradientTape``: a ``tf.GradientTape`` whose ``gradient`` returns the ranks'
weighted sum ``sum_i w_i g_i`` -- the same :class:`~hetgrad.aggregate.Aggregation` as the
Keras optimizer's, for custom training loops. A loop wraps a new tape every step (often
inside a ``tf.function``), so the tapes of one setting share one aggregation."""
from __future__ import annotations

import horovod.tensorflow as hvd
import tensorflow as tf

from .aggregate import Aggregation, SampleWeight, new_step_counter
from .reducers import DenseReducer
from .weights import horovod_weight, make_weight


class DistributedGradientTape:
    """Wraps ``tape``; ``gradient(target, sources, samples=None)`` returns the exchanged
    ``sum_i w_i g_i`` (every rank calls it the same number of times, in the same order).

    ``weight``: ``"samples"`` (the default without ``plan=``) -- ``w_i = n_i / sum_j n_j`` from
    the ``samples=`` each rank passes to ``gradient`` (its batch size), exact for any batches;
    without it every rank counts as one (Horovod's average, exact for equal batches; rank 0
    says so once) -- ``"plan"`` (the default with ``plan=``): the plan's per-step shares, the
    step counted per call; a float ``b_i / B``; ``op=hvd.Sum``: Horovod's plain sum. Horovod's
    ``device_dense``/``device_sparse`` are accepted and unused. ``check_finite`` (off, as in
    Horovod): a NaN/Inf in this rank's gradients fails the call. Any other attribute is the
    tape's."""

    def __init__(self, gradtape: tf.GradientTape, weight=None, *, plan=None,
                 rank: int | None = None, compression=hvd.Compression.none,
                 sparse_as_dense: bool = False, op=hvd.Average, check_finite: bool = False,
                 name: str = "hetgrad_tape", device_dense: str = "", device_sparse: str = ""):
        self._tape = gradtape
        weight = horovod_weight(weight, op=op)
        self.hetgrad = _aggregation(weight, plan, rank, compression, sparse_as_dense,
                                    check_finite, name)

    def __getattr__(self, name):
        if name == "_tape":
            raise AttributeError(name)
        return getattr(self._tape, name)

    def __enter__(self):
        self._tape.__enter__()
        return self

    def __exit__(self, *exc):
        return self._tape.__exit__(*exc)

    def gradient(self, target, sources, output_gradients=None, samples=None, **kwargs):
        """The weighted, exchanged gradients of ``target`` (structured like ``sources``)."""
        agg = self.hetgrad
        if samples is not None and isinstance(agg.weight, SampleWeight):
            agg.weight.count.assign(tf.cast(samples, tf.int32))
        grads = self._tape.gradient(target, sources, output_gradients, **kwargs)
        flat = tf.nest.flatten(grads)
        weighted = agg.weighted(flat)
        agg.count_step()
        return tf.nest.pack_sequence_as(grads, agg.exchange(weighted))


_MADE: dict = {}   # one aggregation per setting, for every step's new tape (and every trace)


def forget_aggregations() -> None:
    """Start the tapes' aggregations afresh (a new world: an elastic reset)."""
    _MADE.clear()


def _aggregation(weight, plan, rank, compression, sparse_as_dense, check_finite,
                 name) -> Aggregation:
    """The aggregation of these settings, made once (outside any ``tf.function``: its
    variables outlive every trace; the plan's weights count steps across tapes)."""
    key = (weight, id(plan), rank, compression, sparse_as_dense, check_finite, name)
    if key not in _MADE:
        with tf.init_scope():
            step = new_step_counter()
            made = Aggregation(
                make_weight(weight, plan, rank, step, name, fused=False),
                DenseReducer(compression=compression, sparse_as_dense=sparse_as_dense,
                             name=name),
                check_finite=check_finite, step=step)
        _MADE[key] = (made, plan)   # the plan kept alive, so its id stays its own
    return _MADE[key][0]
