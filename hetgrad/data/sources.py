"""What a training run reads its samples from: a :class:`Source` holds ``N`` samples that can
be read by index, as numpy, the same on every rank; a :class:`Dataset` pairs the training
source with an optional test source and what the model needs to know (input shape,
classes). Sources need no TensorFlow: the start-up checks open them."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Field:
    """One array of a sample: its dtype and shape (without the batch axis)."""

    dtype: np.dtype
    shape: tuple


class Source:
    """``N`` samples read by index. ``take(indices)`` returns their structure (e.g. ``(x, y)``
    or ``({"a": a}, y)``) stacked along a first axis, in the order asked; ``signature`` is that
    structure with a :class:`Field` for each array; ``decode``, if set, is applied by the reader
    to every sample (a TF function of one sample's structure, e.g. JPEG bytes to an image)."""

    name: str = "data"
    decode = None

    def __len__(self) -> int:
        raise NotImplementedError

    def take(self, indices: np.ndarray):
        raise NotImplementedError

    @property
    def signature(self):
        raise NotImplementedError

    def head(self, count: int):
        """The first ``count`` samples in storage order (what the probe times)."""
        return self.take(np.arange(min(count, len(self))))


@dataclass
class Dataset:
    """A training source, an optional test source (scored after every epoch by ``hetgrad
    train``), and the model's input shape and number of classes."""

    name: str
    train: Source
    test: Source | None
    input_shape: tuple[int, ...]
    num_classes: int
