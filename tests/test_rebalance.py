"""Semi-dynamic rebalancing: the decision rule (no MPI) and a real 3-rank run with a mid-run
slowdown, with and without --rebalance."""
import json

import pytest

from hetgrad.errors import HetgradError
from hetgrad.partition import make_plan
from hetgrad.rebalance import Rebalancer, imbalance
from hetgrad.timeline import Sampler
from observed import assert_observed


class Gathered:
    """Stands in for an MPI communicator: allgather returns every rank's (busy, wait)."""

    def __init__(self, rows):
        self.rows = rows

    def allgather(self, _mine):
        return self.rows


PLAN = make_plan([1, 1, 1], 96, 1437)  # [32, 32, 32], 479 samples each, 15 steps


def test_slow_rank_gets_a_batch_proportional_to_its_measured_speed():
    r = Rebalancer(Gathered([(1.0, 3.0), (4.0, 0.0), (1.0, 3.0)]), threshold=0.1)
    assert r.after_epoch(1, PLAN, 0.0, 0.0, traced=True) is PLAN  # a trace's: recorded only
    assert r.history[0].warmup and not r.history[0].replanned
    new = r.after_epoch(2, PLAN, 0.0, 0.0)
    e = r.history[-1]
    assert e.epoch == 3 and e.replanned and abs(e.imbalance - 1.0) < 1e-12  # max 4 / mean 2
    assert e.measured_samples_per_s == [479.0, 119.75, 479.0]
    assert new.global_batch == 96 and new.steps_per_epoch == PLAN.steps_per_epoch
    assert new.batches[1] in (10, 11) and sum(new.batches) == 96  # 96 * 1 / 9 = 10.7
    assert new.shard_sizes[1] < 170 and sum(new.shard_sizes) == 1437
    # old epoch: 4 s (the slow rank); new: max(n_i / s_i) ~ 1.4 s
    assert 2.5 < e.predicted_speedup < 3.0


def test_a_first_epoch_that_traced_nothing_is_measured_and_acted_on():
    r = Rebalancer(Gathered([(1.0, 3.0), (4.0, 0.0), (1.0, 3.0)]), threshold=0.1)
    new = r.after_epoch(0, PLAN, 0.0, 0.0)   # (the probe ran training's step)
    assert not r.history[0].warmup and r.history[0].replanned and new.batches[1] in (10, 11)


def test_balanced_or_measure_only_keeps_the_plan():
    r = Rebalancer(Gathered([(1.0, 0.1), (1.05, 0.05), (0.98, 0.1)]), threshold=0.1)
    r.after_epoch(0, PLAN, 0, 0, traced=True)
    assert r.after_epoch(1, PLAN, 0, 0) is PLAN and not r.history[-1].replanned
    watch = Rebalancer(Gathered([(1.0, 3.0), (4.0, 0.0), (1.0, 3.0)]), threshold=None)
    watch.after_epoch(0, PLAN, 0, 0, traced=True)
    assert watch.after_epoch(1, PLAN, 0, 0) is PLAN
    assert watch.history[-1].imbalance == pytest.approx(1.0)


def test_caps_bound_the_new_plan():
    r = Rebalancer(Gathered([(1.0, 0), (4.0, 0), (1.0, 0)]), threshold=0.1, max_batch=40)
    r.after_epoch(0, PLAN, 0, 0, traced=True)
    new = r.after_epoch(1, PLAN, 0, 0)
    assert max(new.batches) <= 40 and sum(new.batches) == 96 and new.batches[1] == 16


def test_an_epoch_that_traced_the_step_is_only_recorded():
    """hetgrad.actions.Balance asks the aggregation's trace count: an epoch in which it moved
    (the first fit's, or a retrace later -- a new input signature) is warm-up."""
    from types import SimpleNamespace as NS

    from hetgrad.actions import Balance
    r = Rebalancer(Gathered([(1.0, 3.0), (4.0, 0.0), (1.0, 3.0)]), threshold=None)
    job = NS(aggregation=NS(traces=0, timer=NS(read=lambda: (1.0, 0.0))), plan=PLAN,
             progress=NS(stopped_at_step=0, first_step=0), rank=1)
    balance = Balance(r, verbose=False)
    for epoch, traces in enumerate([1, 0, 2, 0]):
        balance.on_epoch_begin(job, epoch)
        job.aggregation.traces += traces
        balance.on_epoch_end(job, epoch, {})
    assert [e.warmup for e in r.history] == [True, False, True, False]


