"""How hetgrad's aggregation hooks into the optimizer class of each Keras flavour: mixins put
in front of the user's optimizer class by :func:`hetgrad.keras.DistributedOptimizer`.

Where the flavour lets us, the backward pass is *seeded* with this rank's weight ``w_i``
(free): Keras 2 through ``compute_gradients`` (``grad_loss`` for the legacy OptimizerV2), Keras
3 through ``scale_loss``, which its train step applies inside the tape. Gradients that reach
``apply_gradients``/``apply`` without that (a custom train step) are weighted there instead, so
no path skips the exchange. Every pass advances the aggregation's step counter, which the
plan's per-step weights read (a step a ``LossScaleOptimizer`` skips still counts).
"""
from __future__ import annotations

import tensorflow as tf

from .. import compat
from ..aggregate import Aggregation


class _Hooked:
    """What every flavour's mixin shares: weight (unless the pass was seeded), then exchange
    -- or, with ``backward_passes_per_step`` N > 1, add to local accumulators and exchange
    and apply once every N steps. ``_hetgrad_seeded`` and ``_hetgrad_exchanged`` are Python
    state of the trace (set and cleared within one traced step)."""

    hetgrad: Aggregation
    _hetgrad_seeded = False
    _hetgrad_passes = 1
    _hetgrad_average_passes = False
    _hetgrad_acc: list | None = None
    _hetgrad_local: frozenset = frozenset()    # variable keys (compat.variable_key)
    _hetgrad_exchanged = False

    def register_local_var(self, var) -> None:
        """Keep ``var``'s gradient on this rank, never exchanged (Horovod's
        ``register_local_var``): ``w_i g_i``, as every gradient is weighted -- with Horovod's
        equal weights ``g_i / P``, what Horovod gives."""
        self._hetgrad_local = self._hetgrad_local | {compat.variable_key(var)}
        weight = self.hetgrad.weight
        if getattr(weight, "fused", False):
            weight.fused = False   # the pass is seeded with w_i itself, not n_i

    def _hetgrad_exchange(self, grads, variables) -> list:
        """The exchanged gradients, those of local variables kept as they are."""
        if getattr(self.hetgrad.noise, "precondition", None) is not None:
            with tf.init_scope():   # its slots are read inside a cond, where none may be born
                compat.build_optimizer(self, variables)
        if not self._hetgrad_local:
            return self.hetgrad.exchange(grads, variables)
        local = [compat.variable_key(v) in self._hetgrad_local for v in variables]
        shared = iter(self.hetgrad.exchange([g for g, mine in zip(grads, local) if not mine],
                                            [v for v, mine in zip(variables, local) if not mine]))
        return [g if mine else next(shared) for g, mine in zip(grads, local)]

    def _hetgrad_weighted(self, grads) -> list:
        seeded, self._hetgrad_seeded = self._hetgrad_seeded, False
        return self.hetgrad.weighted(list(grads), seeded)

    def _hetgrad_apply(self, grads, variables, apply_fn):
        """``apply_fn(exchanged_grads)`` now, or every N-th step on the accumulated sum
        (gradients from Horovod's ``_compute_gradients`` arrive exchanged already)."""
        done, self._hetgrad_exchanged = self._hetgrad_exchanged, False
        grads = list(grads) if done else self._hetgrad_weighted(grads)
        exchange = (lambda g: g) if done else (lambda g: self._hetgrad_exchange(g, variables))
        self.hetgrad.count_step()
        if self._hetgrad_passes == 1:
            return apply_fn(exchange(grads))
        self._hetgrad_build(variables)
        acc, count = self._hetgrad_acc
        count.assign_add(1)
        for a, g in zip(acc, grads):
            if g is not None:
                a.assign_add(tf.convert_to_tensor(g))
        scale = 1.0 / self._hetgrad_passes if self._hetgrad_average_passes else 1.0

        def update():
            summed = [None if g is None else a * scale for a, g in zip(acc, grads)]
            apply_fn(exchange(summed))
            for a in acc:
                a.assign(tf.zeros_like(a))
            return tf.constant(True)

        def skip():  # the pass counts as an iteration, as in Horovod
            self.iterations.assign_add(1)
            return tf.constant(False)

        return tf.cond(tf.equal(count % self._hetgrad_passes, 0), update, skip)

    def _hetgrad_build(self, variables) -> None:
        """Accumulators, and the optimizer's own slots (no variable may be born in a cond)."""
        with tf.init_scope():
            if self._hetgrad_acc is None:
                self._hetgrad_acc = (
                    [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False)
                     for v in compat.tf_variables(variables)],
                    tf.Variable(0, dtype=tf.int64, trainable=False))
            compat.build_optimizer(self, variables)


