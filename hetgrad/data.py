"""Datasets: the embedded digits set, Keras-format .npz files, and synthetic data."""
from __future__ import annotations

import zipfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from .errors import InputFileError

NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")


@dataclass
class Dataset:
    """Arrays ready for Keras: float32 images in [0, 1] with a channel axis, int labels."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def num_classes(self) -> int:
        return int(max(self.y_train.max(), self.y_test.max())) + 1

    def shuffled(self, seed: int) -> "Dataset":
        """Same data, training set permuted by ``seed`` (identically on every rank)."""
        perm = np.random.default_rng(seed).permutation(len(self.y_train))
        return Dataset(self.name, self.x_train[perm], self.y_train[perm], self.x_test,
                       self.y_test)


def _prepare(name: str, arrays: dict) -> Dataset:
    def images(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        peak = float(x.max()) if x.size else 1.0
        x = x / (peak if peak > 0 else 1.0)
        return x[..., None] if x.ndim == 3 else x

    return Dataset(name, images(arrays["x_train"]), np.asarray(arrays["y_train"]).astype(np.int64).ravel(),
                   images(arrays["x_test"]), np.asarray(arrays["y_test"]).astype(np.int64).ravel())


def load_npz(path: str | Path, *, field: str = "data") -> Dataset:
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
    check_arrays(path, arrays, field)
    return _prepare(path.stem, arrays)


def check_arrays(path: Path, arrays: dict, field: str = "data") -> None:
    """What training needs of a dataset's arrays; the first problem raises
    :class:`InputFileError` naming the file and the array."""
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
        if np.size(y) != len(y):
            bad(f"y_{split} has shape {y.shape}; need one integer label per sample")
        if np.issubdtype(x.dtype, np.floating) and not np.isfinite(x).all():
            bad(f"x_{split} holds {int(np.size(x) - np.isfinite(x).sum())} NaN/Inf values")
        _check_labels(y.ravel(), f"y_{split}", bad)
    if arrays["x_train"].shape[1:] != arrays["x_test"].shape[1:]:
        bad(f"x_test samples have shape {arrays['x_test'].shape[1:]}, x_train's "
            f"{arrays['x_train'].shape[1:]}")
    classes = int(arrays["y_train"].max()) + 1
    if int(arrays["y_test"].max()) >= classes:
        bad(f"y_test has label {int(arrays['y_test'].max())}, but y_train only labels "
            f"0..{classes - 1}")


def _check_labels(y: np.ndarray, key: str, bad) -> None:
    if np.issubdtype(y.dtype, np.floating):
        if not np.isfinite(y).all() or (y != np.round(y)).any():
            bad(f"{key} holds non-integer labels; class labels must be integers 0..C-1")
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
    return Dataset("synthetic", scale(xtr), ytr, np.clip(scale(xte), 0, 1), yte)


def load(spec: str) -> Dataset:
    """``digits`` | ``synthetic`` | a path to a ``.npz`` file."""
    if spec == "digits":
        return digits()
    if spec == "synthetic":
        return synthetic()
    if not Path(spec).exists():
        raise InputFileError(f"no such dataset or file: {spec!r} (use digits, synthetic or a .npz path)",
                             field="data")
    return load_npz(spec)
