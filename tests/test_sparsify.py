"""Sparsification: error feedback, selection, and exchanges on 3 real ranks."""
import numpy as np
import pytest

from conftest import MPI_DIR, read_json, run_mpi
from hetgrad.errors import HetgradError
from hetgrad.sparsify import Residuals, Segments, SelectionState, select_recent, select_sticky


def test_error_feedback_conserves_mass_exactly():
    rng = np.random.default_rng(0)
    mem = Residuals(1000)
    seg = Segments.of([600, 400], 0.05)
    for _ in range(5):
        g = rng.normal(size=1000).astype(np.float32)
        old = mem.residual.copy()
        acc = mem.compensate(g)
        idx = seg.select(np.abs(acc))
        sent = np.zeros_like(acc)
        sent[idx] = acc[idx]
        mem.update(acc, idx)
        np.testing.assert_array_equal(sent + mem.residual, old + g)
        assert np.all(mem.residual[idx] == 0)


def test_momentum_correction_clears_velocity_where_sent():
    mem = Residuals(4, momentum=0.9)
    acc = mem.compensate(np.array([1, 2, 3, 4], np.float32))
    mem.update(acc, np.array([3]))
    np.testing.assert_allclose(mem.compensate(np.ones(4, np.float32)),
                               [1 + 1.9, 2 + 2.8, 3 + 3.7, 1.0], rtol=1e-6)


def test_per_tensor_k_and_selection():
    seg = Segments.of([1000, 10], 0.01)
    assert seg.ks == [10, 1]
    scores = np.arange(1010, dtype=np.float32)
    assert sorted(seg.select(scores)) == list(range(990, 1000)) + [1009]


def test_recent_and_sticky_prefer_previous_union():
    seg = Segments.of([100], 0.05)
    st = SelectionState(100)
    acc = np.linspace(0, 1, 100).astype(np.float32)  # top-5 would be 95..99
    st.record(np.arange(5))
    st.record(np.arange(5))
    # sticky keeps floor(0.9 * 5) = 4 of the old union, 1 fresh
    assert sorted(select_sticky(acc, seg, st)) == [1, 2, 3, 4, 99]
    # recent boosts old entries x2: 0..4 (<0.05) still lose to 95..99
    assert sorted(select_recent(acc, seg, st)) == [95, 96, 97, 98, 99]
    acc[:5] = 0.9
    assert set(select_recent(acc, seg, st)) == {0, 1, 2, 3, 4}


def test_bad_sparse_arguments():
    from mpi4py import MPI
    from hetgrad.sparsify import SparseExchanger
    with pytest.raises(HetgradError, match="density"):
        SparseExchanger(MPI.COMM_SELF, [10], density=0.0)
    with pytest.raises(HetgradError, match="sparsify"):
        SparseExchanger(MPI.COMM_SELF, [10], policy="random")


@pytest.mark.parametrize("launcher", ["mpirun", "horovodrun-gloo"])
def test_three_rank_exchanges(tmp_path, launcher):
    out = tmp_path / "sparse.json"
    proc = run_mpi(3, [str(MPI_DIR / "sparse_exchange.py"), str(out)], launcher=launcher)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = read_json(out)
    for key, r in res.items():
        assert r["err_mass"] < 1e-5, (key, r)  # nothing lost, nothing invented
        if key.endswith("/union") or key.startswith("leader"):
            assert r["err_union"] < 1e-5, (key, r)  # exact dense weighted sum on U, 0 elsewhere
    k = res["topk/union"]["k"]
    assert res["leader/union"]["unions"] == [k] * 4  # one mask for everyone
    # independent random top-k: union close to 3k (little overlap) at every step
    assert min(res["topk/union"]["unions"]) > 2.5 * k
    # sticky reuses last round's union after the first step
    assert res["sticky/union"]["unions"][-1] < res["topk/union"]["unions"][-1]
