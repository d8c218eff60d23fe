"""Samples held in memory as arrays -- a user's arrays or dicts of arrays (``hk.fit``,
``hk.shard``), the embedded digits set, synthetic data, Keras-format ``.npz`` files -- read
by index without copying the whole set (each batch is gathered, then converted)."""
from __future__ import annotations

import random
import zipfile
from importlib import resources
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import HetgradError, InputFileError
from ..targets import CLASSES, VALUES
from .sources import Dataset, Field, Source

NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")


def nest_map(fn: Callable, structure):
    """``fn`` on every array of a structure of tuples, lists and dicts (``None`` kept)."""
    if isinstance(structure, dict):
        return {k: nest_map(fn, v) for k, v in structure.items()}
    if isinstance(structure, (tuple, list)):
        return type(structure)(nest_map(fn, v) for v in structure)
    return None if structure is None else fn(structure)


def nest_leaves(structure) -> list:
    """The arrays of a structure, in :func:`nest_map`'s order (``None`` left out)."""
    if isinstance(structure, dict):
        return [a for v in structure.values() for a in nest_leaves(v)]
    if isinstance(structure, (tuple, list)):
        return [a for v in structure for a in nest_leaves(v)]
    return [] if structure is None else [structure]


class ArraySource(Source):
    """Arrays in memory: ``x`` (an array, or a dict/list of arrays) and ``y`` (or None), all of
    one length. ``convert(x_batch)`` turns a gathered batch of ``x`` into what the model takes
    (e.g. uint8 images to float32 in [0, 1]); the arrays themselves are never copied."""

    def __init__(self, x, y=None, *, name: str = "arrays",
                 convert: Callable[[np.ndarray], np.ndarray] | None = None):
        self.name = name
        self.arrays = (x,) if y is None else (x, y)
        self.convert = convert
        lengths = {len(a) for a in nest_leaves(self.arrays)}
        if len(lengths) > 1:
            raise HetgradError(f"inputs and targets differ in length: {sorted(lengths)}",
                               field="x")
        if not lengths:
            raise HetgradError("no data given", field="x")
        self.size = lengths.pop()

    def __len__(self) -> int:
        return self.size

    def take(self, indices: np.ndarray):
        batch = nest_map(lambda a: a[indices], self.arrays)
        if self.convert is not None:
            batch = (nest_map(self.convert, batch[0]), *batch[1:])
        return batch

    @property
    def signature(self):
        one = self.take(np.arange(1))
        return nest_map(lambda a: Field(a.dtype, a.shape[1:]), one)


def _images(peak: float):
    """Images to float32 in [0, 1] (divided by the split's largest value), with a channel
    axis added to (H, W) images."""
    scale = np.float32(1.0 / peak) if peak > 0 else np.float32(1.0)

    def convert(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float32) * scale
        return x[..., None] if x.ndim == 3 else x
    return convert


def _split(name: str, x: np.ndarray, y: np.ndarray, values: bool) -> ArraySource:
    y = (np.asarray(y, np.float32).reshape(len(y), -1) if values
         else np.asarray(y).astype(np.int64).ravel())
    return ArraySource(x, y, name=name, convert=_images(float(x.max()) if x.size else 1.0))


def _prepare(name: str, arrays: dict, targets: str = CLASSES) -> Dataset:
    """The arrays as a dataset: ``targets`` CLASSES (integer labels, one output per class) or
    VALUES (float targets as rows, one output per column)."""
    values = targets == VALUES
    train = _split(name, arrays["x_train"], arrays["y_train"], values)
    test = _split(f"{name} (test)", arrays["x_test"], arrays["y_test"], values)
    x_shape = train.signature[0].shape
    outputs = (train.signature[1].shape[0] if values
               else int(max(arrays["y_train"].max(), arrays["y_test"].max())) + 1)
    return Dataset(name, train, test, tuple(x_shape), outputs)


