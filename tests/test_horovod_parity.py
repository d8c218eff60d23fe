"""What a Horovod user relies on, with real ranks: 3 ranks, uneven batches, every result
compared with one process on the concatenated batch (tests/mpi/parity.py)."""
import subprocess
import sys

import pytest


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return tmp_path_factory.mktemp("parity")


@pytest.fixture(scope="module")
def parity(world3, files):
    return world3.run("parity:run", str(files), timeout=400).root


def test_ranks_run_the_flavour_of_this_stack(parity):
    from hetgrad import compat  # the ranks inherit TF_USE_LEGACY_KERAS from this process
    assert parity["flavour"] == compat.FLAVOUR


def test_one_line_switch_equals_horovods_average_on_equal_batches(parity):
    assert parity["default_equal"] < 1e-6


def test_train_on_batch_without_callbacks_weighs_uneven_batches_exactly(parity):
    assert parity["uncounted_train_on_batch"] < 1e-6


def test_broadcast_starts_every_rank_from_rank_0(parity):
    assert parity["broadcast"] < 1e-6 and parity["broadcast_spread"] == 0.0


def test_broadcast_variables_in_place_only_where_every_rank_can(parity):
    """Two unnamed tf.Variables (one name twice: Horovod's in-place op would refuse them):
    the traced way; named ones: in place. Rank 0's values on every rank either way."""
    rows = parity["broadcast_named"]   # per rank: in place (unnamed, named), then the values
    assert len(rows) == 3 and all(row == [0.0, 1.0, 1.0, 2.0, 0.0, 0.0] for row in rows)


def test_metric_average_is_sample_weighted(parity):
    assert parity["metric_average"] < 1e-6


def test_learning_rate_callbacks(parity):
    assert parity["warmup_lr"] == pytest.approx([0.5 * 2 / 3, 0.5], rel=1e-6)
    assert parity["schedule_lr"] == pytest.approx([0.5, 0.5, 0.05], rel=1e-6)


def test_from_config_keeps_the_aggregation(parity):
    assert parity["from_config_is_hetgrad"] and parity["from_config"] < 1e-6


def test_saved_model_loads_with_an_aggregating_optimizer(parity):
    formats = ["keras"] + ([] if parity["flavour"] == "keras3" else ["h5"])
    for fmt in formats:
        assert parity[f"load_{fmt}_is_hetgrad"], fmt
        assert parity[f"load_{fmt}"] < 1e-6, fmt


def test_saved_model_loads_in_a_python_without_hetgrad(parity, files):
    """Inference and serving never import hetgrad: the optimizer is saved under its own
    class (as Horovod keeps the class name), with its state."""
    formats = ["keras"] + ([] if parity["flavour"] == "keras3" else ["h5"])
    code = ("import sys, tensorflow as tf\n"
            "m = tf.keras.models.load_model(sys.argv[1])\n"
            "print(type(m.optimizer).__name__, int(m.optimizer.iterations.numpy()),\n"
            "      any(name.startswith('hetgrad') for name in sys.modules))\n")
    for fmt in formats:
        out = subprocess.run([sys.executable, "-c", code, str(files / f"model.{fmt}")],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split() == ["SGD", "1", "False"], (fmt, out.stdout)


def test_custom_train_step_is_weighted_and_exchanged(parity):
    assert parity["custom_step"] < 1e-6


def test_fp16_compression_is_close_and_no_aggregation_is_not(parity):
    assert parity["local"] > 1e-2
    assert parity["fp16"] < 1e-3 < parity["local"]


def test_loss_scale_optimizer_is_exact(parity):
    assert parity["loss_scale"] < 1e-5


def test_embedding_gradients_with_and_without_sparse_as_dense(parity):
    assert parity["embedding_sparse_as_dense_False"] < 1e-6
    assert parity["embedding_sparse_as_dense_True"] < 1e-6


def test_something_else_than_an_optimizer_is_refused(parity):
    assert "needs a Keras optimizer of TF" in parity["not_an_optimizer"]
    assert "tensorflow.python.module.module.Module" in parity["not_an_optimizer"]


def test_backward_passes_per_step_accumulates_exactly(parity):
    assert parity["accumulate_first_step_moved"] == 0.0
    assert parity["accumulate"] < 1e-6 and parity["accumulate_iterations"] == 2


def test_horovod_names_are_reexported(parity):
    assert all(parity["reexports"])
