"""Overlapping-group stress: thousands of collective instances over randomly drawn (unsorted) subgroups in
one global order, mixed ops and sizes (some above a staging slot), every result checked on every rank.
Cases are in cases_stress.py."""

from __future__ import annotations

import time

import cases_stress as cs
import mp_harness
import pytest

# (world size, instances, every how many instances one is large, seed)
CONFIGS = [
    pytest.param(4, 2000, 250, 1, id="ws4-2000"),
    pytest.param(3, 1000, 200, 2, id="ws3-1000"),
    pytest.param(8, 400, 0, 3, id="ws8-400", marks=pytest.mark.multirank(8)),
]


@pytest.mark.timeout(420)
@pytest.mark.parametrize("world_size,count,large_every,seed", CONFIGS)
def test_overlapping_groups(world_pool, world_size, count, large_every, seed):
    mp_harness.skip_if_too_big(world_size)
    world = world_pool.get(world_size, timeout=30.0, gloo=False)
    start = time.monotonic()
    ran = world.run(cs.case_stress, seed, count, large_every, timeout=300.0)
    elapsed = time.monotonic() - start
    assert ran == cs.expected_counts(seed, world_size, count, large_every)
    print(f"\n{count} instances on {world_size} ranks in {elapsed:.2f} s")


def test_schedule_is_mixed():
    """The schedule really mixes ops, group sizes, large messages and member orders."""
    schedule = cs.build_schedule(1, 4, 2000, 250)
    ops = {s[0] for s in schedule}
    assert ops == set(cs.OPS)
    assert {len(s[1]) for s in schedule} == {2, 3, 4}
    assert sum(s[2] * 4 > 4 << 20 for s in schedule) >= 5
    assert any(s[1] != sorted(s[1]) for s in schedule)
    assert {s[6] for s in schedule} == {"heap", "plain"}
