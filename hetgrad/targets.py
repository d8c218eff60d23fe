"""What ``hetgrad train --loss`` asks of the labels: class indices (the default, sparse
losses), class indices turned into one-hot rows for the loss (categorical losses), or
values to regress (float targets, one output per target column). Needs no TensorFlow: the
start-up checks read the data by it."""
from __future__ import annotations

from .errors import ConfigError

CLASSES, ONE_HOT, VALUES = "classes", "one_hot", "values"

_ONE_HOT = {"categoricalcrossentropy", "categoricalhinge", "categoricalfocalcrossentropy",
            "kldivergence", "kld", "kullbackleiblerdivergence"}
_VALUES = {"meansquarederror", "mse", "meanabsoluteerror", "mae",
           "meanabsolutepercentageerror", "mape", "meansquaredlogarithmicerror", "msle",
           "huber", "logcosh", "cosinesimilarity", "poisson"}
_BINARY = {"binarycrossentropy", "binaryfocalcrossentropy", "hinge", "squaredhinge"}


def kind_of(loss: str | None) -> str:
    """:data:`CLASSES`, :data:`ONE_HOT` or :data:`VALUES` for a Keras loss name (``None``:
    the default sparse cross-entropy); a loss hetgrad train cannot feed is refused."""
    key = (loss or "").lower().replace("_", "")
    if key in _BINARY:
        raise ConfigError(f"{loss} wants 0/1 labels and one output per sample: hetgrad train "
                          "trains classes (sparse or categorical losses) and regression (mse, "
                          "mae, huber, ...); use your own script (hetgrad.keras) for it",
                          field="loss")
    if key in _ONE_HOT:
        return ONE_HOT
    return VALUES if key in _VALUES else CLASSES


def metric(kind: str) -> str:
    """The metric ``hetgrad train`` reports for a kind of target."""
    return "mae" if kind == VALUES else "accuracy"
