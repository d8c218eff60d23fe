"""The test world (tests/world.py) runs cases on real ranks, reports a failing rank by case
and rank, and recovers from a case that left ranks stuck in a collective."""
import os

import pytest

from world import CaseError


def test_cases_run_on_every_rank_with_their_environment(world2):
    res = world2.run("world_checks:ranks_and_sum", "HETGRAD_TEST_KEY",
                     env={"HETGRAD_TEST_KEY": "x"})
    assert [v["rank"] for v in res.values] == [0, 1]
    assert {v["sum"] for v in res.values} == {3.0} and {v["size"] for v in res.values} == {2}
    assert res.stdout == ["rank 0 here\n", "rank 1 here\n"]
    assert {v["env"] for v in res.values} == {"x"} and "HETGRAD_TEST_KEY" not in os.environ


def test_a_failing_rank_is_named_and_the_world_recovers(world2, monkeypatch):
    import world
    monkeypatch.setattr(world, "GRACE_S", 3.0)
    with pytest.raises(CaseError) as info:
        world2.run("world_checks:fail_on", 1)
    text = str(info.value)
    assert "case world_checks:fail_on failed on 2 ranks" in text
    assert "rank 1 raised" in text and "injected failure on rank 1" in text
    # rank 1's Horovod shut down as its case ended, which ends rank 0's wait with an error
    # (or, where it does not, the world is ended after GRACE_S)
    assert "rank 0 raised" in text or "rank(s) [0] did not finish; world ended" in text
    again = world2.run("world_checks:ranks_and_sum", "HOME")   # a new world of 2
    assert [v["sum"] for v in again.values] == [3.0, 3.0]
