"""Lookups answered by directory listings taken in the background (pffs.fs.namespace).

A local directory behind a backend that counts its calls: each `stat` is what a HEAD would be
on S3, each `list` a paginated LIST.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
from trio.testing import wait_all_tasks_blocked

from pffs.backends import open_backend
from pffs.backends.base import ObjectInfo, TreeLister, TreePage, tree_lister
from pffs.config import SourceConfig
from pffs.errors import Changed, NotFound
from pffs.fs import namespace
from pffs.fs.inodes import ROOT_INODE, TableInode
from pffs.retry import RetryTerms
from tests.fs.helpers import make_vfs
from tests.fs.test_vfs import CountingBackend, counted_vfs, list_all, run


def dataset(tmp_path: Path, files: int = 20) -> Path:
    root = tmp_path / "many"
    root.mkdir()
    for i in range(files):
        (root / f"f{i:02d}").write_bytes(b"x" * i)
    return root


class TtlClock:
    """The namespace's clock of every TTL (`Namespace.now`), moved by the test alone: a busy
    machine's pauses never expire what the test means to keep."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ttl_clock(monkeypatch: pytest.MonkeyPatch) -> TtlClock:
    clock = TtlClock()
    monkeypatch.setattr(namespace.Namespace, "now", staticmethod(clock))
    return clock


def test_the_first_lookup_waits_for_the_directory_listing_and_none_asks_the_store(
    tmp_path: Path,
) -> None:
    vfs, backend = counted_vfs(dataset(tmp_path))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            vfs.attach(nursery)
            assert (await vfs.lookup(ROOT_INODE, "f05")).info.size == 5
            await vfs.namespace.wait_for_listings()
            for i in range(20):
                assert (await vfs.lookup(ROOT_INODE, f"f{i:02d}")).info.size == i
            with pytest.raises(NotFound):
                await vfs.lookup(ROOT_INODE, "absent")
            # The first lookup's answer came with the listing's first page: no HEAD at all;
            # the name it looked up was listed as a directory beside it (a file: nothing).
            assert backend.calls == {"list": 2}
            assert sorted(backend.listed) == ["", "f05"]
            nursery.cancel_scope.cancel()

    run(main)


def test_a_cold_path_is_resolved_with_half_the_listings_in_series(tmp_path: Path) -> None:
    """The kernel looks `a/b/c/file` up a name at a time, each lookup waiting for its parent's
    listing: a name looked up is listed as a directory beside its parent's first listing, so
    the lookups of `b` and `file` find theirs taken already (two round trips, not four)."""
    root = tmp_path / "tree"
    (root / "a" / "b" / "c").mkdir(parents=True)
    (root / "a" / "b" / "c" / "file").write_bytes(b"data")
    vfs, backend = counted_vfs(root)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            vfs.attach(nursery)
            a = await vfs.lookup(ROOT_INODE, "a")
            await vfs.namespace.wait_for_listings()
            assert sorted(backend.listed) == ["", "a"]
            b = await vfs.lookup(a.ino, "b")  # a's listing came with the root's
            assert len(backend.listed) == 2
            c = await vfs.lookup(b.ino, "c")
            await vfs.namespace.wait_for_listings()
            assert sorted(backend.listed[2:]) == ["a/b", "a/b/c"]
            assert (await vfs.lookup(c.ino, "file")).info.size == 4
            assert backend.calls == {"list": 4}  # and no HEAD
            nursery.cancel_scope.cancel()

    run(main)


