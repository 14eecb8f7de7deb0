"""Answers of the store asked before a change through the mount and landing after it
(pffs.fs.changes): none is kept, and none is handed to a reader that came after the change.

An S3 backend on moto (a real store) whose next request is held with its answer
(tests.fs.test_listing_lookups.CountingTrees); the writes go through the Vfs as the kernel's
would (create, write, flush, release: the upload at the flush).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
from trio.testing import wait_all_tasks_blocked

from pffs.fs.inodes import ROOT_INODE, TableInode
from tests.fs.test_listing_lookups import SMALL_TREE, counted_tree_vfs, ttl_clock
from tests.fs.test_vfs import list_all, run


async def write_through(vfs: Any, parent: int, name: str, data: bytes) -> None:
    """`name` in directory `parent` written whole through the mount, and uploaded."""
    fh, _ = await vfs.create(parent, name, os.O_WRONLY)
    await _write_and_close(vfs, fh, data)


async def rewrite_through(vfs: Any, inode: TableInode, data: bytes) -> None:
    """The file of `inode` rewritten whole through the mount, and uploaded."""
    fh, _ = await vfs.open(inode.ino, os.O_WRONLY | os.O_TRUNC)
    await _write_and_close(vfs, fh, data)


async def _write_and_close(vfs: Any, fh: int, data: bytes) -> None:
    assert await vfs.write(fh, 0, data) == len(data)
    await vfs.flush(fh)  # the upload
    await vfs.release(fh)


async def lookup_across(
    vfs: Any, backend: Any, parent: int, name: str, change: Callable[[], Awaitable[None]]
) -> TableInode:
    """A lookup of `name` in directory `parent` whose HEAD the store answers before `change`
    (a write through the mount) and which lands after it: what the lookup answered."""
    looked_up: list[TableInode] = []

    async def look_up() -> None:
        looked_up.append(await vfs.lookup(parent, name))

    async with trio.open_nursery() as nursery:
        held = backend.hold_next()
        nursery.start_soon(look_up)
        await held.until_asked()
        await change()
        held.release.set()
    return looked_up[0]


def test_a_listing_asked_before_a_change_through_the_mount_is_not_kept(
    moto, s3, bucket: str
) -> None:
    """A file written through the mount drops its directory's listing (Namespace.changed); a
    listing of that directory the store answered before, landing after, is not kept: it lacks
    the file, whose lookups it would answer "no such file" for the directory TTL. Listings of
    the directories that did not change are kept as before."""
    vfs, backend = counted_tree_vfs(moto, s3, bucket, SMALL_TREE)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            held = backend.hold_next()
            vfs.attach(nursery)  # the tree's page is asked, its answer held
            await held.until_asked()
            vfs.namespace.changed("a/b/written")  # a write through the mount is done
            held.release.set()
            await vfs.namespace.wait_for_listings()
            listings = vfs.namespace.listings
            assert listings.fresh("a/b") is None
            assert listings.fresh("a") is not None and listings.fresh("z/y") is not None
            # The same for a directory's own listing, taken for a lookup: `z/y`'s (its listing
            # from the page dropped), changed while its listing is on its way. The lookup that
            # waited for it asks the store about its name instead.
            listings.drop("z/y")
            held = backend.hold_next()
            looked_up = trio.Event()

            async def look_up_w() -> None:
                z = await vfs.lookup(ROOT_INODE, "z")
                y = await vfs.lookup(z.ino, "y")
                assert not (await vfs.lookup(y.ino, "w")).info.is_dir
                looked_up.set()

            nursery.start_soon(look_up_w)
            await held.until_asked()
            vfs.namespace.changed("z/y/written")
            held.release.set()
            await looked_up.wait()
            await vfs.namespace.wait_for_listings()
            assert backend.calls["list z/y"] == 1 and backend.calls["stat"] == 1
            assert listings.fresh("z/y") is None
            nursery.cancel_scope.cancel()

    run(main)


def test_ls_after_a_write_does_not_join_a_listing_asked_before_it(moto, s3, bucket: str) -> None:
    """A directory listed in the background for a lookup, the store's answer on its way while
    a file is written into it: an `ls` after the write lists the directory afresh, the new
    file in it, rather than reading the listing asked before."""
    vfs, backend = counted_tree_vfs(moto, s3, bucket, SMALL_TREE)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            vfs.attach(nursery)
            await vfs.namespace.wait_for_listings()
            a = await vfs.lookup(ROOT_INODE, "a")
            b = await vfs.lookup(a.ino, "b")
            vfs.namespace.listings.drop("a/b")  # forgotten: the next lookup in it lists it
            held = backend.hold_next()
            nursery.start_soon(vfs.lookup, b.ino, "other")
            await held.until_asked()
            await write_through(vfs, b.ino, "new", b"written")
            listed: list[str] = []
            done = trio.Event()

            async def ls() -> None:
                listed.extend(name for name, _ in await list_all(vfs, b.ino))
                done.set()

            nursery.start_soon(ls)
            await wait_all_tasks_blocked()  # the ls under way (it joined the held listing before)
            held.release.set()
            await done.wait()
            assert listed == ["c", "new", "other"]
            await vfs.namespace.wait_for_listings()
            assert backend.calls["list a/b"] == 2
            nursery.cancel_scope.cancel()

    run(main)


def test_a_heads_no_such_key_landing_after_the_file_was_written_is_not_kept(
    moto, s3, bucket: str
) -> None:
    """A lookup's HEAD of a name the store does not hold yet, answered only after the file
    was created, written and uploaded through the mount: the lookup answers the file, and no
    "no such file" is kept for the negative TTL."""
    vfs, backend = counted_tree_vfs(moto, s3, bucket, SMALL_TREE)  # no nursery: HEADs

    async def main() -> None:
        a = await vfs.lookup(ROOT_INODE, "a")
        written = functools.partial(write_through, vfs, a.ino, "new", b"written")
        assert (await lookup_across(vfs, backend, a.ino, "new", written)).info.size == 7
        stats = backend.calls["stat"]
        assert (await vfs.lookup(a.ino, "new")).info.size == 7
        assert backend.calls["stat"] == stats

    run(main)


def test_a_heads_old_attributes_landing_after_a_rewrite_are_not_kept(
    moto, s3, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lookup's HEAD of a file, answered only after the file was rewritten and uploaded
    through the mount: the old size and ETag are not kept for the attribute TTL (its reads
    would fail with ESTALE); the lookup answers what the upload left."""
    vfs, backend = counted_tree_vfs(moto, s3, bucket, SMALL_TREE)  # no nursery: HEADs
    clock = ttl_clock(monkeypatch)

    async def main() -> None:
        a = await vfs.lookup(ROOT_INODE, "a")
        b = await vfs.lookup(a.ino, "b")
        other = await vfs.lookup(b.ino, "other")
        assert other.info.size == 4
        clock.now += 3600  # every attribute expired: the next lookup asks the store
        rewritten = functools.partial(rewrite_through, vfs, other, b"rewritten")
        answered = await lookup_across(vfs, backend, b.ino, "other", rewritten)
        assert answered.info.size == 9
        stats = backend.calls["stat"]
        after = await vfs.lookup(b.ino, "other")
        assert after.info.size == 9 and after.info.etag == answered.info.etag
        assert backend.calls["stat"] == stats

    run(main)


