"""The one global order (hetgrad/data/order.py, reader.py), on one process: every sample once
per epoch under any plan, each step the same samples whatever the world size or plan, a
re-plan or a resume mid-epoch continuing the same sequence."""
import numpy as np
import pytest

from hetgrad.data import ArraySource
from hetgrad.data.order import epoch_indices, rank_spans, step_span
from hetgrad.data.reader import rank_batches
from hetgrad.partition import make_plan

N = 1437
IDS = ArraySource(np.arange(N), name="ids")      # each sample is its own index


def steps_of(plan, seed=7, epoch=2, first=0, stop=None):
    """Every step's global batch (the ranks' slices concatenated), as index arrays."""
    per_rank = [[b[0].numpy() for b in rank_batches(IDS, plan, r, seed, epoch, first, stop)]
                for r in range(plan.world_size)]
    return [np.concatenate(parts) for parts in zip(*per_rank)]


def test_each_epoch_is_a_permutation_of_its_own():
    a, b = epoch_indices(7, 0, N), epoch_indices(7, 1, N)
    assert sorted(a) == list(range(N)) and sorted(b) == list(range(N))
    assert not np.array_equal(a, b) and not np.array_equal(a, epoch_indices(8, 0, N))
    assert np.array_equal(a, epoch_indices(7, 0, N))          # a pure function


@pytest.mark.parametrize("speeds", [[1], [1, 3], [1, 2, 4], [5, 1, 1, 1]])
def test_every_sample_once_and_steps_independent_of_the_plan(speeds):
    plan = make_plan(speeds, 96, N)
    steps = steps_of(plan)
    flat = np.concatenate(steps)
    assert len(flat) == N - plan.dropped and len(set(flat)) == len(flat)
    one = steps_of(make_plan([1], 96, N))
    assert len(steps) == len(one) and all(np.array_equal(s, o) for s, o in zip(steps, one))
    assert np.array_equal(flat, epoch_indices(7, 2, N)[:len(flat)])   # the global order


@pytest.mark.parametrize("decode", [False, True])
def test_a_tail_smaller_than_the_world_is_read_with_empty_batches(decode):
    n = 96 * 3 + 2                          # the final step holds 2 samples, for 3 ranks
    ids = ArraySource(np.arange(n), name="ids")
    if decode:                               # a per-sample decode runs on an empty batch too
        import tensorflow as tf
        ids.decode = lambda i: (tf.cast(i, tf.float32) * 0.5,)
    plan = make_plan([1, 2, 4], 96, n)
    last = [list(rank_batches(ids, plan, r, 7, 1))[-1][0].numpy() for r in range(3)]
    assert [len(b) for b in last] == plan.last_batches() and min(plan.last_batches()) == 0
    one = make_plan([1], 96, n)
    got = [list(rank_batches(ids, plan, r, 7, 1)) for r in range(3)]
    flat = np.concatenate([b[0].numpy() for steps in zip(*got) for b in steps])
    want = [b[0].numpy() for b in rank_batches(ids, one, 0, 7, 1)]
    assert np.array_equal(flat, np.concatenate(want))           # one process's sequence
    assert sorted(flat * (2 if decode else 1)) == list(range(n))  # every sample once


def test_spans_tile_the_epoch():
    plan = make_plan([1, 2, 4], 96, N)
    spans = sorted(step_span(plan, r, k) for r in range(3) for k in range(plan.steps_per_epoch))
    ends = [s + n for s, n in spans]
    assert spans[0][0] == 0 and all(e == s for e, (s, _) in zip(ends, spans[1:]))
    assert ends[-1] == N
    starts, lengths = rank_spans(plan, 1, first=14)
    assert lengths == [plan.last_batches()[1]] and len(starts) == 1


def test_replan_or_resume_mid_epoch_continues_the_sequence():
    a, b = make_plan([1, 2, 4], 96, N), make_plan([3, 1], 96, N)
    switched = steps_of(a, stop=6) + steps_of(b, first=6)
    resumed = steps_of(a, first=6)
    one = steps_of(make_plan([1], 96, N))
    assert all(np.array_equal(s, o) for s, o in zip(switched, one))
    assert all(np.array_equal(s, o) for s, o in zip(resumed, one[6:]))


def test_the_pipelines_run_without_autotuning():
    """A fit or evaluate ends by deleting its iterator, which with tf.data's autotuning waits
    for the tuning thread to wake up (up to 0.5 s per epoch on 2 cores, docs/results.md)."""
    from hetgrad.data.reader import in_order
    plan = make_plan([1.0, 2.0], 6, len(IDS))
    for ds in (rank_batches(IDS, plan, 1, 0, 0), in_order(IDS, 4)):
        assert ds.options().autotune.enabled is False