def test_an_expired_listing_is_taken_again_when_lookups_have_paid_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the TTLs, a directory of 4 pages is listed again by the 4th lookup that would ask
    the store (a lone stat now and then stays one HEAD); then the rest need no store."""
    monkeypatch.setattr(namespace, "LISTING_PAGE", 5)
    clock = ttl_clock(monkeypatch)
    vfs, backend = counted_vfs(dataset(tmp_path), attr_ttl=0.3, dir_ttl=0.3, negative_ttl=0.3)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            vfs.attach(nursery)
            await vfs.lookup(ROOT_INODE, "f00")
            await vfs.namespace.wait_for_listings()
            clock.now += 0.4  # every TTL has passed
            for i in range(1, 4):
                await vfs.lookup(ROOT_INODE, f"f{i:02d}")
            assert backend.calls == {"stat": 3, "list": 2}  # the root and f00, at first
            await vfs.lookup(ROOT_INODE, "f04")  # answered by the listing it started
            await vfs.namespace.wait_for_listings()
            # Taken again, the root's listing lists no name beside it.
            assert backend.calls == {"stat": 3, "list": 3}
            assert backend.listed[2:] == [""]
            for i in range(20):
                assert (await vfs.lookup(ROOT_INODE, f"f{i:02d}")).info.size == i
            with pytest.raises(NotFound):
                await vfs.lookup(ROOT_INODE, "absent")
            assert backend.calls == {"stat": 3, "list": 3}
            nursery.cancel_scope.cancel()

    run(main)


def test_a_directory_too_big_is_not_listed_in_the_background_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(namespace, "BACKGROUND_LISTING_MAX", 5)
    clock = ttl_clock(monkeypatch)
    vfs, backend = counted_vfs(dataset(tmp_path), attr_ttl=0.01, dir_ttl=0.01, negative_ttl=0.01)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            vfs.attach(nursery)
            await vfs.lookup(ROOT_INODE, "f00")
            await vfs.namespace.wait_for_listings()
            clock.now += 0.05  # what it listed has expired
            for i in range(1, 20):
                assert (await vfs.lookup(ROOT_INODE, f"f{i:02d}")).info.size == i
            await vfs.namespace.wait_for_listings()
            # Given up, never started again (the other listing: f00 as a directory, at first).
            assert backend.calls == {"stat": 19, "list": 2}
            nursery.cancel_scope.cancel()

    run(main)


def test_without_a_nursery_lookups_ask_the_store(tmp_path: Path) -> None:
    vfs, backend = counted_vfs(dataset(tmp_path))
    assert isinstance(backend, CountingBackend)

    async def main() -> None:
        for i in range(3):
            await vfs.lookup(ROOT_INODE, f"f{i:02d}")
        assert backend.calls == {"stat": 3}

    run(main)


def test_a_read_that_meets_a_newer_version_distrusts_the_listing(tmp_path: Path) -> None:
    """Listings answer for the directory TTL; a read that finds the object changed at the
    source makes the next open ask the store, not wait out the TTL."""
    root = dataset(tmp_path)
    vfs, _ = counted_vfs(root)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            vfs.attach(nursery)
            inode = await vfs.lookup(ROOT_INODE, "f05")
            await vfs.namespace.wait_for_listings()
            fh, _ = await vfs.open(inode.ino, os.O_RDONLY)
            (root / "f05").write_bytes(b"new bytes, another size")
            with pytest.raises(Changed):
                await vfs.read(fh, 0, 100)
            await vfs.release(fh)
            inode = await vfs.lookup(ROOT_INODE, "f05")
            fh, _ = await vfs.open(inode.ino, os.O_RDONLY)
            assert await vfs.read(fh, 0, 100) == b"new bytes, another size"
            nursery.cancel_scope.cancel()

    run(main)


def test_ls_during_a_background_listing_shares_its_stream(tmp_path: Path) -> None:
    root = dataset(tmp_path)
    vfs, backend = counted_vfs(root)
    gate = threading.Event()
    listing = backend.list

    def held_list(path: str, terms: RetryTerms | None = None) -> Iterator[ObjectInfo]:
        gate.wait(timeout=10)  # consumed in a worker thread
        yield from listing(path, terms)

    backend.list = held_list  # type: ignore[method-assign]
    names: list[str] = []

    def emit(name: str, inode: object, position: int) -> bool:
        names.append(name)
        return True

    async def ls() -> None:
        fh = await vfs.opendir(ROOT_INODE)
        await vfs.readdir(fh, 0, emit)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            vfs.attach(nursery)
            async with trio.open_nursery() as both:
                both.start_soon(vfs.lookup, ROOT_INODE, "f00")  # starts the listing, held
                await wait_all_tasks_blocked()
                both.start_soon(ls)  # while the listing is held under way
                await wait_all_tasks_blocked()
                assert names == []  # ls waits on the listing's stream
                gate.set()
            assert sorted(names) == [f"f{i:02d}" for i in range(20)]
            assert backend.listed.count("") == 1  # one stream for both
            nursery.cancel_scope.cancel()

    run(main)


def test_a_directory_listed_lately_is_found_again_without_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ls -l sub`, then, once the kernel forgot `sub` and the root's listing expired, a lookup
    of it: its own listing, still fresh, says it is a directory; neither a HEAD nor a listing of
    the root is asked for. Once that listing has expired too, the store is asked again."""
    root = dataset(tmp_path)
    (root / "sub").mkdir()
    (root / "sub" / "a").write_bytes(b"a")
    clock = ttl_clock(monkeypatch)
    vfs, backend = counted_vfs(root, attr_ttl=1.0, entry_ttl=1.0, dir_ttl=1.0, negative_ttl=1.0)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            vfs.attach(nursery)
            sub = await vfs.lookup(ROOT_INODE, "sub")  # the root is listed (and sub beside it)
            await vfs.namespace.wait_for_listings()
            clock.now += 1.1  # both listings have expired: `ls -l sub` lists it again
            assert [name for name, _ in await list_all(vfs, sub.ino)] == ["a"]
            await vfs.namespace.wait_for_listings()
            clock.now += 0.5  # the root's listing and sub's attributes have expired
            before = dict(backend.calls)
            again = await vfs.lookup(ROOT_INODE, "sub")
            assert again.info.is_dir and again.ino == sub.ino
            assert backend.calls == before
            clock.now += 1.1  # sub's own listing has expired, and what the lookup kept
            await vfs.lookup(ROOT_INODE, "sub")
            assert backend.calls != before
            nursery.cancel_scope.cancel()

    run(main)


@dataclass
class Held:
    """One request held after the store answered it: `asked` is set then, and the answer
    lands once `release` is set."""

    asked: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    async def until_asked(self) -> None:
        assert await trio.to_thread.run_sync(self.asked.wait, 30)


