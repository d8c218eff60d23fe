"""NaN gradients on one rank: abort names that rank within a bounded time; ignore goes on."""
import time

import pytest

from conftest import FAST_ABORT, MPI_DIR, run_mpi


@pytest.mark.parametrize("path", ["dense", "sparse"])
def test_nan_on_one_rank_aborts_the_job_naming_it(tmp_path, path):
    t0 = time.monotonic()
    proc = run_mpi(3, [str(MPI_DIR / "nonfinite.py"), str(tmp_path / "r.json"), "abort", path],
                   timeout=150, env_update=FAST_ABORT)
    elapsed = time.monotonic() - t0
    err = proc.stderr
    assert proc.returncode == 2, err[-3000:]
    assert ("hetgrad: error on rank 1/3: --on-nonfinite: NaN or Inf in this rank's gradients "
            "in epoch 2") in err, err[-3000:]
    assert "error on rank 0/3" not in err and "error on rank 2/3" not in err
    assert not (tmp_path / "r.json").exists()
    assert elapsed < 90, elapsed


def test_ignore_trains_on_into_nan(world3, tmp_path):
    rec = world3.run("nonfinite:train", str(tmp_path / "r.json"), "ignore").root
    acc = [e["test_accuracy"] for e in rec["epochs"]]
    # the NaN reached every rank's weights (ReLU then outputs 0: chance-level predictions)
    assert acc[0] > 0.5 and acc[2] < 0.2, acc
