"""Per-sample decoding of stored records, named in a dataset's manifest: ``image:HxW`` (an
image file -- JPEG, PNG, ... -- decoded, resized to H x W, as float32 in [0, 1]) or
``module:function``, the user's own ``function(features, label) -> (features, label)`` of TF
ops (decode, augment), imported from the working directory when first used."""
from __future__ import annotations

import importlib
import os
import sys

from ..errors import InputFileError


def decoder(spec: str):
    """The decode function ``spec`` names (its import is deferred to the first sample)."""
    if spec.startswith("image:"):
        try:
            height, width = (int(v) for v in spec[len("image:"):].lower().split("x"))
        except ValueError:
            raise InputFileError(f"decode {spec!r}: expected image:HxW, e.g. image:64x64",
                                 field="data") from None
        return lambda image, *rest: (decode_image(image, height, width), *rest)
    module, _, name = spec.partition(":")
    if not (module and name):
        raise InputFileError(f"decode {spec!r}: expected module:function or image:HxW",
                             field="data")
    found = {}

    def apply(*sample):
        if "fn" not in found:
            found["fn"] = user_function(spec)
        return found["fn"](*sample)
    return apply


def user_function(spec: str):
    """``module:function``, imported with the working directory on the path."""
    module, _, name = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        fn = getattr(importlib.import_module(module), name, None)
    except ImportError as exc:
        raise InputFileError(f"cannot import {module!r} ({exc})", field="data") from None
    if not callable(fn):
        raise InputFileError(f"{module} has no function {name!r}", field="data")
    return fn


def decode_image(data, height: int, width: int):
    """Bytes of an image file -> float32 (height, width, 3) in [0, 1]."""
    import tensorflow as tf
    image = tf.io.decode_image(data, channels=3, expand_animations=False)
    image = tf.image.resize(image, (height, width))
    return tf.cast(image, tf.float32) / 255.0
