"""A mount's budget of bytes ahead (pffs.flow.budget): the figures carved from the memory bound,
and how readahead, preload and regions draw from it."""

from __future__ import annotations

from pffs.config import CacheConfig
from pffs.flow.budget import AheadBudget

MIB = 1 << 20


def test_the_figures_carved_from_the_memory_bound() -> None:
    ample = AheadBudget(CacheConfig(memory_bytes=512 * MIB, disk_dir="/tmp/x", disk_bytes=10_000))
    assert ample.total == 128 * MIB  # the configured budget, under half the memory bound
    assert ample.memory_tier == 384 * MIB
    assert ample.largest_window == 128 * MIB  # half the memory tier is more: the budget
    assert ample.window_max(32 * MIB) == 32 * MIB
    assert ample.preload_max(64 * MIB) == 64 * MIB
    assert ample.preload_max(100 * MIB) == 64 * MIB  # half the budget: readahead keeps the rest
    assert ample.unread_max == 5_000  # half the disk bound
    assert ample.region_per_file == 4 * 4 * MIB
    assert ample.write_room == 256 * MIB  # two budgets' blocks may wait for the disk
    small = AheadBudget(CacheConfig(memory_bytes=64 * MIB, disk_dir=None))
    assert small.total == 32 * MIB  # half the memory bound at most
    assert small.largest_window == 16 * MIB  # half the memory tier
    assert small.window_max(32 * MIB) == 16 * MIB
    assert small.unread_max == 16 * MIB  # no disk tier: half the memory tier
    assert small.write_room == 64 * MIB


def test_readahead_and_preload_share_the_budget_and_regions_have_their_bound() -> None:
    budget = AheadBudget(CacheConfig(memory_bytes=64 * MIB, ahead_budget=8 * MIB, disk_dir=None))
    assert budget.take("readahead", 6 * MIB)
    assert not budget.fits("preload", 3 * MIB)  # beside readahead's, over the budget
    assert not budget.take("readahead", 3 * MIB)
    assert budget.held["readahead"] == 6 * MIB
    budget.add("preload", 2 * MIB)  # a started file's blocks
    assert budget.loading == 8 * MIB
    assert budget.take("region", 8 * MIB)  # spans: bounded on their own
    assert not budget.fits("region", 1)
    budget.give_back("readahead", 6 * MIB)
    budget.give_back("preload", 2 * MIB)
    budget.give_back("region", 8 * MIB)
    assert budget.held == {"readahead": 0, "preload": 0, "region": 0}
