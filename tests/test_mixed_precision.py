"""Mixed precision never hangs a job: an fp16 overflow on one rank makes every rank skip that
step together, with the loss scale agreed, however the LossScaleOptimizer and hetgrad's
optimizer are put together (tests/mpi/mixed_precision.py)."""
import pytest


@pytest.fixture(scope="module")
def overflow(world2):
    return world2.run("mixed_precision:overflow", timeout=60).values   # never a hang


def test_an_overflow_on_one_rank_is_skipped_on_every_rank(overflow):
    root = overflow[0]
    assert len(root) == 4 * 4
    for key, r in root.items():
        assert r["outermost"], key               # hetgrad outside the loss scale
        assert r["first"] > 1e-3 and r["third"] > 1e-3, (key, r)   # other steps train ...
        assert r["skipped"] == 0.0, (key, r)     # ... the overflowing one moves nothing
        assert r["finite"] and r["spread"] == 0.0, (key, r)   # replicas equal, no NaN kept
        assert r["scale"] == 2.0 ** 14, (key, r)  # halved once from 2^15, on every rank
        assert overflow[1][key]["scale"] == r["scale"] and overflow[1][key]["skipped"] == 0.0
