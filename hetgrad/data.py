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
    for split in ("train", "test"):
        if len(arrays[f"x_{split}"]) != len(arrays[f"y_{split}"]):
            raise InputFileError(f"{path}: x_{split} and y_{split} have different lengths",
                                 field=field)
    if len(arrays["y_train"]) == 0:
        raise InputFileError(f"{path}: x_train is empty", field=field)
    for key in ("x_train", "x_test"):
        x = arrays[key]
        if np.issubdtype(x.dtype, np.floating) and not np.isfinite(x).all():
            raise InputFileError(f"{path}: {key} holds {int(np.size(x) - np.isfinite(x).sum())} "
                                 "NaN/Inf values", field=field)
    return _prepare(path.stem, arrays)


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
