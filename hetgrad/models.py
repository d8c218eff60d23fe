"""Models: MLP, small CNN, small ResNet (Keras functional API of the running flavour), or a
user's own model function named by an import path (``mypkg.models:build``)."""
from __future__ import annotations

import importlib
import inspect
import os
import sys
from typing import Callable

import tensorflow as tf

from .compat import keras
from .config import unknown_model
from .errors import ConfigError
from .targets import ONE_HOT, kind_of

layers = keras.layers


def mlp(input_shape, num_classes: int, width: int = 128) -> keras.Model:
    inp = keras.Input(input_shape)
    x = layers.Flatten()(inp)
    x = layers.Dense(width, activation="relu")(x)
    x = layers.Dense(width, activation="relu")(x)
    return keras.Model(inp, layers.Dense(num_classes)(x), name="mlp")


def cnn(input_shape, num_classes: int, width: int = 32) -> keras.Model:
    inp = keras.Input(input_shape)
    x = layers.Conv2D(width, 3, padding="same", activation="relu")(inp)
    x = layers.Conv2D(width, 3, padding="same", activation="relu")(x)
    x = layers.MaxPooling2D(2)(x)
    x = layers.Conv2D(2 * width, 3, padding="same", activation="relu")(x)
    x = layers.MaxPooling2D(2)(x)
    x = layers.Flatten()(x)  # keeps where features are (global pooling would drop it)
    x = layers.Dense(128, activation="relu")(x)
    return keras.Model(inp, layers.Dense(num_classes)(x), name="cnn")


def cnn1d(input_shape, num_classes: int, width: int = 25) -> keras.Model:
    """MNIST-1D's reference CNN (about 5k weights; ~94 % in its paper): three strided 1-D
    convolutions and a linear layer. A sample of shape ``(L,)`` is taken as ``(L, 1)``."""
    inp = keras.Input(input_shape)
    x = layers.Reshape((*input_shape, 1))(inp) if len(input_shape) == 1 else inp
    x = layers.Conv1D(width, 5, strides=2, padding="same", activation="relu")(x)
    x = layers.Conv1D(width, 3, strides=2, padding="same", activation="relu")(x)
    x = layers.Conv1D(width, 3, strides=2, padding="same", activation="relu")(x)
    x = layers.Flatten()(x)
    return keras.Model(inp, layers.Dense(num_classes)(x), name="cnn1d")


def resnet(input_shape, num_classes: int, width: int = 32, blocks: int = 3) -> keras.Model:
    """A small pre-activation ResNet without batch norm (BN statistics are biased under
    unequal batches, see docs/design.md); residual blocks with a scaled identity path."""
    inp = keras.Input(input_shape)
    x = layers.Conv2D(width, 3, padding="same")(inp)
    for _ in range(blocks):
        h = layers.Activation("relu")(x)
        h = layers.Conv2D(width, 3, padding="same", activation="relu")(h)
        h = layers.Conv2D(width, 3, padding="same")(h)
        x = layers.Add()([x, h])
    x = layers.Activation("relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inp, layers.Dense(num_classes)(x), name="resnet")


def wide_mlp(input_shape, num_classes: int, width: int = 1024) -> keras.Model:
    """About 1-2M parameters: for allreduce overhead benchmarks."""
    return mlp(input_shape, num_classes, width)


def big_mlp(input_shape, num_classes: int) -> keras.Model:
    """About 10.5M parameters on 64 features (width 3200): communication-bound, for the sparse
    benchmark on a slow network."""
    return mlp(input_shape, num_classes, 3200)


MODELS = {"mlp": mlp, "cnn": cnn, "cnn1d": cnn1d, "resnet": resnet, "wide-mlp": wide_mlp,
          "big-mlp": big_mlp}


def resolve(name: str) -> Callable:
    """The function that builds model ``name``: a built-in, or ``module:function`` (imported
    with the working directory on the path), called as ``function(input_shape, num_classes)``."""
    if ":" not in name:
        if name not in MODELS:
            raise ConfigError(unknown_model(name), field="model")
        return MODELS[name]
    module_name, _, attr = name.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())   # as `python train.py` would find the user's module
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import {module_name!r} ({exc})", field="model") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"{module_name} has no function {attr!r}", field="model")
    try:
        inspect.signature(fn).bind((1,), 2)
    except TypeError as exc:
        raise ConfigError(f"{name} cannot be called as {attr}(input_shape, num_classes): "
                          f"{exc}", field="model") from None
    except ValueError:   # no signature to check (a builtin): calling it will tell
        pass
    return fn


def build(name: str, input_shape, num_classes: int, seed: int = 0) -> keras.Model:
    """Build model ``name`` with weights seeded by ``seed`` (same on every rank); its output
    must be one value per class (or per target column of a regression)."""
    fn = resolve(name)
    keras.utils.set_random_seed(seed)
    model = fn(tuple(input_shape), num_classes)
    if not isinstance(model, keras.Model):
        raise ConfigError(f"{name} returned a {type(model).__name__}, not a model of "
                          f"{keras.__name__}", field="model")
    shape = getattr(model, "output_shape", None)
    if isinstance(shape, tuple) and shape and shape[-1] not in (None, num_classes):
        raise ConfigError(f"{name} has {shape[-1]} outputs; the data needs {num_classes} (one "
                          "per class, or per target column of a regression loss)",
                          field="model")
    return model


# losses that read probabilities: on a model that outputs logits (every built-in model ends in
# a linear layer) the cross-entropies take them as logits, the divergences their softmax
_FROM_LOGITS = {"categoricalcrossentropy": "CategoricalCrossentropy",
                "sparsecategoricalcrossentropy": "SparseCategoricalCrossentropy",
                "categoricalfocalcrossentropy": "CategoricalFocalCrossentropy"}
_ON_PROBABILITIES = {"kldivergence", "kld", "kullbackleiblerdivergence"}


def loss(name: str | None, num_classes: int | None = None, logits: bool = True):
    """A Keras loss by name (``--loss``); default sparse categorical cross-entropy on logits
    (any model's output is taken as one logit per class). With ``logits`` (the model's last
    layer is linear, as every built-in model's) a loss that reads probabilities reads the
    logits as such (``from_logits``) or their softmax. A categorical loss
    (:data:`hetgrad.targets.ONE_HOT`) gets the integer labels as one-hot rows of
    ``num_classes``."""
    if name is None:   # a model's output is one logit per class, whatever model
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    key = name.lower().replace("_", "")
    try:
        if logits and key in _FROM_LOGITS:
            fn = getattr(keras.losses, _FROM_LOGITS[key])(from_logits=True)
        else:
            fn = keras.losses.get(name)
    except (ValueError, TypeError, AttributeError) as exc:
        raise ConfigError(f"unknown Keras loss {name!r} ({exc})", field="loss") from None
    read = (lambda y: tf.nn.softmax(y)) if logits and key in _ON_PROBABILITIES else (lambda y: y)
    if kind_of(name) != ONE_HOT:
        return fn

    def on_one_hot(y_true, y_pred):
        labels = tf.cast(tf.reshape(y_true, [-1]), tf.int32)
        return fn(tf.one_hot(labels, num_classes, dtype=y_pred.dtype), read(y_pred))
    on_one_hot.__name__ = f"{name}_on_labels"
    return on_one_hot
