"""Bad inputs to `hetgrad train | probe | plan | report`, as a new user would give them: each
ends with exit 2 and one `hetgrad: error` line naming the flag or file, no traceback, before
any probe -- and before TensorFlow is even imported, except for a user's model module and a
Keras loss name -- and no file created, changed or deleted."""
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, hetgrad_mpi
from hetgrad.partition import make_plan

DIGITS = 1437


def _npz(path: Path, **override) -> None:
    rng = np.random.default_rng(0)
    arrays = dict(x_train=rng.random((40, 4, 4), np.float32), y_train=np.arange(40) % 3,
                  x_test=rng.random((9, 4, 4), np.float32), y_test=np.arange(9) % 3)
    arrays.update(override)
    np.savez(path, **arrays)


def _checkpoint(d: Path, *, ranks: int = 1, batch: int = 96, epoch: int = 1,
                named: int | None = None, **job) -> None:
    """A checkpoint directory's state (enough for the checks, which run before any restore)."""
    d.mkdir()
    (d / f"ckpt-{named or epoch}").mkdir()
    plan = make_plan([1.0] * ranks, batch, DIGITS).to_dict()
    state = {"epoch": epoch, "checkpoint": f"ckpt-{named or epoch}", "plan": plan,
             "probe": [{"rank": r, "host": "h", "device": "cpu", "samples_per_s": 1.0}
                       for r in range(ranks)],
             "job": {"data": "digits", "model": "mlp", "plan": None, **job}}
    (d / "state.json").write_text(json.dumps(state))


