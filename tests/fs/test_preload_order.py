"""The order a mount's dataset preload walks a listing in (pffs.fs.datasets, issue 37): a mount
sharing a tier walks each window of the listing in an order of its own (`Joined.preload_order`:
a group member from its place among the members, a shared tier's mount in a shuffle seeded by
its name; pffs.group.sources), all of it; a mount without a tier walks it in listing order, as
before.

The listing is the real local backend's; what the pass sends is read from the job's channel
itself (the engine, which would load the files, is left out: the order is what is tested). The
tier is one that holds nothing, as no store is asked here."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import trio

from pffs.cache.keys import ObjectBlocks
from pffs.cache.preload import Items
from pffs.config import PreloadConfig
from pffs.flow.permits import Priority
from pffs.fs import datasets
from pffs.fs.datasets import DatasetPreload
from pffs.group.sources import Joined, member_order, shuffled_order
from tests.fs.helpers import KIB, dataset, preloading_vfs


class HoldsNothing:
    """A tier that is never asked (every block from the store)."""

    def asks(self, blocks: ObjectBlocks, index: int) -> bool:
        return False

    async def fetch_block(
        self, blocks: ObjectBlocks, index: int, priority: Priority = "reader"
    ) -> bytes | None:
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
            monkeypatch.setattr(
                preload.engine, "add", lambda _name, items, **_: channels.append(items)
            )
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
    members = ["node0", "node1", "node2", "node3"]
    tier = Joined(HoldsNothing(), preload_order=functools.partial(member_order, "node1", members))
    order = [f"{i:03}.bin" for i in range(40)]
    assert preload_order(tmp_path, monkeypatch, 40, tier) == order[10:] + order[:10]


def test_each_window_of_a_long_listing_is_walked_in_the_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(datasets, "ORDER_WINDOW", 10)
    tier = Joined(HoldsNothing(), preload_order=lambda count: list(range(count))[::-1])
    got = [int(name[:3]) for name in preload_order(tmp_path, monkeypatch, 25, tier)]
    assert got == [*range(9, -1, -1), *range(19, 9, -1), *range(24, 19, -1)]


def test_group_members_start_evenly_spread() -> None:
    members = ["node2", "node0", "node3", "node1"]
    starts = [member_order(name, members, 400)[0] for name in sorted(members)]
    assert starts == [0, 100, 200, 300]
    assert sorted(member_order("node3", members, 400)) == list(range(400))
    assert member_order("elsewhere", members, 50) == shuffled_order("elsewhere", 50)


def test_shuffles_are_stable_and_differ_between_names() -> None:
    orders = [shuffled_order(f"host:/mnt/node{n}", 400) for n in range(4)]
    assert orders == [shuffled_order(f"host:/mnt/node{n}", 400) for n in range(4)]
    assert all(sorted(order) == list(range(400)) for order in orders)
    # Two mounts rarely want the same file at the same step of their walks.
    firsts = [set(order[:40]) for order in orders]
    assert all(len(firsts[a] & firsts[b]) < 15 for a in range(4) for b in range(a + 1, 4))