def test_imbalance_and_bad_threshold():
    assert imbalance([2.0, 2.0, 2.0]) == 0.0
    assert imbalance([1.0, 3.0]) == pytest.approx(0.5)
    with pytest.raises(HetgradError, match="rebalance_threshold"):
        Rebalancer(None, threshold=-0.5)


@pytest.fixture(scope="module")
def slowdown_runs(world3, tmp_path_factory):
    """Rank 1 becomes 4x slower from epoch index 2; 4 epochs, static vs --rebalance."""
    d = tmp_path_factory.mktemp("rebalance")
    common = dict(speeds=[1, 1, 1], emulate_speeds="1,1,1;2:1,0.25,1", emulate_unit=1e-3,
                  epochs=4, quiet=True, probe_steps=1)
    runs = {}
    for name, extra in (("static", {}),
                        # a high threshold: equal speeds must not churn even on a busy machine
                        ("rebalance", dict(rebalance=True, rebalance_threshold=0.25,
                                           checkpoint_dir=str(d / "ckpt"),
                                           tensorboard=str(d / "tb"),
                                           timeline=str(d / "timeline.json"),
                                           timeline_steps=20, timeline_window=6))):
        runs[name] = world3.run("training:train", **common, **extra,
                                out=str(d / f"{name}.json")).root
    runs["state"] = json.loads((d / "ckpt" / "state.json").read_text())
    runs["dir"] = d
    return runs


def test_rebalance_moves_work_off_the_slowed_rank(slowdown_runs):
    rec = slowdown_runs["rebalance"]
    bal = rec["balance"]
    assert [e["epoch"] for e in bal] == [1, 2, 3, 4]
    # (hetgrad train always probes: the probe traced the step, its first epoch measures)
    assert not bal[0]["warmup"] and not bal[0]["replanned"] and not bal[1]["replanned"]
    assert bal[2]["replanned"] and bal[2]["imbalance"] > 0.5
    new = bal[2]["new_batches"]
    assert new[1] < 0.5 * 32 and sum(new) == 96
    assert rec["epochs"][3]["batches"] == new == rec["final_plan"]["batches"]
    assert rec["final_plan"]["steps_per_epoch"] == rec["plan"]["steps_per_epoch"]
    assert bal[3]["imbalance"] < bal[2]["imbalance"] / 2
    assert rec["final_test_accuracy"] > 0.85
    # a resume continues with the plan in effect, not the first one
    assert slowdown_runs["state"]["plan"]["batches"] == new