def _records(d: Path) -> None:
    """Converted digits (hetgrad data convert), broken in every way the checks must name."""
    import shutil
    from hetgrad.comm import LocalComm
    from hetgrad.data.convert import convert
    good = d / "rec-ok"
    convert(str(ROOT / "hetgrad/datasets/digits.npz"), str(good), LocalComm(), shard_size=500,
            say=lambda *a, **k: None)
    for name in ("rec-missing", "rec-truncated", "rec-count", "rec-shape"):
        shutil.copytree(good, d / name)
    (d / "rec-missing/train/shard-00001/x.npy").unlink()
    x = d / "rec-truncated/train/shard-00002/x.npy"
    x.write_bytes(x.read_bytes()[:-100])
    manifest = json.loads((good / "manifest.json").read_text())
    manifest["splits"]["train"]["count"] = 1500
    (d / "rec-count/manifest.json").write_text(json.dumps(manifest))
    np.save(d / "rec-shape/test/shard-00000/x.npy", np.zeros((360, 8, 9), np.uint8))
    (d / "rec-none").mkdir()


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    (d / "garbage.npz").write_bytes(b"\x00not a zip")
    (d / "garbage.json").write_text("[1, 2")
    (d / "adir.json").mkdir()
    (d / "afile").write_text("not a directory")
    x = np.zeros((8, 4, 4), np.float32)
    x[3, 1, 1] = np.nan
    np.savez(d / "nan.npz", x_train=x, y_train=np.arange(8) % 2, x_test=x[:2], y_test=[0, 1])
    _npz(d / "strings.npz", x_train=np.array(["a"] * 40))
    _npz(d / "neglabel.npz", y_train=np.arange(40) % 3 - 1)
    _npz(d / "nanlabel.npz", y_train=np.where(np.arange(40) == 5, np.nan, np.arange(40) % 3))
    _npz(d / "floatlabel.npz", y_train=(np.arange(40) % 3) + 0.5)
    _npz(d / "onehot.npz", y_train=np.eye(3)[np.arange(40) % 3])
    _npz(d / "testshape.npz", x_test=np.zeros((9, 5, 5), np.float32))
    _npz(d / "emptytest.npz", x_test=np.zeros((0, 4, 4), np.float32), y_test=np.zeros(0, int))
    _npz(d / "flat.npz", x_train=np.arange(40, dtype=np.float32))
    _npz(d / "testlabel.npz", y_test=np.arange(9) % 5)
    _records(d)
    (d / "no_tensorflow").mkdir()
    (d / "no_tensorflow" / "tensorflow.py").write_text(
        "raise ImportError('TensorFlow was imported before the input was refused')\n")
    (d / "usermodels.py").write_text(
        "from hetgrad.compat import keras\n"
        "def one_output(input_shape, num_classes):\n"
        "    return keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(),\n"
        "                             keras.layers.Dense(1)])\n")
    plan = make_plan([1.0], 96, DIGITS).to_dict()
    (d / "plan-types.json").write_text(json.dumps({**plan, "batches": "96"}))
    (d / "plan-sum.json").write_text(json.dumps({**plan, "global_batch": 97}))
    (d / "probe2.json").write_text(json.dumps(
        [{"rank": r, "host": "h", "device": "cpu", "samples_per_s": 1.0} for r in range(2)]))
    (d / "probe-emulated.json").write_text(json.dumps([{"rank": 0, "host": "h", "device": "cpu",
                                                        "samples_per_s": 9.0,
                                                        "emulation": "4@0.001"}]))
    (d / "probe-types.json").write_text(json.dumps([{"rank": 0, "host": "h", "device": "cpu",
                                                     "samples_per_s": "fast"}]))
    _checkpoint(d / "ckpt-ok")
    _checkpoint(d / "ckpt-B64", batch=64)
    _checkpoint(d / "ckpt-epoch", epoch=2, named=1)
    _checkpoint(d / "ckpt-cnn", model="cnn")
    (d / "ckpt-garbage").mkdir()
    (d / "ckpt-garbage" / "state.json").write_text("{\"epoch\": \"one\"}")
    rec = {"config": {"model": "mlp", "data": "digits", "mode": "weighted"},
           "plan": {"speeds": [1], "shard_sizes": [10], "batches": [1]},
           "probe": [{"samples_per_s": 10.0}], "epochs": [{"test_accuracy": 0.5, "time_s": 1}],
           "median_epoch_time_s": 1.0, "samples_per_s": 10.0, "throughput_efficiency": 1.0,
           "final_test_accuracy": 0.5, "best_test_accuracy": 0.5}
    (d / "rec1.json").write_text(json.dumps(rec))
    (d / "rec2.json").write_text(json.dumps({**rec, "epochs": rec["epochs"] * 2}))
    (d / "noplan.json").write_text(json.dumps({k: v for k, v in rec.items() if k != "plan"}))
    return d


