"""Sparsification: settings, and the in-graph exchange on 3 real ranks against the numpy
oracle (tests/mpi/sparse_oracle.py), the dense weighted sum, and its own bounds."""
import pytest

from hetgrad.errors import ConfigError
from hetgrad.sparse import Sparsify


def test_k_per_tensor_and_fresh_share():
    s = Sparsify(density=0.01)
    assert [s.k_of(n) for n in (8192, 16384, 1280, 50, 100)] == [82, 164, 13, 1, 1]
    assert s.k_of(1000, density=1.0) == 1000
    assert [s.fresh_of(k) for k in (82, 13, 1)] == [8, 1, 1]


def test_density_warmup_is_geometric_then_the_target():
    s = Sparsify(density=0.01, warmup_epochs=3)
    assert [round(s.density_at(e), 4) for e in range(5)] == [0.3162, 0.1, 0.0316, 0.01, 0.01]
    assert Sparsify(density=0.05).density_at(0) == 0.05


def test_dense_warmup_only_above_the_target_and_the_threshold():
    s = Sparsify(density=0.01, warmup_epochs=2)           # 21.5 %, 4.6 %, then 1 %
    assert [s.dense_at(s.density_at(e)) for e in range(3)] == [True, False, False]
    assert not Sparsify(density=0.1, warmup_epochs=2).dense_at(0.1)   # the target never
    assert not Sparsify(density=0.01, dense_above=1.0).dense_at(0.5)  # 1 turns it off


@pytest.mark.parametrize("fields, field, setting", [
    (dict(density=0.0), "density", "density"), (dict(policy="random"), "policy", "sparsify"),
    (dict(exchange="tree"), "exchange", "exchange"),
    (dict(policy="leader", exchange="allgather"), "exchange", "exchange"),
    (dict(momentum=1.0), "momentum", None), (dict(clip_norm=-1.0), "clip_norm", "local_clip"),
    (dict(warmup_epochs=-1), "warmup_epochs", "density_warmup"),
    (dict(fresh=1.5), "fresh", "fresh"),
    (dict(dense_above=0.0), "dense_above", "dense_above")])
def test_bad_settings_name_their_field(fields, field, setting):
    """By the name the user typed: Sparsify's own field, or hetgrad train's setting."""
    with pytest.raises(ConfigError) as info:
        Sparsify(**fields)
    assert info.value.field == field
    if setting is None:   # (hetgrad train's momentum is a flag: 0.9 or nothing)
        return
    from hetgrad.config import SPARSIFY_SETTING, TrainConfig
    cli = {SPARSIFY_SETTING.get(k, k): v for k, v in fields.items()}
    cli["sparsify"] = cli.pop("sparsify", "topk")
    cli = {k: v for k, v in cli.items() if k in TrainConfig.__dataclass_fields__}
    with pytest.raises(ConfigError) as info:
        TrainConfig(**cli).sparse_settings()
    assert info.value.field == setting


def test_train_flags_reach_the_settings():
    from hetgrad.config import TrainConfig
    s = TrainConfig(sparsify="sticky", fresh=0.3, density_warmup=2).sparse_settings()
    assert (s.policy, s.fresh, s.warmup_epochs) == ("sticky", 0.3, 2)
    assert TrainConfig(sparsify="sticky").sparse_settings().fresh == Sparsify().fresh


@pytest.mark.parametrize("launcher", ["mpirun", "horovodrun-gloo"])
def test_sparse_exchanges_on_real_ranks(world3, under_horovodrun, launcher):
    """On 3 ranks in a test world (mpirun), and on 2 under ``horovodrun --gloo`` (hetgrad's
    control messages on Horovod's world, one process per MPI world)."""
    if launcher == "mpirun":
        res, p = world3.run("sparse_exchange:exchanges").root, 3
    else:
        res, p = under_horovodrun[launcher]["exchanges"], 2
    for key, r in res.items():
        # the graph path is the oracle's arithmetic: same aggregate, residuals and unions
        assert r["vs_oracle"] < 1e-6 and r["residual_vs_oracle"] < 1e-6, (key, r)
        assert r["unions"] == r["oracle_unions"], (key, r)
        assert r["small_exact"] < 1e-6, (key, r)  # biases: the dense weighted sum
        if "momentum" in key or "clip" in key:
            continue  # (velocity and clipping change what there is to send)
        assert r["mass"] < 1e-5, (key, r)  # delivered + kept == residuals + gradients
        if "/union" in key or key.startswith("leader"):
            assert r["union_exact"] < 1e-5, (key, r)  # exact dense weighted sum on U
    k = res["topk/union"]["k"]
    assert res["leader/union"]["unions"] == [k] * 5  # one mask for everyone
    assert min(res["topk/union"]["unions"]) > (p - 0.5) * k  # random top-k: little overlap
    for key in ("sticky/union", "sticky/allgather", "sticky/union/momentum"):
        # every rank keeps the same entries: |U| <= k + (P-1) x fresh after the first step
        assert max(res[key]["unions"][1:]) <= k + (p - 1) * res[key]["fresh"], res[key]
    n = 60 * 50 + 500 + 40 * 30
    for key in ("topk/allgather/dense-warmup", "sticky/union/momentum/dense-warmup"):
        # dense warm-up steps send everything; then the policy's own bounds hold again
        assert res[key]["unions"][:2] == [n, n], res[key]["unions"]
        assert max(res[key]["unions"][2:]) < n / 4, res[key]["unions"]
        # a dense step is logged as one ring allreduce of every entry (+ the biases')
        assert res[key]["first_log"]["k"] == n
        assert res[key]["first_log"]["bytes_sent"] == pytest.approx(
            2 * (p - 1) / p * 4 * (n + 7))
    assert max(res["sticky/union/momentum/dense-warmup"]["unions"][2:]) <= k + (p - 1) * res[
        "sticky/union"]["fresh"]
    log = res["topk/union"]["log"]
    assert log["buildup"] == pytest.approx(log["union"] / log["k"])
    assert log["bytes_sent"] > 4 * k and log["bytes_received"] > (p - 1) * 4 * k
    # the biases (7 entries) ride in the allgather as (index, value) pairs: no allreduce
    pairs = res["topk/allgather"]["log"]
    assert pairs["bytes_sent"] == pytest.approx(8 * (pairs["k"] + 7))
    assert pairs["bytes_received"] == pytest.approx((p - 1) * 8 * (pairs["k"] + 7))
