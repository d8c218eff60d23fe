"""Built-in models and ``--loss``: what the model's output is to the loss."""
import numpy as np
import pytest

from hetgrad.errors import HetgradError
from hetgrad.models import build, loss

LABELS = np.array([0, 2, 1, 2])
LOGITS = np.array([[2.0, -1.0, 0.5], [0.1, 0.2, 3.0], [-2.0, 1.5, 0.0], [1.0, 1.0, 1.0]],
                  np.float32)


def _sparse_ce() -> float:
    p = np.exp(LOGITS) / np.exp(LOGITS).sum(1, keepdims=True)
    return float(-np.log(p[np.arange(4), LABELS]).mean())


@pytest.mark.parametrize("name", [None, "sparse_categorical_crossentropy",
                                  "categorical_crossentropy", "kl_divergence"])
def test_a_built_in_models_logits_are_read_as_logits(name):
    # one-hot labels: KL divergence = cross-entropy (the labels' entropy is 0)
    per_sample = loss(name, 3, logits=True)(LABELS, LOGITS)   # a Keras loss or its function
    assert float(np.mean(per_sample)) == pytest.approx(_sparse_ce(), rel=1e-5)


def test_a_users_model_gets_the_loss_keras_names():
    probs = np.full((4, 3), 1 / 3, np.float32)           # a softmax output
    per_sample = loss("categorical_crossentropy", 3, logits=False)(LABELS, probs)
    assert float(np.mean(per_sample)) == pytest.approx(np.log(3), rel=1e-5)


def test_cnn1d_is_mnist1ds_reference_cnn():
    model = build("cnn1d", (40,), 10)
    assert model.output_shape == (None, 10) and model.count_params() == 5210


def test_an_output_of_another_width_is_refused_whatever_the_loss(tmp_path, monkeypatch):
    (tmp_path / "five.py").write_text(
        "from hetgrad.compat import keras\n"
        "def build(shape, classes):\n"
        "    inp = keras.Input(shape)\n"
        "    return keras.Model(inp, keras.layers.Dense(5)(inp))\n")
    monkeypatch.chdir(tmp_path)
    assert build("five:build", (4,), 5).output_shape == (None, 5)
    with pytest.raises(HetgradError, match="five:build has 5 outputs; the data needs 3"):
        build("five:build", (4,), 3)