TRAIN = [
    # flags: ranges and kinds
    (["--epochs", "0"], "--epochs: must be >= 1"),
    (["--lr", "-1"], "--lr: must be a positive number"),
    (["--model", "transformer"], "--model: unknown model 'transformer'"),
    (["--model", "no_such_module:build"], "--model: cannot import 'no_such_module'"),
    (["--model", "examples.cnn_npz:nothing"], "--model: examples.cnn_npz has no function 'nothing'"),
    (["--model", "examples.cnn_npz:load"], "--model: examples.cnn_npz:load cannot be called as"),
    (["--model", "numpy:add"], "--model: numpy:add returned a ndarray, not a model"),
    (["--model", "usermodels:one_output"], "--model: usermodels:one_output has 1 outputs; the "
     "data needs 10"),
    (["--model", "usermodels:one_output", "--loss", "categorical_crossentropy"],
     "--model: usermodels:one_output has 1 outputs; the data needs 10"),
    (["--loss", "nonsense"], "--loss: unknown Keras loss 'nonsense'"),
    (["--loss", "hinge"], "--loss: hinge wants 0/1 labels and one output per sample"),
    (["--device", "tpu"], "--device: unknown device 'tpu'"),
    (["--emulate-speeds", "1,2"], "--emulate-speeds: 2 speeds given for 1 ranks"),
    (["--emulate-speeds", "1,x"], "--emulate-speeds: cannot parse"),
    (["--emulate-speeds", "0"], "--emulate-speeds: speed of rank 0 is 0.0"),
    (["--speeds", "1,2"], "--speeds: 2 speeds for 1 ranks"),
    (["--probe-steps", "0"], "--probe-steps: must be >= 1"),
    (["--probe-batch", "-5"], "--probe-batch: must be >= 1"),
    (["--probe-batch", "0"], "--probe-batch: must be >= 1"),
    (["--checkpoint-every", "0"], "--checkpoint-every: must be >= 1"),
    (["--sparsify", "topk", "--density", "2"], "--density: must be in (0, 1]"),
    (["--sparsify", "sticky", "--fresh", "0"], "--fresh: must be in (0, 1]"),
    (["--sparsify", "topk", "--density-warmup", "2", "--dense-above", "0"],
     "--dense-above: must be in (0, 1]"),
    (["--rebalance", "--rebalance-threshold", "-1"], "--rebalance-threshold: must be a number >= 0"),
    # sizes the partitioner refuses, found before the probe
    (["--global-batch", "5000"], "--global-batch: dataset has 1437 samples"),
    (["--max-batch", "10"], "--max-batch: per-rank caps sum to 10 < global batch 96"),
    # combinations, and flags that would do nothing
    (["--mode", "equal", "--sparsify", "topk"], "--sparsify: sparsification runs with mode 'weighted' only"),
    (["--mode", "equal", "--rebalance"], "--rebalance: rebalancing needs mode 'weighted'"),
    (["--density", "0.05"], "--density: does nothing without --sparsify"),
    (["--exchange", "allgather"], "--exchange: does nothing without --sparsify"),
    (["--momentum-correction"], "--momentum-correction: does nothing without --sparsify"),
    (["--sparsify", "topk", "--fresh", "0.3"], "--fresh: does nothing without --sparsify sticky"),
    (["--sparsify", "topk", "--momentum-unmasked"],
     "--momentum-unmasked: does nothing without --momentum-correction"),
    (["--sparsify", "topk", "--dense-above", "0.2"],
     "--dense-above: does nothing without --sparsify and --density-warmup"),
    (["--mode", "equal", "--weighting", "samples"], "--weighting: does nothing without --mode weighted"),
    (["--rebalance-threshold", "0.1"], "--rebalance-threshold: does nothing without --rebalance"),
    (["--checkpoint-every", "2"], "--checkpoint-every: does nothing without --checkpoint-dir"),
    (["--emulate-unit", "0.01"], "--emulate-unit: does nothing without --emulate-speeds"),
    (["--overwrite"], "--overwrite: does nothing without --checkpoint-dir"),
    (["--probe-file", "{d}/probe2.json", "--probe-steps", "3"], "--probe-steps: does nothing without a probe (not --probe-file)"),
    (["--mode", "equal", "--speeds", "2"], "--speeds: does nothing without the partitioner"),
    (["--speeds", "1", "--probe-refine", "2"], "--probe-refine: does nothing without a probe that plans"),
    (["--plan", "{d}/plan-sum.json", "--max-batch", "50"], "--max-batch: does nothing without the partitioner"),
    # outputs that cannot be written: found first, nothing is left behind
    (["--out", "/nonexistent/dir/run.json"], "--out: directory /nonexistent/dir does not exist"),
    (["--out", "/proc/run.json"], "--out: cannot write in /proc"),
    (["--out", "{d}/adir.json"], "--out: {d}/adir.json is a directory"),
    (["--checkpoint-dir", "{d}/afile"], "--checkpoint-dir: {d}/afile is a file"),
    (["--tensorboard", "{d}/afile"], "--tensorboard: {d}/afile is a file; give a directory"),
    (["--tensorboard", "/proc/tb"], "--tensorboard: cannot make directory /proc/tb"),
    (["--timeline", "{d}/adir.json"], "--timeline: {d}/adir.json is a directory"),
    (["--timeline-window", "3"], "--timeline-window: does nothing without --timeline"),
    (["--gns", "--mode", "equal"], "--gns: does nothing without --mode weighted"),
    (["--gns", "--sparsify", "topk"], "--gns: with --sparsify the noise scale is measured in "
     "the dense warm-up steps only: give --density-warmup"),
    (["--gns", "--sparsify", "topk", "--density-warmup", "2", "--momentum-correction"],
     "--gns: with --sparsify the noise scale is measured in the dense warm-up steps only"),
    (["--adaptive-batch", "--sparsify", "topk"], "--adaptive-batch: does nothing without "
     "--mode weighted (and without --sparsify)"),
    (["--batch-range", "32,512"], "--batch-range: does nothing without --adaptive-batch"),
    (["--lr-rule", "sqrt-batch"], "--lr-rule: does nothing without --adaptive-batch"),
    (["--adaptive-batch", "--lr-rule", "linear"], "--lr-rule: unknown lr rule 'linear'; choose"),
    (["--gns-every", "2"], "--gns-every: does nothing without --gns or --adaptive-batch"),
    (["--gns", "--gns-every", "0"], "--gns-every: must be >= 1, got 0"),
    (["--adaptive-batch", "-B", "96", "--batch-range", "128,512"],
     "--batch-range: the global batch 96 is outside 128,512"),
    (["--adaptive-batch", "--batch-range", "512"], "--batch-range: give the range as two"),
    (["--checkpoint-dir", "{d}/ckpt-ok"], "--checkpoint-dir: {d}/ckpt-ok holds checkpoints of an "
     "earlier run; continue it with --resume"),
    # data files
    (["--data", "/nonexistent.npz"], "--data: no such dataset or file"),
    (["--data", "{d}/garbage.npz"], "--data: cannot read"),
    (["--data", "{d}/nan.npz"], "nan.npz: x_train holds 1 NaN/Inf values"),
    (["--data", "{d}/strings.npz"], "strings.npz: x_train has dtype <U1; numeric arrays needed"),
    (["--data", "{d}/neglabel.npz"], "neglabel.npz: y_train holds negative label -1"),
    (["--data", "{d}/nanlabel.npz"], "nanlabel.npz: y_train holds 1 NaN/Inf values"),
    (["--data", "{d}/floatlabel.npz"], "floatlabel.npz: y_train holds non-integer labels"),
    (["--data", "{d}/onehot.npz"], "onehot.npz: y_train has shape (40, 3); need one integer label"),
    (["--data", "{d}/testshape.npz"], "testshape.npz: x_test samples have shape (5, 5), x_train's (4, 4)"),
    (["--data", "{d}/emptytest.npz"], "emptytest.npz: x_test is empty"),
    (["--data", "{d}/flat.npz"], "flat.npz: x_train has shape (40,); need (samples, features...)"),
    (["--data", "{d}/testlabel.npz"], "testlabel.npz: y_test has label 4, but y_train only labels 0..2"),
    # dataset directories of record files (hetgrad data convert)
    (["--data", "{d}/rec-missing"], "--data: {d}/rec-missing/train/shard-00001/x.npy is missing"),
    (["--data", "{d}/rec-truncated"], "--data: cannot read {d}/rec-truncated/train/shard-00002/x.npy"),
    (["--data", "{d}/rec-count"], "--data: {d}/rec-count/manifest.json: the train shards hold 1437 "
     "samples, the manifest says 1500"),
    (["--data", "{d}/rec-shape"], "--data: {d}/rec-shape/test/shard-00000/x.npy holds uint8 (360, 8, 9), "
     "the manifest says |u1 (360, 8, 8)"),
    (["--data", "{d}/rec-none"], "--data: {d}/rec-none holds no manifest.json: not a dataset directory"),
    (["--data", "{d}/rec-ok", "-B", "2000"], "--global-batch: dataset has 1437 samples, fewer than"),
    # plan and probe files
    (["--plan", "{d}/garbage.json"], "--plan: cannot read plan file"),
    (["--plan", "{d}/plan-types.json"], "--plan: cannot read plan file {d}/plan-types.json: field "
     "'batches' is '96', expected list[int]"),
    (["--plan", "{d}/plan-sum.json"], "--plan: plan file {d}/plan-sum.json: plan batches sum to 96, not 97"),
    (["--probe-file", "{d}/garbage.json"], "--probe-file: cannot read probe file"),
    (["--probe-file", "{d}/probe2.json"], "--probe-file: probe file {d}/probe2.json has 2 ranks, job has 1"),
    (["--probe-file", "{d}/probe-types.json"], "--probe-file: cannot read probe file"),
    (["--probe-file", "{d}/probe-emulated.json"], "--probe-file: {d}/probe-emulated.json was "
     "timed under emulated speeds '4@0.001', this job runs under none"),
    # checkpoints: checked against this job, not trusted
    (["--resume", "{d}"], "--resume: no checkpoint in"),
    (["--resume", "{d}/ckpt-garbage"], "--resume: {d}/ckpt-garbage/state.json is not a hetgrad "
     "checkpoint state"),
    (["--resume", "{d}/ckpt-B64"], "--global-batch: the checkpoint trained with global batch 64; "
     "resume with global batch 64"),
    (["--resume", "{d}/ckpt-epoch"], "--resume: {d}/ckpt-epoch/state.json says epoch 2 in ckpt-1"),
    (["--resume", "{d}/ckpt-cnn"], "--model: the checkpoint's job had 'cnn', this job asks "
     "for 'mlp'; resume with the same setting"),
    (["--resume", "{d}/ckpt-ok", "--epochs", "1"],
     "--epochs: the checkpoint in {d}/ckpt-ok is at epoch 1; ask for more"),
    (["--resume", "{d}/ckpt-ok", "--plan", "{d}/plan-sum.json"], "--plan: the checkpoint's job "
     "had none, this job asks for"),
]

