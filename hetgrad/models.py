"""Models: MLP, small CNN, small ResNet (Keras functional API of the running flavour)."""
from __future__ import annotations

from .compat import keras
from .errors import ConfigError

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


MODELS = {"mlp": mlp, "cnn": cnn, "resnet": resnet, "wide-mlp": wide_mlp}


def build(name: str, input_shape, num_classes: int, seed: int = 0) -> keras.Model:
    """Build model ``name`` with weights seeded by ``seed`` (same on every rank)."""
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}; choose from {sorted(MODELS)}", field="model")
    keras.utils.set_random_seed(seed)
    return MODELS[name](tuple(input_shape), num_classes)