def test_an_ls_l_under_way_across_a_rewrite_does_not_set_the_old_attributes(
    moto, s3, bucket: str
) -> None:
    """A directory handle's listing taken before a file in it was rewritten through the mount,
    read on after the upload (an `ls -l` under way): its entry for the file does not set the
    old size and ETag for the attribute TTL; the inode keeps what the upload left."""
    vfs, _ = counted_tree_vfs(moto, s3, bucket, SMALL_TREE)  # no nursery

    async def main() -> None:
        a = await vfs.lookup(ROOT_INODE, "a")
        b = await vfs.lookup(a.ino, "b")
        other = await vfs.lookup(b.ino, "other")
        fh = await vfs.opendir(b.ino)
        first: list[str] = []

        def one_entry(name: str, inode: Any, next_position: int) -> bool:
            if first:
                return False  # the kernel's buffer is full after one entry
            first.append(name)
            return True

        await vfs.readdir(fh, 0, one_entry)  # the listing asked, `c` read
        assert first == ["c"]
        await rewrite_through(vfs, other, b"rewritten")
        rest: list[tuple[str, Any]] = []

        def every_entry(name: str, inode: Any, next_position: int) -> bool:
            rest.append((name, inode))
            return True

        await vfs.readdir(fh, 1, every_entry)  # on after the upload
        vfs.releasedir(fh)
        assert [(name, inode.info.size) for name, inode in rest] == [("other", 9)]
        assert (await vfs.lookup(b.ino, "other")).info.size == 9

    run(main)