class _Keras2(_Hooked):
    """Keras 2.11+ optimizers: ``minimize`` calls ``compute_gradients`` (seeded here) then
    ``apply_gradients`` (exchanged here, as is a custom train step's)."""

    def compute_gradients(self, loss, var_list, tape=None):
        if not callable(loss) and tape is None:
            raise ValueError("compute_gradients needs a tape when loss is a tensor")
        tape = tape if tape is not None else tf.GradientTape()
        if callable(loss):
            with tape:
                tape.watch(var_list)
                loss = loss()
        w = tf.cast(self.hetgrad.local_weight(), loss.dtype)
        grads = tape.gradient(loss, var_list, output_gradients=tf.fill(tf.shape(loss), w))
        self._hetgrad_seeded = True
        return list(zip(grads, var_list))

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        """Horovod's: the weighted gradients, exchanged here (``apply_gradients`` then applies
        them as they are)."""
        if grad_loss is not None:
            raise ValueError("hetgrad's DistributedOptimizer seeds the backward pass itself: "
                             "no grad_loss")
        grads, variables = zip(*self.compute_gradients(loss, var_list, tape))
        self._hetgrad_seeded, self._hetgrad_exchanged = False, True
        return list(zip(self._hetgrad_exchange(list(grads), variables), variables))

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        if not grads_and_vars:  # nothing to exchange; Keras treats it as a no-op
            self._hetgrad_seeded = self._hetgrad_exchanged = False
            return super().apply_gradients(grads_and_vars, *args, **kwargs)
        grads, variables = zip(*grads_and_vars)
        apply = super().apply_gradients
        return self._hetgrad_apply(
            grads, variables, lambda g: apply(zip(g, variables), *args, **kwargs))


class _Keras2Legacy(_Keras2):
    """Keras 2's ``optimizers.legacy.*`` (OptimizerV2): ``grad_loss`` seeds the pass."""

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        if grad_loss is not None:
            raise ValueError("hetgrad's DistributedOptimizer sets grad_loss itself")
        gv = super(_Keras2, self)._compute_gradients(  # OptimizerV2's, which minimize calls
            loss, var_list, grad_loss=self.hetgrad.local_weight(), tape=tape)
        self._hetgrad_seeded = True
        return gv


class _Keras3(_Hooked):
    """Keras 3 optimizers: the train step calls ``scale_loss`` inside the tape, then
    ``apply_gradients`` -> ``apply``."""

    def scale_loss(self, loss):
        self._hetgrad_seeded = True
        return super().scale_loss(loss) * tf.cast(self.hetgrad.local_weight(), loss.dtype)

    def apply(self, grads, trainable_variables=None):
        variables = (trainable_variables if trainable_variables is not None
                     else self._trainable_variables)
        apply = super().apply
        return self._hetgrad_apply(grads, variables, lambda g: apply(g, trainable_variables))


MIXINS = {"keras3": _Keras3, "keras2": _Keras2, "legacy": _Keras2Legacy}


def hooked_class(base: type, kind: str, rebuild) -> type:
    """``base`` with the mixin of its flavour ``kind`` (:func:`hetgrad.compat.optimizer_kind`)
    in front, under ``base``'s own name and module, so a saved model names ``base`` (any Keras
    loads it, without hetgrad); ``rebuild(config)`` is its ``from_config`` (the optimizer made
    again with the same aggregation settings)."""
    mixin = MIXINS[kind]
    return type(base.__name__, (mixin, base), {
        "__module__": base.__module__, "__qualname__": base.__qualname__,
        "_hetgrad_base": base,
        "from_config": classmethod(lambda c, config, custom_objects=None: rebuild(config))})
