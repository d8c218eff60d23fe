"""The partitioner: exact sums, equal steps on every rank, caps, and clear errors."""
import math

import pytest
from hypothesis import given, settings, strategies as st

from hetgrad.errors import HetgradError
from hetgrad.goodput import candidates, full_tail
from hetgrad.partition import Plan, fixed_plan, make_plan, plan_batches


def test_batches_proportional_and_sum_exactly():
    p = make_plan([1, 2, 4], 96, 1437)
    assert p.batches == [14, 27, 55]  # 96 * (1, 2, 4) / 7 = 13.7, 27.4, 54.9
    assert sum(p.batches) == 96
    assert p.steps_per_epoch == math.ceil(1437 / 96)
    assert sum(p.shard_sizes) == 1437 and p.dropped == 0


def test_largest_remainder_rounding():
    # shares 3.33.. each: the first gets the extra unit (ties broken by rank)
    assert make_plan([1, 1, 1], 10, 100).batches == [4, 3, 3]
    # 10 * (0.55, 0.45) = 5.5, 4.5 -> remainders tie, still sums to 10
    assert sum(make_plan([0.55, 0.45], 10, 100).batches) == 10


def test_memory_cap_overflow_goes_to_others_by_speed():
    p = make_plan([8, 1, 1], 100, 1000, max_batch=[40, 100, 100])
    assert p.batches[0] == 40
    assert p.batches[1:] == [30, 30]


def test_min_batch_raises_slow_ranks():
    p = make_plan([100, 1], 64, 640, min_batch=8)
    assert p.batches == [56, 8]


def test_final_partial_step_keeps_every_rank_busy():
    p = make_plan([1, 3], 40, 105)  # 2 full steps + 25 samples
    assert p.steps_per_epoch == 3
    assert all(1 <= last <= b for last, b in zip(p.last_batches(), p.batches))
    assert sum(p.last_batches()) == 25


def test_a_tail_smaller_than_the_world_is_a_step_where_some_ranks_have_none():
    p = make_plan([1, 1, 1], 30, 62)  # 2 full steps + 2 samples < 3 ranks
    assert p.dropped == 0 and p.steps_per_epoch == 3
    assert sorted(p.last_batches()) == [0, 1, 1] and sum(p.shard_sizes) == 62
    fast = make_plan([1, 1, 4], 30, 61)  # one sample: the fastest rank holds it
    assert fast.last_batches() == [0, 0, 1]


def test_the_tail_is_dropped_only_when_asked_and_then_reported():
    p = make_plan([1, 1, 1], 30, 62, drop_remainder=True)
    assert p.dropped == 2 and p.steps_per_epoch == 2 and sum(p.shard_sizes) == 60
    q = fixed_plan([10, 20], 95, drop_remainder=True)
    assert q.dropped == 5 and q.steps_per_epoch == 3
    assert fixed_plan([10, 20], 90, drop_remainder=True).dropped == 0   # no tail to drop


@settings(max_examples=300, deadline=None)
@given(speeds=st.lists(st.floats(0.01, 100.0), min_size=1, max_size=16),
       extra=st.integers(0, 512), n=st.integers(1, 20000), min_batch=st.integers(1, 4))
def test_property_equal_steps_disjoint_cover(speeds, extra, n, min_batch):
    B = len(speeds) * min_batch + extra
    if n < B:
        with pytest.raises(HetgradError):
            make_plan(speeds, B, n, min_batch=min_batch)
        return
    p = make_plan(speeds, B, n, min_batch=min_batch)
    assert sum(p.batches) == B
    assert all(b >= min_batch for b in p.batches)
    assert p.steps_per_epoch == math.ceil(n / B) and p.dropped == 0
    lasts = p.last_batches()
    assert all(0 <= last <= b for last, b in zip(lasts, p.batches))
    assert sum(lasts) == n - (p.steps_per_epoch - 1) * B
    assert min(lasts) >= 1 or sum(lasts) < len(speeds)   # a rank idles only in a tiny tail
    assert sum(p.shard_sizes) == n
    ends = [s + z for s, z in zip(p.shard_starts, p.shard_sizes)]
    assert p.shard_starts[0] == 0 and ends[-1] == n
    assert p.shard_starts[1:] == ends[:-1]  # contiguous, disjoint
    # faster never gets a smaller batch (rounding can tie)
    order = sorted(range(len(speeds)), key=lambda i: speeds[i])
    assert all(p.batches[order[i]] <= p.batches[order[i + 1]] + 1 for i in range(len(order) - 1))


