"""Each train step's batch size, recorded by the step itself: what ``weight="samples"`` and
the sample-weighted metric average need. Every model compiled with a hetgrad optimizer counts
(:func:`count_on_compile`), so ``fit``, ``train_on_batch`` and a custom ``train_step`` weigh
uneven batches exactly with no callback. A step of no samples (a rank with none in an epoch's
final step of fewer samples than ranks) still joins the exchange, with weight 0, and leaves
the model's own state as it was (BatchNormalization's statistics of an empty batch are NaN)."""
from __future__ import annotations

import functools

import tensorflow as tf

from ..aggregate import SampleWeight
from .found import aggregation_in


class _EpochSamples:
    """A plain holder, so Keras does not track the variable as one of the model's weights."""

    def __init__(self):
        self.var = tf.Variable(0.0, dtype=tf.float64, trainable=False,
                               name="hetgrad_epoch_samples")


def epoch_samples(model) -> tf.Variable:
    """The model's running count of samples trained this epoch (created on first use)."""
    if getattr(model, "_hetgrad_epoch_samples", None) is None:
        model._hetgrad_epoch_samples = _EpochSamples()
    return model._hetgrad_epoch_samples.var


def counted(model) -> list[tf.Variable]:
    """The model's count of samples as a list: empty where it counts none (not created)."""
    holder = getattr(model, "_hetgrad_epoch_samples", None)
    return [holder.var] if holder is not None else []


def count_samples(model) -> None:
    """Make each train step record its batch size: for ``weight="samples"`` and for the
    sample-weighted metric average. Idempotent; hetgrad's callbacks call it in ``fit``."""
    if getattr(model, "_hetgrad_counted", False):
        return
    samples = epoch_samples(model)
    inner = model.train_step

    def train_step(data):  # runs when Keras traces the step: reads the optimizer of then
        aggregation = aggregation_in(model.optimizer)
        weight = getattr(aggregation, "weight", None)
        x = data[0] if isinstance(data, (tuple, list)) else data
        n = tf.shape(next(t for t in tf.nest.flatten(x) if t is not None))[0]
        if isinstance(weight, SampleWeight):
            weight.count.assign(n)
        if aggregation is not None:
            aggregation.idle.assign(tf.equal(n, 0))
        samples.assign_add(tf.cast(n, samples.dtype))
        before = [(v, tf.identity(v)) for v in model.non_trainable_variables]
        logs = inner(data)
        tf.cond(n > 0, lambda: tf.constant(False), lambda: _restored(before))
        return logs

    model.train_step = train_step
    model.train_function = None  # rebuild with the new step
    model._hetgrad_counted = True


def _restored(before: list) -> tf.Tensor:
    """Every ``(variable, value)`` of ``before`` assigned back."""
    for var, value in before:
        var.assign(value)
    return tf.constant(True)


def count_on_compile(model_class) -> None:
    """Make ``compile`` of ``model_class`` (the Keras flavour's ``Model``) install
    :func:`count_samples` on every model compiled with a hetgrad optimizer. Patched where
    ``compile`` is defined (Keras 3: its trainer), so Keras still sees it as its own (a loaded
    model is compiled from its config only when ``compile`` is not overridden). Idempotent."""
    owner = next(k for k in model_class.__mro__ if "compile" in vars(k))
    compile_ = owner.compile
    if getattr(compile_, "_hetgrad_counts", False):
        return

    @functools.wraps(compile_)
    def compile(self, *args, **kwargs):
        compile_(self, *args, **kwargs)
        if aggregation_in(getattr(self, "optimizer", None)) is not None:
            count_samples(self)

    compile._hetgrad_counts = True
    owner.compile = compile
