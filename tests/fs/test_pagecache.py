"""Pushing cached bytes into the kernel's page cache around random reads (pffs.fs.pagecache),
without a kernel: the kernel's notify_store is replaced by a recorder of what it was handed.
The real-mount check is in tests/mount/test_page_cache_pushes.py."""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from pffs.fs.inodes import ROOT_INODE
from pffs.fs.pagecache import CHUNK, QUEUE_LIMIT
from pffs.fs.vfs import Vfs
from tests.cache.configs import cache_config
from tests.fs.test_reads_through_cache import FakeStore, cached_vfs

MIB = 1 << 20


class KernelPages:
    """What notify_store was handed, in order, and which inodes were invalidated; `gate` (when
    set) holds every store until opened, as a kernel page locked by a read in progress would."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.pushes: list[tuple[int, int, bytes]] = []
        self.gate = gate
        self.storing = threading.Event()  # set once a store has started
        # Set when a store gave up on the gate: something waited for the store it held.
        self.outwaited = threading.Event()
        # ("store", ino) and ("invalidate", ino), in the order the kernel saw them
        self.calls: list[tuple[str, int]] = []

    def store(self, ino: int, offset: int, data: bytes | memoryview) -> None:
        self.storing.set()
        if self.gate is not None and not self.gate.wait(10):  # the bound only ends a hang
            self.outwaited.set()
            raise AssertionError("the test never opened the gate")
        self.pushes.append((ino, offset, bytes(data)))
        self.calls.append(("store", ino))

    def invalidate(self, ino: int) -> None:
        self.calls.append(("invalidate", ino))

    async def wait_storing(self) -> None:
        """Until the pusher is inside a store (held there by the gate)."""
        with trio.fail_after(10):
            while not self.storing.is_set():
                await trio.sleep(0.005)


async def settled(vfs: Vfs, expected: int) -> None:
    """Wait until the pusher has stored or skipped `expected` windows (its thread runs alone)."""
    stats = vfs.cache.stats
    with trio.fail_after(10):
        while stats.page_pushes + stats.page_push_skipped < expected:
            await trio.sleep(0.005)


def one_mib_blocks(tmp_path: Path | None, memory_blocks: int = 64) -> Vfs:
    return cached_vfs(STORE, cache_config(tmp_path, block=MIB, memory_bytes=memory_blocks * MIB))


DATA = random.Random(18).randbytes(32 * MIB + 1000)
STORE = FakeStore({"f": DATA})
# Far apart, so the reader's readahead sees random reads (never a sequential run).
RANDOM_OFFSETS = [20 * MIB + 4096 * 7, 5 * MIB + 12345, 28 * MIB, 1 * MIB + 3, 12 * MIB, 32 * MIB]


async def warm(vfs: Vfs, name: str = "f") -> None:
    """Read a file whole (a sequential reader, which pushes nothing), so the cache holds it:
    only cached bytes are ever pushed."""
    inode = await vfs.lookup(ROOT_INODE, name)
    fh, _ = await vfs.open(inode.ino, os.O_RDONLY)
    offset = 0
    while await vfs.read(fh, offset, MIB):
        offset += MIB
    await vfs.release(fh)
    await vfs.drain()


async def open_file(vfs: Vfs, name: str = "f") -> tuple[int, int]:
    """(inode number, handle) of a file opened for reading."""
    inode = await vfs.lookup(ROOT_INODE, name)
    fh, _ = await vfs.open(inode.ino, os.O_RDONLY)
    return inode.ino, fh


def run_pushing(
    vfs: Vfs,
    kernel: KernelPages | None,
    body: Callable[[], Awaitable[None]],
    warmed: str | None = None,
) -> None:
    """Run `body` with `vfs` attached to a nursery, the file `warmed` read whole first (so the
    cache holds it), and pushes into `kernel` on; pushing stops after it, as at an unmount."""

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            vfs.attach(nursery)
            if warmed is not None:
                await warm(vfs, warmed)
            if kernel is not None:
                vfs.push_pages(kernel)
            await body()
            vfs.push_pages(None)
            nursery.cancel_scope.cancel()

    trio.run(main)


@pytest.fixture
def vfs() -> Vfs:
    """1 MiB blocks over STORE, in memory only."""
    return one_mib_blocks(None)


@pytest.fixture
def kernel() -> KernelPages:
    return KernelPages()


@pytest.fixture
def gate() -> threading.Event:
    """Opened by a test to let stores through (see KernelPages)."""
    return threading.Event()


@pytest.fixture
def held_kernel(gate: threading.Event) -> KernelPages:
    """A kernel whose every store waits for `gate`."""
    return KernelPages(gate)


@dataclass
class Replaced:
    """An 8 MiB file "g" whose object a test replaces by `new` (in memory, 1 MiB blocks)."""

    vfs: Vfs
    store: FakeStore
    data: bytes
    new: bytes = b""

    def __post_init__(self) -> None:
        self.new = bytes(reversed(self.data))

    def replace(self) -> None:
        self.store.overwrite("g", self.new)


@pytest.fixture
def replaced() -> Replaced:
    data = random.Random(5).randbytes(8 * MIB)
    store = FakeStore({"g": data})
    vfs = cached_vfs(store, cache_config(None, block=MIB, memory_bytes=64 * MIB))
    return Replaced(vfs, store, data)


def test_random_reads_push_the_cached_bytes_around_them_in_growing_windows(
    vfs: Vfs, kernel: KernelPages
) -> None:
    opened: list[int] = []

    async def body() -> None:
        ino, fh = await open_file(vfs)
        opened.append(ino)
        for offset in RANDOM_OFFSETS:
            assert await vfs.read(fh, offset, 4096) == DATA[offset : offset + 4096]
            await settled(vfs, len(kernel.pushes) + 1)
        await vfs.release(fh)

    run_pushing(vfs, kernel, body, warmed="f")
    sizes = [len(data) for _, _, data in kernel.pushes]
    # 64 KiB, then doubling with each read that reached pffs, up to 1 MiB; the last window is
    # cut at the end of the file.
    assert sizes == [CHUNK, 2 * CHUNK, 4 * CHUNK, 8 * CHUNK, MIB, len(DATA) - 32 * MIB]
    for (pushed_ino, offset, data), read_at in zip(kernel.pushes, RANDOM_OFFSETS, strict=True):
        assert pushed_ino == opened[0]
        assert offset % len(data) == 0 or offset + len(data) == len(DATA)
        assert offset <= read_at < offset + len(data)  # around the read
        assert data == DATA[offset : offset + len(data)]  # the version's bytes, exactly


def test_large_random_reads_push_nothing(vfs: Vfs, kernel: KernelPages) -> None:
    """A page fault's read-around reaches pffs as READs of 1 MiB, as large as the window: the
    kernel brought that neighbourhood itself, so nothing is pushed around them (a push copied
    mostly the READ's own bytes into its pages a second time); a small random read after them
    still pushes its window."""
    offsets = [20 * MIB + 12 * 1024, 5 * MIB + 200 * 1024, 27 * MIB + 4096, 12 * MIB]
    small = 1 * MIB + 3

    async def body() -> None:
        _, fh = await open_file(vfs)
        for offset in offsets:
            assert await vfs.read(fh, offset, MIB) == DATA[offset : offset + MIB]
        assert await vfs.read(fh, small, 4096) == DATA[small : small + 4096]
        await settled(vfs, 1)
        await trio.sleep(0.05)  # nothing more happens: a slow machine only weakens the check
        await vfs.release(fh)

    run_pushing(vfs, kernel, body, warmed="f")
    [(_, pushed_at, data)] = kernel.pushes  # the small read's window only
    assert pushed_at <= small < pushed_at + len(data)
    assert data == DATA[pushed_at : pushed_at + len(data)]


def test_pushes_from_the_disk_tier_carry_verified_bytes(
    tmp_path: Path, kernel: KernelPages
) -> None:
    """A remount's reads come from the disk tier (memory holds two blocks): so do the pushes."""
    first = one_mib_blocks(tmp_path)

    async def fill() -> None:
        _, fh = await open_file(first)
        for offset in range(0, len(DATA), MIB):
            await first.read(fh, offset, MIB)
        await first.release(fh)
        await first.drain()

    run_pushing(first, None, fill)
    first.cache.close()
    remounted = one_mib_blocks(tmp_path, memory_blocks=2)
    reads_before = STORE.reads

    async def body() -> None:
        _, fh = await open_file(remounted)
        for offset in RANDOM_OFFSETS[:4]:
            assert await remounted.read(fh, offset, 4096) == DATA[offset : offset + 4096]
            await settled(remounted, len(kernel.pushes) + 1)
        await remounted.release(fh)

    run_pushing(remounted, kernel, body)
    remounted.cache.close()
    assert STORE.reads == reads_before  # nothing from the store
    assert remounted.cache.stats.memory_hits == 0
    assert len(kernel.pushes) == 4
    for _, offset, data in kernel.pushes:
        assert data == DATA[offset : offset + len(data)]


def test_sequential_reads_push_nothing(vfs: Vfs, kernel: KernelPages) -> None:
    """The kernel's readahead already asks for what comes next: pushing would copy twice."""

    async def body() -> None:
        _, fh = await open_file(vfs)
        for offset in range(0, 8 * MIB, 128 * 1024):
            assert await vfs.read(fh, offset, 128 * 1024) == DATA[offset : offset + 128 * 1024]
        await trio.sleep(0.05)
        await vfs.release(fh)

    run_pushing(vfs, kernel, body)
    # The first read, at offset 0, starts a sequential run: not one window was pushed.
    assert kernel.pushes == []
    assert vfs.cache.stats.page_pushes == 0


def test_a_handle_of_a_replaced_version_never_pushes_after_the_new_open(
    replaced: Replaced, kernel: KernelPages
) -> None:
    vfs, data, new = replaced.vfs, replaced.data, replaced.new

    async def body() -> None:
        ino, old_fh = await open_file(vfs, "g")
        await vfs.read(old_fh, 5 * MIB, 4096)
        await settled(vfs, 1)
        replaced.replace()
        new_fh, keep_cache = await vfs.open(ino, os.O_RDONLY)
        assert not keep_cache  # the kernel drops the old version's pages
        pushed = len(kernel.pushes)
        # The old handle still reads its own version (from the cache), but pushes no more:
        # the kernel now keeps the new version's pages only.
        assert await vfs.read(old_fh, 1 * MIB, 4096) == data[MIB : MIB + 4096]
        await trio.sleep(0.05)
        assert len(kernel.pushes) == pushed
        # The new version's block is not cached yet: its first read loads it, the second
        # (its bytes now cached) pushes.
        for offset in (3 * MIB, 3 * MIB + MIB // 2):
            assert await vfs.read(new_fh, offset, 4096) == new[offset : offset + 4096]
            await vfs.drain()
        await settled(vfs, pushed + 1)
        await vfs.release(old_fh)
        await vfs.release(new_fh)

    run_pushing(vfs, kernel, body, warmed="g")
    first, *rest = kernel.pushes
    assert first[2] == data[first[1] : first[1] + len(first[2])]
    assert rest and all(pushed == new[o : o + len(pushed)] for _, o, pushed in rest)


def test_an_open_of_a_new_version_waits_for_a_push_under_way(
    replaced: Replaced, held_kernel: KernelPages, gate: threading.Event
) -> None:
    """A push that checked the old version is still storing: the open must not reply (and
    the kernel must not drop the old pages) before it is done, or old pages would stay."""
    vfs = replaced.vfs
    opened = trio.Event()

    async def body() -> None:
        ino, fh = await open_file(vfs, "g")
        await vfs.read(fh, 5 * MIB, 4096)
        await held_kernel.wait_storing()
        replaced.replace()

        async def open_new() -> None:
            new_fh, _ = await vfs.open(ino, os.O_RDONLY)
            opened.set()
            await vfs.release(new_fh)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(open_new)
            await trio.sleep(0.2)
            assert not opened.is_set()  # held behind the push of the old version
            gate.set()
            with trio.fail_after(5):
                await opened.wait()
        await vfs.release(fh)

    run_pushing(vfs, held_kernel, body, warmed="g")
    assert len(held_kernel.pushes) == 1


def test_an_open_answers_once_a_held_push_outlasts_the_bound_and_its_pages_are_dropped(
    replaced: Replaced, held_kernel: KernelPages, gate: threading.Event
) -> None:
    """A push of the old version held in the store (a page locked by a read nobody answers):
    the open answers after `settle_timeout`, and once the push ends the inode's pages are
    invalidated, so the kernel keeps none of the old version."""
    vfs = replaced.vfs
    vfs.pages.pusher.settle_timeout = 0.2

    async def body() -> None:
        ino, fh = await open_file(vfs, "g")
        await vfs.read(fh, 5 * MIB, 4096)
        await held_kernel.wait_storing()
        replaced.replace()
        with trio.fail_after(5):
            new_fh, keep_cache = await vfs.open(ino, os.O_RDONLY)
        assert not keep_cache
        # answered with the push still held
        assert not gate.is_set() and held_kernel.calls == []
        gate.set()
        with trio.fail_after(5):
            while len(held_kernel.calls) < 2:
                await trio.sleep(0.005)
        assert held_kernel.calls == [("store", ino), ("invalidate", ino)]
        await vfs.release(new_fh)
        await vfs.release(fh)

    run_pushing(vfs, held_kernel, body, warmed="g")


def test_a_full_queue_drops_pushes_and_never_holds_a_read(
    vfs: Vfs, held_kernel: KernelPages, gate: threading.Event
) -> None:
    reads = QUEUE_LIMIT + 6
    offsets = [(i * 7 % 31) * MIB + 4096 for i in range(1, reads + 1)]

    async def body() -> None:
        _, fh = await open_file(vfs)
        for offset in offsets:
            assert await vfs.read(fh, offset, 4096) == DATA[offset : offset + 4096]
        # Every read answered with the gate still shut: none waited for the held store.
        assert not held_kernel.outwaited.is_set()
        await vfs.release(fh)
        gate.set()

    run_pushing(vfs, held_kernel, body, warmed="f")
    stats = vfs.cache.stats
    assert stats.page_push_dropped >= reads - QUEUE_LIMIT - 1  # one is in the store, 8 queued
    for _, offset, data in held_kernel.pushes:
        assert data == DATA[offset : offset + len(data)]


def test_nothing_is_pushed_once_pushing_stopped(vfs: Vfs, kernel: KernelPages) -> None:
    async def body() -> None:
        vfs.push_pages(None)  # as at unmount: the kernel session is about to close
        _, fh = await open_file(vfs)
        for offset in RANDOM_OFFSETS:
            await vfs.read(fh, offset, 4096)
        await trio.sleep(0.05)
        await vfs.release(fh)

    run_pushing(vfs, kernel, body)
    assert kernel.pushes == []


def test_a_window_is_pushed_once_while_queued_and_again_once_the_kernel_lost_it(
    vfs: Vfs, held_kernel: KernelPages, gate: threading.Event
) -> None:
    """Reads landing in a window before it is stored do not queue it twice; a read in a window
    already stored means the kernel evicted it (memory pressure, drop_caches): pushed again."""
    vfs.pages.pusher.max_window = CHUNK  # every window the same 64 KiB one
    at = 20 * MIB

    async def body() -> None:
        _, fh = await open_file(vfs)
        await vfs.read(fh, at + 8192, 4096)  # queued, held in the store by the gate
        await vfs.read(fh, at + 4096, 4096)  # lands in it before it is stored
        # Far away (so the reader's readahead still sees random reads): another window.
        await vfs.read(fh, 5 * MIB, 4096)
        gate.set()
        await settled(vfs, 2)
        await trio.sleep(0.05)
        assert len(held_kernel.pushes) == 2
        await vfs.read(fh, at + 12288, 4096)  # it was stored: the kernel must have lost it
        await settled(vfs, 3)
        await vfs.release(fh)

    run_pushing(vfs, held_kernel, body, warmed="f")
    windows = [(offset, len(data)) for _, offset, data in held_kernel.pushes]
    assert windows == [(at, CHUNK), (5 * MIB, CHUNK), (at, CHUNK)]
