"""`hetgrad train` under every launcher the README names: mpirun, horovodrun (MPI) and
horovodrun --gloo (where mpi4py sees one process per rank and hetgrad's control messages must
travel on Horovod's world). Each gives the same world, probe and final weights as mpirun."""
import time

import numpy as np
import pytest

from hetgrad.comm import check_same_world
from hetgrad.errors import HetgradError

from conftest import LAUNCHERS, MPI_DIR, hetgrad_mpi, read_json, run_mpi

ARMS = {"dense": [], "sparse": ["--sparsify", "sticky", "--density", "0.05"]}


def _train(tmp_path, launcher: str, arm: str):
    """Two ranks, fixed plan (speeds 1,3), rebalancer measuring every epoch (its threshold too
    high to re-plan, so the weights stay comparable), a checkpoint every epoch."""
    tag = f"{launcher}-{arm}"
    out, ckpt = tmp_path / f"{tag}.json", tmp_path / f"{tag}-ckpt"
    proc = hetgrad_mpi(2, ["train", "--speeds", "1,3", "--epochs", "3", "--rebalance",
                           "--rebalance-threshold", "1000", "--checkpoint-dir", str(ckpt),
                           *ARMS[arm], "--out", str(out)], timeout=300, launcher=launcher)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc, read_json(out), np.load(ckpt / "final_weights.npz")


@pytest.mark.parametrize("arm", sorted(ARMS))
def test_every_launcher_trains_the_same(tmp_path, arm):
    runs = {launcher: _train(tmp_path, launcher, arm) for launcher in LAUNCHERS}
    _, _, reference = runs["mpirun"]
    for launcher, (proc, rec, weights) in runs.items():
        assert rec["world_size"] == 2, launcher
        assert [p["rank"] for p in rec["probe"]] == [0, 1], (launcher, rec["probe"])
        assert rec["plan"]["batches"] == [24, 72], launcher
        assert len(rec["balance"]) == 3 and len(rec["per_rank_epoch_times_s"]) == 2, launcher
        assert rec["controller"] == ("gloo" if launcher.endswith("gloo") else "mpi"), launcher
        assert proc.stdout.count("epoch   3/3") == 1, (launcher, proc.stdout)  # rank 0 only
        for name in reference.files:
            np.testing.assert_allclose(weights[name], reference[name], rtol=0, atol=1e-6,
                                       err_msg=f"{launcher} {arm} {name}")


@pytest.mark.parametrize("fault,needle", [
    ("raise", "hetgrad: error on rank 1/3: injected failure in the probe"),
    ("sleep", "hetgrad: error on rank 0/3: --probe-timeout: rank(s) [1] did not report within 5s"),
])
def test_fault_under_gloo_names_the_rank(fault, needle):
    t0 = time.monotonic()
    proc = run_mpi(3, [str(MPI_DIR / "faults.py"), fault], timeout=100,
                   launcher="horovodrun-gloo")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert needle in out, out[-3000:]
    assert time.monotonic() - t0 < 60


def test_worlds_that_disagree_are_refused_naming_both_sizes():
    check_same_world(3, 3)
    with pytest.raises(HetgradError, match=r"MPI's world has 1 rank\(s\) but Horovod's has 2"):
        check_same_world(1, 2)


class _Stuck:
    """A world whose allgather answers after ``delay`` seconds."""

    def __init__(self, delay):
        self.delay = delay

    def allgather(self, obj):
        time.sleep(self.delay)
        return [obj, obj]


def test_timed_allgather_without_a_rendezvous_store_gives_up():
    from hetgrad.comm import _allgather_within
    from hetgrad.errors import PeerTimeoutError
    assert _allgather_within(_Stuck(0.0), 7, timeout=5, field="probe_timeout") == [7, 7]
    with pytest.raises(PeerTimeoutError, match="probe_timeout: some rank did not report"):
        _allgather_within(_Stuck(3.0), 7, timeout=0.2, field="probe_timeout")