class CountingTrees:
    """An S3 backend on moto (a real store), counting the namespace's listings and HEADs; the
    next request after `hold_next` is held with its answer (the store's answer on its way)."""

    def __init__(self, inner: TreeLister) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()
        self._held: Held | None = None

    def hold_next(self) -> Held:
        self._held = Held()
        return self._held

    def _hold(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held.asked.set()
            assert held.release.wait(30)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def stat(self, path: str, terms: RetryTerms | None = None) -> ObjectInfo:
        self.calls["stat"] += 1
        try:
            return self.inner.stat(path, terms)
        finally:  # "no such key" is held as well
            self._hold()

    def list(self, path: str, terms: RetryTerms | None = None) -> Iterator[ObjectInfo]:
        self.calls[f"list {path}"] += 1
        entries = list(self.inner.list(path, terms))  # asked of the store now
        self._hold()
        return iter(entries)

    def list_tree(self, path: str, limit: int, terms: RetryTerms | None = None) -> TreePage:
        self.calls[f"tree {path}"] += 1
        page = self.inner.list_tree(path, limit, terms)
        self._hold()
        return page


def counted_tree_vfs(moto, s3, bucket: str, keys: list[str]) -> tuple[Any, CountingTrees]:
    for key in keys:
        s3.put_object(Bucket=bucket, Key=key, Body=b"data")
    lister = tree_lister(
        open_backend(SourceConfig(url=f"s3://{bucket}", endpoint_url=moto.endpoint_url))
    )
    assert lister is not None
    backend = CountingTrees(lister)
    return make_vfs(backend), backend


SMALL_TREE = ["a/b/c/file", "a/b/other", "z/y/x/file", "z/y/x/more", "z/y/w"]


async def walk_below_a(vfs: Any, a: TableInode) -> None:
    """The lookups down SMALL_TREE's `a/b/c/file` from `a`'s inode, and `ls a/b`."""
    b = await vfs.lookup(a.ino, "b")
    c = await vfs.lookup(b.ino, "c")
    assert (await vfs.lookup(c.ino, "file")).info.size == 4
    assert [name for name, _ in await list_all(vfs, b.ino)] == ["c", "other"]


def test_a_tree_that_fits_a_page_is_listed_whole_when_the_mount_starts(
    moto, s3, bucket: str
) -> None:
    """Where the store lists a tree (S3), the mount asks one page of everything under its root
    as it starts: when that is all of it, no lookup or `ls` asks the store again."""
    vfs, backend = counted_tree_vfs(moto, s3, bucket, SMALL_TREE)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            vfs.attach(nursery)
            await vfs.namespace.wait_for_listings()
            assert backend.calls == {"tree ": 1}
            await walk_below_a(vfs, await vfs.lookup(ROOT_INODE, "a"))
            assert [name for name, _ in await list_all(vfs, ROOT_INODE)] == ["a", "z"]
            with pytest.raises(NotFound):
                await vfs.lookup(ROOT_INODE, "absent")
            assert backend.calls == {"tree ": 1}
            nursery.cancel_scope.cancel()

    run(main)


def test_a_cold_path_in_a_small_tree_is_resolved_with_one_round_of_listings(
    moto, s3, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the store lists a tree (S3), what lies under a looked-up name is listed at every
    depth beside the first listings: the lookups down `a/b/c/file` and `ls a/b` ask nothing
    more. A tree larger than a page is listed as before, a directory at a time."""
    vfs, backend = counted_tree_vfs(moto, s3, bucket, SMALL_TREE)
    # A page of three keys: the mount's page of the whole tree (five) is given up; a's (two)
    # holds all of a.
    monkeypatch.setattr(namespace, "TREE_PAGE", 3)
    first_round = {"tree ": 1, "list ": 1, "list a": 1, "tree a": 1}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            vfs.attach(nursery)
            await vfs.namespace.wait_for_listings()
            assert backend.calls == {"tree ": 1}
            a = await vfs.lookup(ROOT_INODE, "a")
            await vfs.namespace.wait_for_listings()
            assert backend.calls == first_round
            await walk_below_a(vfs, a)
            assert backend.calls == first_round
            # A page of two keys cannot hold the tree under z/y (the first directory listed
            # from a lookup, the root's listing being known): its directories are listed one
            # by one.
            monkeypatch.setattr(namespace, "TREE_PAGE", 2)
            z = await vfs.lookup(ROOT_INODE, "z")
            y = await vfs.lookup(z.ino, "y")
            x = await vfs.lookup(y.ino, "x")
            assert (await vfs.lookup(x.ino, "file")).info.size == 4
            await vfs.namespace.wait_for_listings()
            below_z = {"list z": 1, "list z/y": 1, "tree z/y": 1, "list z/y/x": 1}
            below_z |= {"list z/y/x/file": 1, "tree z/y/x/file": 1}  # nothing: it is a file
            assert backend.calls == {**first_round, **below_z}
            nursery.cancel_scope.cancel()

    run(main)