OTHER = [
    (["probe", "--probe-steps", "0"], "--probe-steps: must be >= 1"),
    (["probe", "--out", "/proc/probe.json"], "--out: cannot write in /proc"),
    (["probe", "--emulate-unit", "0.01"], "--emulate-unit: does nothing without --emulate-speeds"),
    (["plan", "--speeds", "1,2", "-B", "64", "--dataset-size", "1000", "--out",
      "/proc/plan.json"], "--out: cannot write in /proc"),
    (["report", "{d}/rec1.json", "{d}/rec2.json", "--out-dir", "{d}/report"],
     "RUN.json: records of mlp/digits 1 weighted trained different numbers of epochs"),
    (["report", "{d}/noplan.json", "--out-dir", "{d}/report"],
     "RUN.json: {d}/noplan.json is not a `hetgrad train` record (lacks ['plan'])"),
    (["report", "{d}/rec1.json", "--out-dir", "{d}/afile"], "--out-dir: {d}/afile is a file"),
]


def snapshot(root: Path) -> dict:
    """Every file and directory under ``root`` with a hash of its content."""
    return {str(p.relative_to(root)): p.is_dir() or hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))}


def check_refused(p: subprocess.CompletedProcess, needle: str, elapsed: float,
                  aborted: bool = False) -> None:
    """Exit 2 with one error line holding ``needle``; no MPI_Abort unless ``aborted`` (whose
    box Open MPI may print, garble or lose: not asserted)."""
    err = p.stderr
    assert p.returncode == 2, err[-2000:]
    errors = [line for line in err.splitlines() if line.startswith("hetgrad: error")]
    assert len(errors) == 1 and needle in errors[0], err[-2000:]
    assert "Traceback" not in err and (aborted or not aborts(err)), err[-2000:]
    assert "hetgrad: probe" not in p.stdout + err   # refused before any probe
    assert elapsed < 40, elapsed


