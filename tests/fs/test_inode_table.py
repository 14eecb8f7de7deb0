"""The inode table and packed listings on their own: numbers, paths, freeing, renames, etags.

Memory is checked the way the bench measures it, with tracemalloc over a VFS walking a real
local tree (tests.fs.test_vfs's helpers), at a scale small enough for a unit test.
"""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest
import trio

from pffs.backends.base import ObjectInfo
from pffs.errors import NotFound
from pffs.fs.inodes import ROOT_INODE, InodeTable, path_number
from pffs.fs.listings import DirListing
from pffs.fs.packed import PackedInfos
from tests.fs.test_vfs import counted_vfs, list_all

MD5 = "0123456789abcdef0123456789abcdef"


def file_info(name: str, size: int = 1, etag: str | None = None) -> ObjectInfo:
    return ObjectInfo(name, size, 1700000000.25, etag, is_dir=False)


def dir_info(name: str) -> ObjectInfo:
    return ObjectInfo(name, 0, 1700000000.0, None, is_dir=True)


def new_table() -> InodeTable:
    return InodeTable(dir_info(""))


@pytest.mark.parametrize(
    "etag", [MD5, f'"{MD5}"', MD5.upper(), f'"{MD5}', '"quoted"', f'"{MD5}-3"', "", None]
)
def test_packed_infos_give_back_what_they_were_given(etag: str | None) -> None:
    infos = PackedInfos()
    infos.append(file_info("a"))
    infos.append(ObjectInfo("b", 2**40, 1.5e9 + 0.123456789, etag, is_dir=True))
    assert infos.get(1, "b") == ObjectInfo("b", 2**40, 1.5e9 + 0.123456789, etag, True)
    infos.set(0, file_info("a", 7, etag))
    assert infos.get(0, "a") == file_info("a", 7, etag)
    copy = PackedInfos()
    copy.extend_blank(1)
    copy.copy(0, infos, 1)
    assert copy.get(0, "b") == infos.get(1, "b") and copy.same_as(0, infos, 1)


def test_a_path_keeps_its_number_and_a_child_its_parents_path() -> None:
    table = new_table()
    d = table.remember("d", dir_info("d"), 10.0)
    f = table.remember("d/f", file_info("f", 5, MD5), 10.0)
    assert d.ino == path_number("d") and f.ino == path_number("d/f")
    assert f.path == "d/f" and f.info == file_info("f", 5, MD5) and not f.is_dir
    assert table.known("d/f") is not None and table.ino_of("d/f") == f.ino
    assert table.known("d/g") is None and table.known("e/f") is None
    again = table.remember("d/f", file_info("f", 6), 20.0)
    assert again.ino == f.ino and f.info.size == 6 and f.expires == 20.0


def test_what_the_kernel_forgets_costs_nothing_afterwards() -> None:
    table = new_table()
    held = []
    for d in range(3):
        directory = table.remember(f"d{d}", dir_info(f"d{d}"), 10.0)
        held.append(directory)
        for f in range(3000):
            held.append(table.remember(f"d{d}/f{f}", file_info(f"f{f}"), 10.0))
    assert len(table) == 1 + 3 + 9000
    keep = held[1]  # d0/f0: its directory stays, as its parent
    for inode in held:
        if inode is not keep:
            table.drop(inode)
    assert len(table) == 3  # the root, d0 (released, kept as keep's parent), keep
    assert table.live(keep.ino) and not table.live(held[0].ino) and keep.path == "d0/f0"
    assert len(table.names) < 9000  # the columns were compacted
    table.drop(keep)
    assert len(table) == 1 and table.numbers() == [ROOT_INODE]
    with pytest.raises(NotFound):
        _ = keep.path
    # Looked up again, a path gets the same number.
    assert table.remember("d0/f0", file_info("f0"), 10.0).ino == keep.ino