def test_timeline_and_tensorboard_show_the_slowdown_and_the_replan(slowdown_runs):
    d, rec = slowdown_runs["dir"], slowdown_runs["rebalance"]
    seen = assert_observed(d / "tb", d / "timeline.json", ranks=3, epochs=4)
    steps = rec["plan"]["steps_per_epoch"]
    # every step of the first 20, then 6 mid-epoch steps of each epoch (after the first 20)
    kept = [(a["epoch"], a["step"]) for name, _, _, a in seen["trace"]["steps"][0]
            if name == "compute"]
    sampler, wanted = Sampler(first=20, window=6), []
    for e in range(4):
        sampler.begin_epoch(0, steps)
        wanted += [(e + 1, s) for s in range(steps) if sampler.wants(range(s, s + 1))]
    assert sorted(kept) == wanted and len(wanted) > 20
    # rank 1 computes 4x longer in epoch 3 (slowed: sleeps 128 ms a step against the others'
    # 32, not yet re-planned), much less in epoch 4 (its batch cut); the others wait for it
    def median(rank, epoch, name):
        d = sorted(dur for n, _, dur, a in seen["trace"]["steps"][rank]
                   if n == name and a["epoch"] == epoch)
        return d[len(d) // 2]
    assert median(1, 3, "compute") > 1.8 * median(0, 3, "compute")
    assert median(0, 3, "exchange") > 0.4 * median(1, 3, "compute")
    assert median(1, 4, "compute") < 0.6 * median(1, 3, "compute")
    replan = [m for m in seen["trace"]["markers"] if m["name"] == "re-plan"]
    assert len(replan) == 1 and replan[0]["args"]["new_batches"] == rec["balance"][2]["new_batches"]
    assert len([m for m in seen["trace"]["markers"] if m["name"] == "checkpoint"]) == 4
    # TensorBoard: rank 1's batch falls after epoch 3, the run's re-plan flag says when
    tb = seen["scalars"]
    assert [v for _, v in tb["rank1"]["rank/batch"]] == [32, 32, 32, rec["balance"][2]["new_batches"][1]]
    assert [v for _, v in tb[""]["plan/replanned"]] == [0, 0, 1, 0]
    busy = [v for _, v in tb["rank1"]["rank/busy_s"]]
    assert busy == pytest.approx([e["busy_s"][1] for e in rec["balance"]])
    assert [v for _, v in tb[""]["epoch/test_accuracy"]] == pytest.approx(
        [e["test_accuracy"] for e in rec["epochs"]])
    # the record keeps the sampled steps of the epoch that led to the re-plan and of the last
    # epoch, for `hetgrad report`
    assert rec["timeline"]["replanned_after"] == [3]
    assert {s["epoch"] for s in rec["timeline"]["steps"]} == {3, 4}


def test_static_plan_measures_but_keeps_its_batches(slowdown_runs):
    rec = slowdown_runs["static"]
    assert not any(e["replanned"] for e in rec["balance"])
    assert rec["balance"][3]["imbalance"] > 0.5  # still slowed, still equal batches
    assert rec["final_plan"]["batches"] == rec["plan"]["batches"] == [32, 32, 32]
    # busy + wait accounts for the epoch on every rank (the timer misses nothing large);
    # epoch 1 is skipped: ranks start it at different moments (tracing, first broadcast)
    for e, row in list(zip(rec["balance"], rec["epochs"]))[1:]:
        for busy, wait in zip(e["busy_s"], e["wait_s"]):
            assert 0.7 * row["time_s"] < busy + wait < 1.1 * row["time_s"], (e, row)


class Sequence3:
    """Gathered timings that change from epoch to epoch."""

    def __init__(self, epochs):
        self.epochs = iter(epochs)

    def allgather(self, _mine):
        return next(self.epochs)


def test_a_small_gain_must_show_twice_a_big_one_acts_at_once():
    even = [(1.0, 0.1)] * 3
    small = [(1.0, 0.1), (1.1, 0.0), (1.0, 0.1)]   # rank 1 10 % slower
    r = Rebalancer(Sequence3([even, even, small, even, small, small]), threshold=0.03)
    plans = [r.after_epoch(e, PLAN, 0, 0, e == 0) for e in range(6)]
    assert [e.wanted for e in r.history] == [False, False, True, False, True, True]
    assert [e.replanned for e in r.history] == [False] * 5 + [True]  # only when seen twice
    assert plans[-1].batches[1] < 32
    big = [(1.0, 0.5), (2.0, 0.0), (1.0, 0.5)]
    r = Rebalancer(Sequence3([even, even, big]), threshold=0.03)
    assert [r.after_epoch(e, PLAN, 0, 0, e == 0) is PLAN for e in range(3)] == [True, True, False]
    # a warm-up epoch between two that want the small gain (a retrace) does not reset it
    r = Rebalancer(Sequence3([even, small, small, small]), threshold=0.03)
    for e, traced in enumerate([False, False, True, False]):
        r.after_epoch(e, PLAN, 0, 0, traced)
    assert [(e.wanted, e.replanned) for e in r.history] == [
        (False, False), (True, False), (False, False), (True, True)]
