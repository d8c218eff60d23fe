"""Datasets: embedded digits, .npz files, and their errors."""
import numpy as np
import pytest

from hetgrad import data
from hetgrad.errors import HetgradError


def test_embedded_digits():
    d = data.digits()
    assert d.x_train.shape == (1437, 8, 8, 1) and d.x_test.shape == (360, 8, 8, 1)
    assert d.num_classes == 10 and 0.0 <= d.x_train.min() and d.x_train.max() == 1.0
    assert set(np.unique(d.y_train)) == set(range(10))


def test_npz_roundtrip(tmp_path):
    f = tmp_path / "tiny.npz"
    rng = np.random.default_rng(0)
    np.savez(f, x_train=rng.integers(0, 255, (20, 4, 4)), y_train=np.arange(20) % 3,
             x_test=rng.integers(0, 255, (5, 4, 4)), y_test=np.arange(5) % 3)
    d = data.load(str(f))
    assert d.input_shape == (4, 4, 1) and d.num_classes == 3 and len(d.y_test) == 5


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


def test_shuffle_is_a_permutation():
    d = data.digits()
    s = d.shuffled(3)
    assert sorted(s.y_train.tolist()) == sorted(d.y_train.tolist())
    assert not np.array_equal(s.y_train, d.y_train)
