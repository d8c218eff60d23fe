"""Error feedback in the graph: what a rank did not send is kept, per tensor, and added to its
next gradient (with DGC's momentum correction, a velocity is accumulated instead)."""
from __future__ import annotations

import tensorflow as tf


def _zeros(size: int, name: str) -> tf.Variable:
    return tf.Variable(tf.zeros([size], tf.float32), trainable=False, name=name)


class Memory:
    """Per-tensor residuals ``r`` (and velocities ``u`` with ``momentum`` m > 0).

    :meth:`compensate` turns a flat gradient ``g`` into what there is to send: ``r + g``, or
    with momentum correction ``u = m u + g; r + u``; the sum is kept in ``r`` itself.
    :meth:`forget` zeroes what was sent (and, with ``mask``, its velocity: DGC's momentum
    factor masking), so ``sent + r_new == r_old + g`` exactly."""

    def __init__(self, sizes: list[int], momentum: float = 0.0, mask: bool = True):
        self.momentum, self.mask = float(momentum), bool(mask)
        self.residuals = [_zeros(n, f"hetgrad_residual_{t}") for t, n in enumerate(sizes)]
        self.velocities = ([_zeros(n, f"hetgrad_velocity_{t}") for t, n in enumerate(sizes)]
                           if self.momentum else [])

    def compensate(self, t: int, grad: tf.Tensor) -> tf.Tensor:
        """Add ``grad`` (flat) to tensor ``t``'s memory; return the sum to send from."""
        if self.velocities:
            u = self.velocities[t]
            u.assign(self.momentum * u + grad)
            grad = u.read_value()
        r = self.residuals[t]
        r.assign_add(grad)
        return r.read_value()

    def forget(self, t: int, sent: tf.Tensor, keep_velocity: tf.Tensor | bool = False) -> None:
        """Zero tensor ``t``'s memory at the local indices ``sent`` (int32, any order); the
        velocity too with masking, unless ``keep_velocity`` (a dense step, which is then
        plain momentum SGD)."""
        where = tf.expand_dims(sent, 1)
        self.residuals[t].scatter_nd_update(where, tf.zeros_like(sent, tf.float32))
        if self.velocities and self.mask:
            masked = sent[:tf.where(keep_velocity, 0, tf.size(sent))]   # none in a dense step
            self.velocities[t].scatter_nd_update(tf.expand_dims(masked, 1),
                                                 tf.zeros_like(masked, tf.float32))

    def variables(self) -> dict[str, tf.Variable]:
        out = {f"residual_{t}": v for t, v in enumerate(self.residuals)}
        out.update({f"velocity_{t}": v for t, v in enumerate(self.velocities)})
        return out
