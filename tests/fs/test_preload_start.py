"""Where a mount's dataset preload starts in a listing (pffs.fs.datasets, issue 37): a mount
sharing a tier starts each window of the listing at its own place (`Joined.preload_start`: a
group member's place among the members, a shared tier's mount a stable hash of its name;
pffs.group.sources) and walks all of it; a mount without a tier walks
it in listing order, as before.

The listing is the real local backend's; what the pass sends is read from the job's channel
itself (the engine, which would load the files, is left out: the order is what is tested). The
tier is one that holds nothing, as no store is asked here."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import trio

from pffs.cache.keys import ObjectBlocks
from pffs.cache.preload import Items
from pffs.config import PreloadConfig
from pffs.fs import datasets
from pffs.fs.datasets import DatasetPreload
from pffs.group.sources import Joined, hashed_start, member_start
from tests.fs.helpers import KIB, dataset, preloading_vfs


class HoldsNothing:
    """A tier that is never asked (every block from the store)."""

    def asks(self, blocks: ObjectBlocks, index: int) -> bool:
        return False

    async def fetch_block(self, blocks: ObjectBlocks, index: int) -> bytes | None:
        return None

    def landed(self, blocks: ObjectBlocks, index: int, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass


def preload_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, count: int, tier: Joined | None
) -> list[str]:
    """The file names one dataset pass over a directory of `count` files sends, in order."""
    dataset(tmp_path, {"train": count}, KIB)
    vfs, _backend = preloading_vfs(tmp_path)
    preload = DatasetPreload(vfs.namespace, vfs.cache, PreloadConfig(), tier)
    channels: list[Items] = []
    names: list[str] = []

    async def body() -> None:
        async with trio.open_nursery() as nursery:
            vfs.namespace.attach(nursery)
            preload.attach(nursery)
            monkeypatch.setattr(preload.engine, "add", lambda _name, items: channels.append(items))
            preload.start("train", depth=0)
            async for item in channels[0]:
                names.append(item.keys[0].path.rpartition("/")[2])
            nursery.cancel_scope.cancel()

    trio.run(body)
    return names


def test_without_a_tier_the_listing_order_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert preload_order(tmp_path, monkeypatch, 40, None) == [f"{i:03}.bin" for i in range(40)]


def test_a_member_starts_at_its_place_and_walks_all_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = Joined(HoldsNothing(), preload_start=lambda: 0.25)
    order = [f"{i:03}.bin" for i in range(40)]
    assert preload_order(tmp_path, monkeypatch, 40, tier) == order[10:] + order[:10]


def test_each_window_of_a_long_listing_is_started_at_the_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(datasets, "ROTATION_WINDOW", 10)
    tier = Joined(HoldsNothing(), preload_start=lambda: 0.5)
    got = [int(name[:3]) for name in preload_order(tmp_path, monkeypatch, 25, tier)]
    windows = [[5, 6, 7, 8, 9, 0, 1, 2, 3, 4], [15, 16, 17, 18, 19, 10, 11, 12, 13, 14]]
    assert got == [*windows[0], *windows[1], 22, 23, 24, 20, 21]


def test_group_members_start_evenly_spread() -> None:
    members = ["node2", "node0", "node3", "node1"]
    assert [member_start(name, members) for name in sorted(members)] == [0.0, 0.25, 0.5, 0.75]
    assert member_start("elsewhere", members) == hashed_start("elsewhere")  # not listed


def test_a_hashed_start_is_stable_and_spread_over_names() -> None:
    starts = [hashed_start(f"node{n}") for n in range(200)]
    assert starts == [hashed_start(f"node{n}") for n in range(200)]
    assert all(0.0 <= start < 1.0 for start in starts)
    quarters = Counter(int(start * 4) for start in starts)
    assert all(25 <= quarters[q] <= 75 for q in range(4)), quarters