def load_npz(path: str | Path, *, field: str = "data", targets: str = CLASSES) -> Dataset:
    """Read a Keras-style ``.npz`` (x_train, y_train, x_test, y_test); errors name the file."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as f:
            missing = [k for k in NPZ_KEYS if k not in f.files]
            if missing:
                raise InputFileError(f"{path} lacks arrays {missing} (needs {list(NPZ_KEYS)})",
                                     field=field)
            arrays = {k: f[k] for k in NPZ_KEYS}
    except InputFileError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise InputFileError(f"cannot read {path} as .npz: {exc}", field=field) from None
    check_arrays(path, arrays, field, targets)
    return _prepare(path.stem, arrays, targets)


def check_arrays(path: Path, arrays: dict, field: str = "data", targets: str = CLASSES) -> None:
    """What training needs of a dataset's arrays (class labels, or with ``targets`` VALUES
    finite targets); the first problem raises :class:`InputFileError` naming the file and
    the array."""
    def bad(text: str):
        raise InputFileError(f"{path}: {text}", field=field)

    for key, x in arrays.items():
        if not (np.issubdtype(x.dtype, np.number) or x.dtype == bool):
            bad(f"{key} has dtype {x.dtype}; numeric arrays needed")
    for split in ("train", "test"):
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        if x.ndim < 2:
            bad(f"x_{split} has shape {x.shape}; need (samples, features...)")
        if len(x) != len(y):
            bad(f"x_{split} has {len(x)} samples, y_{split} {len(y)}")
        if len(y) == 0:
            bad(f"x_{split} is empty")
        for key, a in ((f"x_{split}", x), (f"y_{split}", y)):
            if np.issubdtype(a.dtype, np.floating) and not np.isfinite(a).all():
                bad(f"{key} holds {int(np.size(a) - np.isfinite(a).sum())} NaN/Inf values")
        if targets == VALUES:
            continue
        if np.size(y) != len(y):
            bad(f"y_{split} has shape {y.shape}; need one integer label per sample (or a "
                "regression --loss such as mse for value targets)")
        _check_labels(y.ravel(), f"y_{split}", bad)
    if arrays["x_train"].shape[1:] != arrays["x_test"].shape[1:]:
        bad(f"x_test samples have shape {arrays['x_test'].shape[1:]}, x_train's "
            f"{arrays['x_train'].shape[1:]}")
    if targets == VALUES:
        if arrays["y_train"].shape[1:] != arrays["y_test"].shape[1:]:
            bad(f"y_test has shape {arrays['y_test'].shape[1:]} per sample, y_train "
                f"{arrays['y_train'].shape[1:]}")
        return
    classes = int(arrays["y_train"].max()) + 1
    if int(arrays["y_test"].max()) >= classes:
        bad(f"y_test has label {int(arrays['y_test'].max())}, but y_train only labels "
            f"0..{classes - 1}")


def _check_labels(y: np.ndarray, key: str, bad) -> None:
    if np.issubdtype(y.dtype, np.floating):
        if not np.isfinite(y).all() or (y != np.round(y)).any():
            bad(f"{key} holds non-integer labels; class labels must be integers 0..C-1 (for "
                "value targets give a regression --loss such as mse)")
    if (y < 0).any():
        bad(f"{key} holds negative label {int(y.min())}; labels must be 0..C-1")


def digits() -> Dataset:
    """The embedded UCI digits set (1,437 train / 360 test 8x8 images, 10 classes)."""
    with resources.as_file(resources.files("hetgrad") / "datasets" / "digits.npz") as p:
        return load_npz(p)


def synthetic(n_train: int = 4096, n_test: int = 1024, shape: tuple[int, ...] = (16, 16, 1),
              num_classes: int = 10, seed: int = 0) -> Dataset:
    """A learnable image task: class = noisy prototype pattern (harder than digits at 16x16)."""
    rng = np.random.default_rng(seed)
    protos = rng.normal(size=(num_classes, *shape)).astype(np.float32)

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, num_classes, size=n)
        x = protos[y] + 1.5 * rng.normal(size=(n, *shape)).astype(np.float32)
        return x, y

    xtr, ytr = draw(n_train)
    xte, yte = draw(n_test)
    lo, hi = xtr.min(), xtr.max()
    scale = lambda x: ((x - lo) / (hi - lo)).astype(np.float32)  # noqa: E731
    return Dataset("synthetic", ArraySource(scale(xtr), ytr, name="synthetic"),
                   ArraySource(np.clip(scale(xte), 0, 1), yte, name="synthetic (test)"),
                   tuple(shape), num_classes)


def mnist1d() -> Dataset:
    """MNIST-1D (Greydanus 2020, "Scaling down deep learning"): 4,000 train / 1,000 test
    sequences of 40 values, 10 classes, generated by the ``mnist1d`` package with its
    published arguments (seed 42): the same on every rank and run, no download."""
    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError as exc:
        raise InputFileError(f"--data mnist1d needs the mnist1d package ({exc}); "
                             "pip install mnist1d", field="data") from None
    saved = np.random.get_state(), random.getstate()
    try:   # it seeds the global generators: leave them as they were
        made = make_dataset(get_dataset_args())
    finally:
        np.random.set_state(saved[0])
        random.setstate(saved[1])
    split = {k: (made[f"x{s}"].astype(np.float32), made[f"y{s}"].astype(np.int64))
             for k, s in (("train", ""), ("test", "_test"))}
    return Dataset("mnist1d", ArraySource(*split["train"], name="mnist1d"),
                   ArraySource(*split["test"], name="mnist1d (test)"), (40,), 10)


BUILT_IN = {"digits": digits, "synthetic": synthetic, "mnist1d": mnist1d}


def load(spec: str, targets: str = CLASSES) -> Dataset:
    """``digits`` | ``synthetic`` | ``mnist1d`` | a path to a ``.npz`` file | a converted
    dataset directory (:mod:`.records`); ``targets``: what the labels are to the loss
    (:mod:`hetgrad.targets`)."""
    if spec in BUILT_IN:
        data = BUILT_IN[spec]()
        return data if targets != VALUES else _as_values(data)
    path = Path(spec)
    if path.is_dir():
        if targets == VALUES:
            raise InputFileError(f"{spec}: a dataset directory holds class labels; regression "
                                 "from record files is not supported yet (use a .npz)",
                                 field="data")
        from .records import open_dataset
        return open_dataset(path)
    if not path.exists():
        raise InputFileError(f"no such dataset or file: {spec!r} (use digits, synthetic, "
                             "mnist1d, a .npz path or a dataset directory from `hetgrad data "
                             "convert`)",
                             field="data")
    return load_npz(spec, targets=targets)


def _as_values(data: Dataset) -> Dataset:
    """An embedded set's integer labels as one float target each (regressing the label)."""
    def values(split: ArraySource) -> ArraySource:
        x, y = split.arrays
        return ArraySource(x, y.astype(np.float32).reshape(-1, 1), name=split.name,
                           convert=split.convert)
    return Dataset(data.name, values(data.train), values(data.test), data.input_shape, 1)
