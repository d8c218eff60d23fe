"""``hetgrad.keras.callbacks``: the callbacks of :mod:`hetgrad._keras.callbacks` under the name
Horovod users import them by (``horovod.tensorflow.keras.callbacks``)."""
from .._keras.callbacks import *  # noqa: F401,F403
from .._keras.callbacks import __all__  # noqa: F401
