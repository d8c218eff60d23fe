"""The finite check of the aggregation: a NaN/Inf in some rank's local gradients fails the
step, with :data:`NONFINITE` in the error, naming the rank(s) that produced it.

:class:`FiniteCheck` checks the *exchanged* sum (one reduction over it, which does not hold
up the exchange, and every rank sees the same verdict); only on the rare failure path does
each rank check its own gradients and the ranks gather the verdicts, so the culprits are
known everywhere (:attr:`FiniteCheck.culprits`). :func:`local_check` checks a rank's own
gradients before the exchange (what the sparse exchange needs: a NaN it does not send would
stay in its memory unseen)."""
from __future__ import annotations

import horovod.tensorflow as hvd
import tensorflow as tf

NONFINITE = "hetgrad: non-finite local gradient"


def _values(grads) -> list[tf.Tensor]:
    return [g.values if isinstance(g, tf.IndexedSlices) else g for g in grads if g is not None]


def _all_finite(grads) -> tf.Tensor:
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in _values(grads)])


def _after(check: tf.Tensor, grads) -> list:
    """``grads`` made to depend on ``check`` (no copies)."""
    with tf.control_dependencies([check]):
        return [None if g is None else
                tf.IndexedSlices(tf.identity(g.values), g.indices, g.dense_shape)
                if isinstance(g, tf.IndexedSlices) else tf.identity(g) for g in grads]


def local_check(grads) -> list:
    """The gradients, made to depend on a check that fails this rank's step if its own
    gradients hold NaN/Inf (the culprit is the rank that reports it)."""
    return _after(tf.debugging.Assert(_all_finite(grads), [NONFINITE]), grads)


class FiniteCheck:
    """Checks the exchanged gradients; on a NaN/Inf every rank fails its step, and
    :attr:`culprits` (one 0/1 flag per rank) says whose local gradients held it (all 0:
    the sum itself overflowed)."""

    def __init__(self, name: str = "hetgrad"):
        self.name = name
        self.culprits = tf.Variable(tf.zeros([hvd.size()], tf.int32), trainable=False,
                                    name="hetgrad_nonfinite_ranks")

    def after_exchange(self, reduced, local) -> list:
        total = tf.add_n([tf.reduce_sum(tf.cast(v, tf.float32)) for v in _values(reduced)])

        def name_them() -> tf.Tensor:
            mine = tf.logical_not(_all_finite(local))
            flags = hvd.allgather(tf.reshape(tf.cast(mine, tf.int32), [1]),
                                  name=f"{self.name}.nonfinite")
            with tf.control_dependencies([self.culprits.assign(flags)]):
                failed = tf.debugging.Assert(tf.constant(False), [NONFINITE])
            with tf.control_dependencies([failed]):
                return tf.constant(False)

        ok = tf.cond(tf.math.is_finite(total), lambda: tf.constant(True), name_them)
        return _after(ok, reduced)

    def read(self) -> list[int]:
        """The ranks whose local gradients held NaN/Inf in the failed step."""
        return [r for r, bad in enumerate(self.culprits.numpy()) if bad]