@pytest.mark.parametrize("speeds", [[1, 0, 2], [1, -3], [float("nan"), 1], [float("inf"), 1], []])
def test_bad_speeds_name_the_flag(speeds):
    with pytest.raises(HetgradError, match="speeds"):
        make_plan(speeds, 64, 1000)


def test_global_batch_below_ranks_times_min_batch():
    with pytest.raises(HetgradError, match=r"global_batch: global batch 10 < 3 ranks x min batch 4"):
        make_plan([1, 1, 1], 10, 1000, min_batch=4)


def test_dataset_smaller_than_global_batch():
    with pytest.raises(HetgradError, match="global_batch: dataset has 50 samples"):
        make_plan([1, 2], 64, 50)


def test_caps_too_small():
    with pytest.raises(HetgradError, match="max_batch"):
        make_plan([1, 1], 64, 1000, max_batch=[16, 16])


def test_plan_roundtrip_and_wrong_rank_count(tmp_path):
    p = make_plan([1, 2, 4], 96, 1437)
    f = tmp_path / "plan.json"
    p.save(f)
    assert Plan.load(f, world_size=3) == p
    with pytest.raises(HetgradError, match="plan: plan file .* is for 3 ranks but this job has 2"):
        Plan.load(f, world_size=2)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(HetgradError, match="plan: cannot read plan file"):
        Plan.load(tmp_path / "bad.json")


def test_a_chosen_batch_leaves_no_last_step_of_a_few_samples():
    assert full_tail(476, 20000) == 466 and 20000 - 42 * 466 == 428   # not 8 at 476
    for n in (20000, 1437, 99991):
        for b in candidates(24, 4096, 24):
            f = full_tail(b, n, 24)
            steps = math.ceil(n / b)
            assert 24 <= f <= b and math.ceil(n / f) == steps or f == 24
            if f > 24:
                assert n - (steps - 1) * f > f - steps      # the last step nearly full
    assert full_tail(100, 20000) == 100                    # a batch that divides stays


def test_a_plan_with_a_thin_last_step_says_so():
    warning = fixed_plan([238, 238], 20000).thin_tail()
    assert "holds 8 of 476 samples" in warning and "global batch 466" in warning
    assert "--drop-remainder" in warning
    assert fixed_plan([233, 233], 20000).thin_tail() is None          # 428 of 466
    assert fixed_plan([238, 238], 20000, drop_remainder=True).thin_tail() is None
    assert fixed_plan([50, 50], 20000).thin_tail() is None            # none: it divides


@pytest.mark.parametrize("speeds,batch,n,kw", [
    ([1, 2, 4], 96, 1437, {}), ([8, 1, 1], 100, 1000, {"max_batch": [40, 100, 100]}),
    ([1, 1], 64, 1000, {"min_batch": 8})])
def test_the_batches_alone_are_the_plans(speeds, batch, n, kw):
    """plan_batches (what the adaptive batch predicts step times from): the plan's batches,
    without its shards."""
    assert plan_batches(speeds, batch, n, **kw)[1] == make_plan(speeds, batch, n, **kw).batches


@pytest.mark.parametrize("batch,n,kw", [(3, 100, {"min_batch": 2}), (200, 100, {}),
                                        (10.5, 100, {}), (64, 100, {"max_batch": 10})])
def test_the_batches_alone_are_refused_as_the_plan_is(batch, n, kw):
    with pytest.raises(HetgradError) as plan:
        make_plan([1, 1], batch, n, **kw)
    with pytest.raises(HetgradError) as alone:
        plan_batches([1, 1], batch, n, **kw)
    assert str(alone.value) == str(plan.value) and alone.value.field == plan.value.field