def test_a_path_replaced_while_held_gets_a_spare_number() -> None:
    table = new_table()
    table.remember("d", dir_info("d"), 10.0)
    old = table.remember("d/f", file_info("f", 1), 10.0)
    assert table.forget_path("d/f") is not None  # deleted; the kernel still holds it
    new = table.remember("d/f", file_info("f", 2), 10.0)
    assert new.ino != old.ino and new.ino < 1 << 62  # a counter's number, never a digest's
    assert old.path == "d/f" and old.info.size == 1 and new.info.size == 2
    assert table.ino_of("d/f") == new.ino
    table.drop(old)
    assert table.ino_of("d/f") == new.ino and not table.live(old.ino)


def test_a_directory_renamed_takes_what_is_under_it_along() -> None:
    table = new_table()
    table.remember("a", dir_info("a"), 10.0)
    table.remember("b", dir_info("b"), 10.0)
    sub = table.remember("a/sub", dir_info("sub"), 10.0)
    leaf = table.remember("a/sub/leaf", file_info("leaf"), 10.0)
    moved = table.move("a/sub", "b/renamed")
    assert sorted(moved) == sorted([("a/sub", sub.ino), ("a/sub/leaf", leaf.ino)])
    assert sub.path == "b/renamed" and leaf.path == "b/renamed/leaf"
    assert table.ino_of("b/renamed/leaf") == leaf.ino and table.ino_of("a/sub/leaf") is None
    assert leaf.expires == 0.0  # asked again: a store's copy has new times
    # The old path made again gets a number of its own, though its digest is taken.
    again = table.remember("a/sub", dir_info("sub"), 10.0)
    assert again.ino not in (sub.ino, leaf.ino) and table.ino_of("b/renamed") == sub.ino
    # Renamed back, the entries find their digests again.
    table.forget_path("a/sub")
    table.move("b/renamed", "a/sub")
    assert table.ino_of("a/sub/leaf") == leaf.ino == path_number("a/sub/leaf")


def test_a_path_under_a_directory_the_table_does_not_hold() -> None:
    table = new_table()
    deep = table.remember("x/y/z", file_info("z"), 10.0)
    assert deep.path == "x/y/z" and table.known("x/y") is None  # placeholders are not live
    table.drop(deep)
    assert len(table) == 1  # the placeholders went with it


def test_the_kernel_keeps_pages_of_the_current_version_only() -> None:
    table = new_table()
    inode = table.remember("f", file_info("f", 1, MD5), 10.0)
    inode.kernel_version = MD5
    assert inode.kernel_version == MD5
    inode.info = file_info("f", 1, MD5)  # the same version again
    assert inode.kernel_version == MD5
    inode.info = file_info("f", 2, "b" * 32)  # replaced at the source
    assert inode.kernel_version is None


def test_a_listing_finds_names_in_order_or_not() -> None:
    listing = DirListing()
    for name in ["b", "d", "a", "c"]:  # a store listing out of order
        listing.add(file_info(name))
    listing.add(dir_info("d"))  # a key that is both an object and a prefix: the directory
    listing.add(file_info("b", 99))  # seen again: the first stays
    assert list(listing.names) == ["b", "d", "a", "c"]
    assert [listing.position(n) for n in "abcde"] == [2, 0, 3, 1, None]
    assert listing.get("d") == dir_info("d") and listing.get("b") == file_info("b")
    ordered = DirListing()
    for name in ["a", "b", "b", "c"]:
        ordered.add(file_info(name))
    assert list(ordered.names) == ["a", "b", "c"]
    assert ordered.get("c") == file_info("c") and ordered.get("bb") is None


def test_a_walked_tree_costs_under_300_bytes_an_entry(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    for d in range(4):
        (root / f"d{d}").mkdir(parents=True)
        for f in range(2500):
            os.mknod(root / f"d{d}" / f"file-{f:06d}.bin")
    vfs, _ = counted_vfs(root)

    async def walk() -> int:
        entries = 0
        for _name, directory in await list_all(vfs, ROOT_INODE):
            entries += 1 + len(await list_all(vfs, directory.ino))
        return entries

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        entries = trio.run(walk)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert entries == 4 * 2501
    assert len(vfs.namespace.inodes) == 1 + entries  # every entry is live, as in a walk
    assert grown / entries < 300, grown / entries  # inode and listing entry, both