def aborts(err: str) -> int:
    """MPI_Abort calls in an Open MPI job's stderr: its box, or (a race in Open MPI's abort
    path, on a busy machine) an ORTE_ERROR_LOG line from show_help.c in its place."""
    return err.count("MPI_ABORT was invoked") + len(
        re.findall(r"ORTE_ERROR_LOG: .*show_help\.c", err))


def needs_tensorflow(args: list[str]) -> bool:
    """Only a user's model module (``--model module:function``) and ``--loss`` (a Keras name)
    are checked with TensorFlow loaded; every other input is refused before it."""
    return "--loss" in args or any(":" in a for a in args[args.index("--model") + 1:][:1]) \
        if "--model" in args else "--loss" in args


def _run(d: Path, args: list[str], tf: bool = True) -> tuple[subprocess.CompletedProcess, float]:
    """``hetgrad ARGS`` in ``d``; without ``tf``, importing TensorFlow fails (a stand-in
    package first on the path raises), so a check that loads it shows as a traceback."""
    path = f"{d}:{ROOT}" if tf else f"{d / 'no_tensorflow'}:{d}:{ROOT}"
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "hetgrad.cli", *args], capture_output=True,
                       text=True, timeout=120, cwd=d, env=dict(os.environ, PYTHONPATH=path))
    return p, time.monotonic() - t0


