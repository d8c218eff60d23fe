"""Datasets: embedded digits, .npz files, and their errors."""
import numpy as np
import pytest

from hetgrad import data
from hetgrad.errors import HetgradError


def test_embedded_digits():
    d = data.digits()
    x, y = d.train.take(np.arange(len(d.train)))
    assert x.shape == (1437, 8, 8, 1) and len(d.test) == 360 and d.input_shape == (8, 8, 1)
    assert d.num_classes == 10 and 0.0 <= x.min() and x.max() == 1.0 and x.dtype == np.float32
    assert set(np.unique(y)) == set(range(10))


def test_npz_roundtrip(tmp_path):
    f = tmp_path / "tiny.npz"
    rng = np.random.default_rng(0)
    np.savez(f, x_train=rng.integers(0, 255, (20, 4, 4)), y_train=np.arange(20) % 3,
             x_test=rng.integers(0, 255, (5, 4, 4)), y_test=np.arange(5) % 3)
    d = data.load(str(f))
    assert d.input_shape == (4, 4, 1) and d.num_classes == 3 and len(d.test) == 5


def test_unreadable_npz_names_flag_and_file(tmp_path):
    f = tmp_path / "broken.npz"
    f.write_bytes(b"this is not a zip file")
    with pytest.raises(HetgradError, match=r"data: cannot read .*broken.npz"):
        data.load(str(f))


def test_npz_missing_arrays(tmp_path):
    f = tmp_path / "half.npz"
    np.savez(f, x_train=np.zeros((3, 2)), y_train=np.zeros(3))
    with pytest.raises(HetgradError, match=r"lacks arrays \['x_test', 'y_test'\]"):
        data.load(str(f))


def test_missing_file():
    with pytest.raises(HetgradError, match="data: no such dataset or file"):
        data.load("/nonexistent/file.npz")


def test_arrays_are_read_by_index_without_a_copy():
    x = np.arange(40, dtype=np.uint8).reshape(10, 2, 2)
    src = data.ArraySource(x, np.arange(10))
    xb, yb = src.take(np.array([7, 2]))
    assert np.array_equal(xb, x[[7, 2]]) and list(yb) == [7, 2]
    assert src.arrays[0] is x                  # the source holds the caller's array
    with pytest.raises(HetgradError, match="x: inputs and targets differ in length"):
        data.ArraySource(x, np.arange(9))
