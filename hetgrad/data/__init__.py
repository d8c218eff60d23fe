"""Training data: where samples come from -- arrays in memory (:mod:`.arrays`: a user's
arrays, the embedded digits set, synthetic data, Keras ``.npz`` files) or a dataset directory
of record files read by index (:mod:`.records`, made by ``hetgrad data convert``) -- the one
global order every rank visits them in (:mod:`.order`), and this rank's batches of it
(:mod:`.reader`, the only part that needs TensorFlow).

``--data`` names a dataset: :func:`load` (checked before TensorFlow is loaded)."""
from .arrays import ArraySource, digits, load, load_npz, synthetic
from .sources import Dataset, Field, Source

__all__ = ["ArraySource", "Dataset", "Field", "Source", "digits", "load", "load_npz",
           "synthetic"]