def _train_args(d: Path, args: list[str]) -> list[str]:
    out = [] if "--out" in args else ["--out", str(d / "run.json")]
    return ["train", "--epochs", "3", *out, *args]


CASES = [("train", a, n) for a, n in TRAIN] + [("other", a, n) for a, n in OTHER]


@pytest.fixture(scope="module")
def outcomes(d):
    """Every case run once, three at a time (each is a fresh Python importing TensorFlow,
    ~4 s), with a snapshot of the case directory before and after all of them."""
    def command(kind, args):
        args = [a.format(d=d) for a in args]
        return _train_args(d, args) if kind == "train" else args

    before = snapshot(d)
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda c: _run(d, command(c[0], c[1]), needs_tensorflow(c[1])),
                                CASES))
    return {(kind, tuple(args)): r for (kind, args, _), r in zip(CASES, results)}, \
        before, snapshot(d)


@pytest.mark.parametrize("kind,args,needle", CASES, ids=[" ".join(a) for _, a, _ in CASES])
def test_bad_input_is_refused_in_one_line(d, outcomes, kind, args, needle):
    results, before, after = outcomes
    p, elapsed = results[(kind, tuple(args))]
    check_refused(p, needle.format(d=d), elapsed)
    assert after == before   # no case created, changed or deleted a file


def test_same_error_on_every_rank_is_printed_once_and_ends_the_job_at_once(d, tmp_path):
    """Under mpirun rank 0 ends the job with MPI_Abort: not through ranks exiting non-zero,
    which mpirun ends 2 s later, saying "Primary job terminated normally, but ..."."""
    t0 = time.monotonic()
    p = hetgrad_mpi(3, ["train", "--global-batch", "5000", "--out", str(tmp_path / "r.json")],
                    timeout=120)
    check_refused(p, "hetgrad: error: --global-batch: dataset has 1437 samples",
                  time.monotonic() - t0, aborted=True)
    assert "Primary job" not in p.stderr, p.stderr
    assert list(tmp_path.iterdir()) == []


def test_overwrite_lets_a_new_run_replace_old_checkpoints(d, tmp_path):
    """The refusal above has a way out: --overwrite (here checked to pass validation and
    train, replacing the old state)."""
    ckpt = tmp_path / "ckpt"
    _checkpoint(ckpt, epoch=5)
    p, _ = _run(d, ["train", "--epochs", "1", "--quiet", "--probe-steps", "1", "--checkpoint-dir",
                    str(ckpt), "--overwrite", "--out", str(tmp_path / "r.json")])
    assert p.returncode == 0, p.stderr[-2000:]
    state = json.loads((ckpt / "state.json").read_text())
    assert state["epoch"] == 1 and sorted(x.name for x in ckpt.iterdir()) == [
        "ckpt-1", "final_weights.npz", "state.json"]
