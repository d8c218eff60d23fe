"""`hetgrad train` under every launcher the README names: mpirun, horovodrun (MPI) and
horovodrun --gloo (where mpi4py sees one process per rank and hetgrad's control messages must
travel on Horovod's world). Each gives the same world, probe and final weights as mpirun.
(The horovodrun launches are conftest's ``under_horovodrun``, shared with other modules.)"""
import time

import numpy as np
import pytest

from hetgrad.runtime import check_same_world
from hetgrad.errors import HetgradError

from conftest import LAUNCHERS, MPI_DIR, TRAIN_ARMS, read_json, run_mpi, train_arm

@pytest.fixture(scope="module")
def launched(world2, under_horovodrun, tmp_path_factory):
    """Every arm under every launcher: mpirun's in a test world (mpirun started it), the
    horovodrun ones from their launch. ``{(launcher, arm): (printed, record, weights)}``"""
    tmp = tmp_path_factory.mktemp("launchers")
    printed = {("mpirun", arm): "".join(world2.run("training:train",
                                                   **train_arm(tmp, "mpirun", arm)).stdout)
               for arm in TRAIN_ARMS}
    printed.update({(launcher, arm): under_horovodrun[launcher]["stdout"]
                    for launcher in LAUNCHERS[1:] for arm in TRAIN_ARMS})
    where = {"mpirun": tmp, **{launcher: under_horovodrun[launcher]["dir"]
                               for launcher in LAUNCHERS[1:]}}
    return {(launcher, arm): (out, read_json(where[launcher] / f"{launcher}-{arm}.json"),
                              np.load(where[launcher] / f"{launcher}-{arm}-ckpt" /
                                      "final_weights.npz"))
            for (launcher, arm), out in printed.items()}


@pytest.mark.parametrize("arm", sorted(TRAIN_ARMS))
def test_every_launcher_trains_the_same(launched, arm):
    _, _, reference = launched["mpirun", arm]
    for launcher in LAUNCHERS:
        printed, rec, weights = launched[launcher, arm]
        assert rec["world_size"] == 2, launcher
        assert [p["rank"] for p in rec["probe"]] == [0, 1], (launcher, rec["probe"])
        assert rec["plan"]["batches"] == [24, 72], launcher
        assert len(rec["balance"]) == 3 and len(rec["per_rank_epoch_times_s"]) == 2, launcher
        assert rec["controller"] == ("gloo" if launcher.endswith("gloo") else "mpi"), launcher
        runs = 1 if launcher == "mpirun" else len(TRAIN_ARMS)  # one launch prints every arm
        assert printed.count("epoch   3/3") == runs, (launcher, printed)  # rank 0 only
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
    from hetgrad.comm_gloo import _allgather_within
    from hetgrad.errors import PeerTimeoutError
    assert _allgather_within(_Stuck(0.0), 7, timeout=5, field="probe_timeout") == [7, 7]
    with pytest.raises(PeerTimeoutError, match="probe_timeout: some rank did not report"):
        _allgather_within(_Stuck(3.0), 7, timeout=0.2, field="probe_timeout")
