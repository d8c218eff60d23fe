"""At least ten bad inputs to `hetgrad train`: each a one-line error naming the flag, exit 2."""
import os
import subprocess
import sys

import numpy as np
import pytest


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    (d / "garbage.npz").write_bytes(b"\x00not a zip")
    (d / "garbage.json").write_text("[1, 2")
    x = np.zeros((8, 4, 4), np.float32)
    x[3, 1, 1] = np.nan
    np.savez(d / "nan.npz", x_train=x, y_train=np.arange(8) % 2, x_test=x[:2], y_test=[0, 1])
    (d / "usermodels.py").write_text(
        "from hetgrad.compat import keras\n"
        "def one_output(input_shape, num_classes):\n"
        "    return keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(),\n"
        "                             keras.layers.Dense(1)])\n")
    return d


CASES = [
    (["--epochs", "0"], "--epochs: must be >= 1"),
    (["--lr", "-1"], "--lr: must be a positive number"),
    (["--out", "/nonexistent/dir/run.json"], "--out: directory /nonexistent/dir does not exist"),
    (["--data", "/nonexistent.npz"], "--data: no such dataset or file"),
    (["--data", "{d}/garbage.npz"], "--data: cannot read"),
    (["--model", "transformer"], "--model: unknown model 'transformer'"),
    (["--model", "no_such_module:build"], "--model: cannot import 'no_such_module'"),
    (["--model", "examples.cnn_npz:nothing"], "--model: examples.cnn_npz has no function 'nothing'"),
    (["--model", "examples.cnn_npz:load"], "--model: examples.cnn_npz:load cannot be called as"),
    (["--model", "numpy:add"], "--model: numpy:add returned a ndarray, not a model"),
    (["--model", "usermodels:one_output"], "--model: usermodels:one_output has 1 outputs, the "
     "data has 10 classes"),
    (["--loss", "nonsense"], "--loss: unknown Keras loss 'nonsense'"),
    (["--device", "tpu"], "--device: unknown device 'tpu'"),
    (["--emulate-speeds", "1,2"], "--emulate-speeds: 2 speeds given for 1 ranks"),
    (["--emulate-speeds", "1,x"], "--emulate-speeds: cannot parse"),
    (["--emulate-speeds", "0"], "--emulate-speeds: speed of rank 0 is 0.0"),
    (["--speeds", "1,2"], "--speeds: 2 speeds for 1 ranks"),
    (["--global-batch", "5000"], "--global-batch: dataset has 1437 samples"),
    (["--max-batch", "10"], "--max-batch: per-rank caps sum to 10 < global batch 96"),
    (["--plan", "{d}/garbage.json"], "--plan: cannot read plan file"),
    (["--mode", "equal", "--sparsify", "topk"], "--sparsify: sparsification runs with mode 'weighted' only"),
    (["--sparsify", "topk", "--density", "2"], "--density: must be in (0, 1]"),
    (["--resume", "{d}"], "--resume: no checkpoint in"),
    (["--data", "{d}/nan.npz"], "nan.npz: x_train holds 1 NaN/Inf values"),
    (["--mode", "equal", "--rebalance"], "--rebalance: rebalancing needs mode 'weighted'"),
    (["--rebalance", "--rebalance-threshold", "-1"], "--rebalance-threshold: must be a number >= 0"),
    (["--checkpoint-every", "0"], "--checkpoint-every: must be >= 1"),
]


@pytest.mark.parametrize("args,needle", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_train_input(files, args, needle):
    args = [a.format(d=files) for a in args]
    p = subprocess.run([sys.executable, "-m", "hetgrad.cli", "train", "--epochs", "1", "--quiet",
                        "--probe-steps", "1", "--out", str(files / "run.json"), *args],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(files)))
    assert p.returncode == 2, p.stderr[-2000:]
    errors = [line for line in p.stderr.splitlines() if line.startswith("hetgrad: error")]
    assert len(errors) == 1 and needle in errors[0], p.stderr[-2000:]
    assert "Traceback" not in p.stderr
