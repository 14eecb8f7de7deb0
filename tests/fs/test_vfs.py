"""The VFS without a kernel: caches, inode numbers, lookup counts, streaming readdir, reads.

The store is the real local backend, wrapped to count the calls that reach it.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio

from pffs.backends import open_backend
from pffs.backends.base import Capabilities, ObjectInfo
from pffs.config import SourceConfig
from pffs.errors import (
    Changed,
    IsADirectory,
    NotADirectory,
    NotFound,
    PffsError,
    ReadOnly,
    Unsupported,
)
from pffs.fs.inodes import ROOT_INODE, Inode
from pffs.fs.special import HIDDEN_DIR, PRELOAD_FILE, STATS_FILE
from pffs.fs.vfs import Vfs
from pffs.retry import RetryTerms
from tests.fs.helpers import LONG_TTLS, make_vfs

T = TypeVar("T")


class CountingBackend:
    """The local backend, counting calls by name (a real store; only the counting is added)."""

    def __init__(self, root: Path) -> None:
        self.inner = open_backend(SourceConfig(url=f"file://{root}"))
        self.source_id = self.inner.source_id
        self.principal = self.inner.principal
        self.principal_key: bytes | None = None
        self.max_concurrency = 4
        self.capabilities = Capabilities()  # reads only
        self.retries = 0
        self.calls: Counter[str] = Counter()
        self.listed: list[str] = []  # the paths of `list` calls, in order

    def check(self) -> None:
        self.inner.check()

    def probe(self) -> None:
        self.inner.probe()

    def stat(self, path: str, terms: RetryTerms | None = None) -> ObjectInfo:
        self.calls["stat"] += 1
        return self.inner.stat(path, terms)

    def list(self, path: str, terms: RetryTerms | None = None) -> Iterator[ObjectInfo]:
        self.calls["list"] += 1
        self.listed.append(path)
        return self.inner.list(path, terms)

    def read_range(
        self,
        path: str,
        start: int,
        length: int,
        version: str | None,
        terms: RetryTerms | None = None,
    ) -> bytes:
        self.calls["read"] += 1
        return self.inner.read_range(path, start, length, version, terms)


def run(fn: Callable[[], Awaitable[T]]) -> T:
    return trio.run(fn)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "dir" / "sub").mkdir(parents=True)
    (root / "a.txt").write_bytes(b"hello")
    (root / "dir" / "b.bin").write_bytes(bytes(range(256)) * 100)
    (root / "dir" / "sub" / "c").write_bytes(b"c")
    return root


def counted_vfs(root: Path, read_only: bool = False, **meta: Any) -> tuple[Vfs, CountingBackend]:
    """A Vfs over `root` (TTLs of a minute unless `meta` says otherwise), and its counting store."""
    backend = CountingBackend(root)
    ttls = dataclasses.replace(LONG_TTLS, **meta)
    return make_vfs(backend, meta=ttls, read_only=read_only), backend


async def list_all(vfs: Vfs, ino: int, batch: int = 10_000) -> list[tuple[str, Inode]]:
    """readdir the way the kernel does: in batches, resuming at the offset it was given."""
    fh = await vfs.opendir(ino)
    seen: list[tuple[str, Inode]] = []
    position = 0
    while True:
        got: list[tuple[str, Inode, int]] = []

        def emit(name: str, inode: Inode, next_id: int, got: list[Any] = got) -> bool:
            if len(got) >= batch:
                return False
            got.append((name, inode, next_id))
            return True

        await vfs.readdir(fh, position, emit)
        if not got:
            break
        seen += [(name, inode) for name, inode, _ in got]
        position = got[-1][2]
    vfs.releasedir(fh)
    return seen


def test_lookup_caches_attributes_and_misses(tree: Path) -> None:
    vfs, backend = counted_vfs(tree)

    async def main() -> None:
        a1 = await vfs.lookup(ROOT_INODE, "a.txt")
        a2 = await vfs.lookup(ROOT_INODE, "a.txt")
        assert a1.ino == a2.ino and a1.lookups == 2 and a1.info.size == 5
        assert backend.calls["stat"] == 1
        for _ in range(3):
            with pytest.raises(NotFound):
                await vfs.lookup(ROOT_INODE, "missing")
        assert backend.calls["stat"] == 2  # the miss was remembered

    run(main)


def test_expired_attributes_are_asked_again(tree: Path) -> None:
    vfs, backend = counted_vfs(tree, attr_ttl=0.0, negative_ttl=0.0)

    async def main() -> None:
        await vfs.lookup(ROOT_INODE, "a.txt")
        await vfs.lookup(ROOT_INODE, "a.txt")
        assert backend.calls["stat"] == 2
        with pytest.raises(NotFound):
            await vfs.lookup(ROOT_INODE, "new")
        (tree / "new").write_bytes(b"now it exists")
        assert (await vfs.lookup(ROOT_INODE, "new")).info.size == 13

    run(main)


def test_fresh_listing_answers_lookups(tree: Path) -> None:
    vfs, backend = counted_vfs(tree)

    async def main() -> None:
        dir_inode = await vfs.lookup(ROOT_INODE, "dir")
        names = [name for name, _ in await list_all(vfs, dir_inode.ino)]
        assert names == ["b.bin", "sub"]
        stats = backend.calls["stat"]
        assert (await vfs.lookup(dir_inode.ino, "b.bin")).info.size == 25600
        with pytest.raises(NotFound):
            await vfs.lookup(dir_inode.ino, "nope")
        assert backend.calls["stat"] == stats  # both answered by the listing
        await list_all(vfs, dir_inode.ino)
        assert backend.calls["list"] == 1  # the listing itself was reused

    run(main)


def test_inode_numbers_are_stable_across_forget(tree: Path) -> None:
    vfs, _ = counted_vfs(tree)

    async def main() -> None:
        table = vfs.namespace.inodes
        directory = await vfs.lookup(ROOT_INODE, "dir")
        records = len(table)
        sub = await vfs.lookup(directory.ino, "sub")
        first = sub.ino
        vfs.forget(first, 1)
        assert not table.live(first)  # freed once the kernel has no reference
        assert table.ino_of("dir/sub") is None and len(table) == records  # nothing of it kept
        again = await vfs.lookup(directory.ino, "sub")
        assert again.ino == first  # the number comes from the path

    run(main)


def test_inode_numbers_are_the_same_after_a_remount(tree: Path) -> None:
    """Two mounts of one tree, each walked in its own order, number every path alike (a
    remount: the numbers are the paths' digests, whatever slot each record landed in)."""

    async def numbers(vfs: Vfs, reverse: bool) -> dict[str, int]:
        found: dict[str, int] = {}
        pending = [ROOT_INODE]
        while pending:
            entries = await list_all(vfs, pending.pop())
            for _name, inode in sorted(entries, key=lambda entry: entry[0], reverse=reverse):
                found[inode.path] = inode.ino
                if inode.is_dir:
                    pending.append(inode.ino)
        return found

    first = trio.run(numbers, counted_vfs(tree)[0], False)
    assert trio.run(numbers, counted_vfs(tree)[0], True) == first and len(first) == 5


def test_a_path_deleted_while_the_kernel_holds_it_comes_back_with_a_new_number(
    tree: Path,
) -> None:
    vfs, _ = counted_vfs(tree, negative_ttl=0.0)

    async def main() -> None:
        held = await vfs.lookup(ROOT_INODE, "a.txt")
        vfs.namespace.gone("a.txt")  # deleted through the mount, then made again at the source
        again = await vfs.lookup(ROOT_INODE, "a.txt")
        assert again.ino != held.ino and vfs.namespace.inodes.live(held.ino)
        vfs.forget(held.ino, 1)
        assert (await vfs.getattr(again.ino)).path == "a.txt"

    run(main)


def test_readdir_counts_references_and_resumes(tmp_path: Path) -> None:
    root = tmp_path / "wide"
    root.mkdir()
    names = [f"f{i:05d}" for i in range(2500)]  # more than one LIST_CHUNK
    for name in names:
        (root / name).write_bytes(b"x")
    vfs, backend = counted_vfs(root)

    async def main() -> None:
        listed = await list_all(vfs, ROOT_INODE, batch=97)
        assert [name for name, _ in listed] == names
        assert all(inode.lookups == 1 for _, inode in listed)
        assert len({inode.ino for _, inode in listed}) == len(names)
        assert backend.calls["list"] == 1

    run(main)


def test_directory_checks(tree: Path) -> None:
    vfs, _ = counted_vfs(tree)

    async def main() -> None:
        a = await vfs.lookup(ROOT_INODE, "a.txt")
        with pytest.raises(NotADirectory):
            await vfs.lookup(a.ino, "x")
        with pytest.raises(NotADirectory):
            await vfs.opendir(a.ino)
        d = await vfs.lookup(ROOT_INODE, "dir")
        with pytest.raises(IsADirectory):
            await vfs.open(d.ino, os.O_RDONLY)
        assert (await vfs.lookup(d.ino, "..")).ino == ROOT_INODE

    run(main)


def test_reads_any_offset_and_size(tree: Path) -> None:
    vfs, _ = counted_vfs(tree)
    data = (tree / "dir" / "b.bin").read_bytes()

    async def main() -> None:
        b = await vfs.lookup((await vfs.lookup(ROOT_INODE, "dir")).ino, "b.bin")
        fh, _ = await vfs.open(b.ino, os.O_RDONLY)
        for offset, size in [
            (0, 10),
            (100, 4096),
            (25590, 100),
            (25600, 10),
            (30000, 5),
            (0, 10**6),
        ]:
            assert await vfs.read(fh, offset, size) == data[offset : offset + size]
        await vfs.release(fh)

    run(main)


def test_keep_cache_only_for_an_unchanged_object(tree: Path) -> None:
    vfs, _ = counted_vfs(tree, attr_ttl=0.0)

    async def main() -> None:
        a = await vfs.lookup(ROOT_INODE, "a.txt")
        fh1, keep1 = await vfs.open(a.ino, os.O_RDONLY)
        fh2, keep2 = await vfs.open(a.ino, os.O_RDONLY)
        assert (keep1, keep2) == (False, True)
        (tree / "a.txt").write_bytes(b"changed content")
        fh3, keep3 = await vfs.open(a.ino, os.O_RDONLY)
        assert keep3 is False
        assert await vfs.read(fh3, 0, 100) == b"changed content"
        # The handle opened before the change never mixes versions: it gets ESTALE.
        with pytest.raises(Changed):
            await vfs.read(fh1, 0, 100)
        for fh in (fh1, fh2, fh3):
            await vfs.release(fh)

    run(main)


def test_writes_are_refused_clearly(tree: Path) -> None:
    async def main() -> None:
        for read_only, error in ((True, ReadOnly), (False, Unsupported)):
            vfs, _ = counted_vfs(tree, read_only=read_only)
            a = await vfs.lookup(ROOT_INODE, "a.txt")
            with pytest.raises(error):
                await vfs.open(a.ino, os.O_WRONLY)

    run(main)


def test_listing_outlives_the_kernel_forgetting_the_directory(tree: Path) -> None:
    vfs, backend = counted_vfs(tree)

    async def main() -> None:
        await list_all(vfs, ROOT_INODE)
        d = await vfs.lookup(ROOT_INODE, "dir")
        await list_all(vfs, d.ino)
        for ino in [i for i in vfs.namespace.inodes.numbers() if i != ROOT_INODE]:
            vfs.forget(ino, 10)  # as after drop_caches: the kernel lets go of everything
        stats = backend.calls["stat"]
        d = await vfs.lookup(ROOT_INODE, "dir")
        assert (await vfs.lookup(d.ino, "b.bin")).info.size == 25600
        assert backend.calls["stat"] == stats  # answered by the listings, root's and dir's
        assert backend.calls["list"] == 2

    run(main)


def test_hidden_files_open_handles_like_any_other(tree: Path) -> None:
    """`.pffs` handles are numbered and kept with the others: one table, one release."""
    vfs, _ = counted_vfs(tree)

    async def main() -> None:
        hidden = (await vfs.lookup(ROOT_INODE, HIDDEN_DIR)).ino
        stats = (await vfs.lookup(hidden, STATS_FILE)).ino
        preload = (await vfs.lookup(hidden, PRELOAD_FILE)).ino
        file_fh, _ = await vfs.open((await vfs.lookup(ROOT_INODE, "a.txt")).ino, os.O_RDONLY)
        stats_fh, keep = await vfs.open(stats, os.O_RDONLY)
        order_fh, _ = await vfs.open(preload, os.O_WRONLY)
        dir_fh = await vfs.opendir(hidden)
        assert len({file_fh, stats_fh, order_fh, dir_fh}) == 4 and not keep
        assert [vfs.direct_io(fh) for fh in (file_fh, stats_fh, order_fh, dir_fh)] == [
            False,
            True,
            True,
            False,
        ]
        assert b'"pffs_' in bytes(await vfs.read(stats_fh, 0, 1 << 20))
        with pytest.raises(NotFound):
            await vfs.read(dir_fh, 0, 1)  # a directory's handle is no file's
        with pytest.raises(PffsError, match="not open for writing"):
            await vfs.write(stats_fh, 0, b"x")
        for fh in (file_fh, stats_fh, order_fh):
            await vfs.release(fh)
        vfs.releasedir(dir_fh)
        for fh in (file_fh, stats_fh, order_fh, dir_fh):
            assert vfs.handles.get(fh) is None
            with pytest.raises(NotFound):
                await vfs.read(fh, 0, 1)
        assert vfs.special.slots.taken == 0  # the order list's slot came back

    run(main)


def test_files_being_written_are_the_writers_alone(tree: Path) -> None:
    """The namespace reads the registry of files being written; it cannot change it."""
    vfs, _ = counted_vfs(tree)
    with pytest.raises(TypeError):
        vfs.namespace.staged[1] = None  # type: ignore[index]
