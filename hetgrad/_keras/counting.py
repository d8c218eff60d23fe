"""Each train step's batch size, recorded by the step itself: what ``weight="samples"`` and
the sample-weighted metric average need."""
from __future__ import annotations

import tensorflow as tf

from ..aggregate import SampleWeight
from .optimizer import aggregation_in


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


def count_samples(model) -> None:
    """Make each train step record its batch size: for ``weight="samples"`` and for the
    sample-weighted metric average. Idempotent; hetgrad's callbacks call it in ``fit``."""
    if getattr(model, "_hetgrad_counted", False):
        return
    samples = epoch_samples(model)
    inner = model.train_step

    def train_step(data):  # runs when Keras traces the step: reads the optimizer of then
        weight = getattr(aggregation_in(model.optimizer), "weight", None)
        x = data[0] if isinstance(data, (tuple, list)) else data
        n = tf.shape(next(t for t in tf.nest.flatten(x) if t is not None))[0]
        if isinstance(weight, SampleWeight):
            weight.count.assign(n)
        samples.assign_add(tf.cast(n, samples.dtype))
        return inner(data)

    model.train_step = train_step
    model.train_function = None  # rebuild with the new step
    model._hetgrad_counted = True
