"""The disk tier's batched reads: DiskTier.get_many and DiskIO's read batches.

A batch looks its keys up in one SELECT, opens the entries not open yet ahead of reading them,
and reads each whole in one call; DiskIO gathers the whole-block reads of many tasks into one
worker-thread hop. What must hold whatever the batch: every caller gets its own block's bytes
or a miss, never another's or damaged bytes; an entry damaged, deleted or replaced in the
directory (by this process or another) is a miss or its new copy; no descriptor is left open
that the tier does not hold; a cancelled reader leaves the others served.
"""

from __future__ import annotations

import os
import random
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import trio
import trio.testing

from pffs.cache.blocks import Background
from pffs.cache.disk import DiskTier, entry_key
from pffs.cache.diskio import DiskIO
from pffs.cache.entries import ALIGN, CHUNK
from pffs.cache.keys import BlockKey
from pffs.cache.stats import CacheStats
from tests.cache.configs import KIB

SMALL = 100 * KIB  # a training file's block: two chunks, the second short
BLOCK = 4096 * KIB  # the cache's block size (a key's identity)


def _key(index: int) -> str:
    return entry_key(BlockKey("src", "u", f"file{index}", "v1", 0), BLOCK)


def _block(index: int, size: int = SMALL) -> bytes:
    return random.Random(index).randbytes(size)


def _tier(directory: Path) -> DiskTier:
    return DiskTier(str(directory), capacity=1 << 30, free_ratio=0.0, compress=False)


def _filled(directory: Path, count: int) -> DiskTier:
    tier = _tier(directory)
    stored = tier.put_batch([(_key(n), _block(n), "src") for n in range(count)])
    assert all(stored)
    return tier


def _entry_path(directory: Path, key: str) -> Path:
    uri = f"{(directory / 'cache.db').absolute().as_uri()}?mode=ro"
    with sqlite3.connect(uri, uri=True) as connection:
        ((filename,),) = connection.execute(
            "SELECT filename FROM Cache WHERE key = ?", (key,)
        ).fetchall()
    return directory / str(filename)


def _open_cache_files(directory: Path) -> set[str]:
    targets = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(directory)) and ".val" in target:
            targets.add(target)
    return targets


# --- DiskTier.get_many ---------------------------------------------------------------------


def test_a_batch_gives_each_key_its_own_block_or_a_miss(tmp_path: Path) -> None:
    tier = _filled(tmp_path, 6)
    assert tier.get(_key(2)).data == _block(2)  # held open before the batch
    keys = [_key(4), _key(99), _key(2), _key(0), _key(4), _key(5)]
    found = tier.get_many(keys)
    assert [read.data for read in found] == [
        _block(4),
        None,
        _block(2),
        _block(0),
        _block(4),
        _block(5),
    ]
    assert not any(read.corrupt for read in found)
    assert all(read.whole for read in found if read.data is not None)
    # What the batch opened is held (a later random read needs no lookup), nothing else.
    assert len(tier.open_entries) == 4
    assert len(_open_cache_files(tmp_path)) == 4
    tier.close()
    assert _open_cache_files(tmp_path) == set()


def test_a_batch_asks_the_index_once_and_not_for_entries_held_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = _filled(tmp_path, 8)
    assert tier.get(_key(7)).data == _block(7)
    asked: list[list[str]] = []
    lookup = tier.index.lookup

    def counting(keys: list[str]) -> dict[str, tuple[str, int]]:
        asked.append(sorted(keys))
        return lookup(keys)

    monkeypatch.setattr(tier.index, "lookup", counting)
    found = tier.get_many([_key(n) for n in range(8)])
    assert [read.data for read in found] == [_block(n) for n in range(8)]
    assert asked == [sorted(_key(n) for n in range(7))]
    tier.close()


@pytest.mark.parametrize("damage", ["truncated", "payload bit", "header bit", "another key"])
def test_a_damaged_entry_in_a_batch_is_a_miss_and_dropped(tmp_path: Path, damage: str) -> None:
    tier = _filled(tmp_path, 3)
    path = _entry_path(tmp_path, _key(1))
    if damage == "truncated":  # a crash cut it short
        os.truncate(path, ALIGN + CHUNK)
    elif damage == "another key":  # a file of another key under this key's row
        path.write_bytes(_entry_path(tmp_path, _key(2)).read_bytes())
    else:
        offset = ALIGN + CHUNK + 5 if damage == "payload bit" else 14
        with open(path, "r+b") as f:
            f.seek(offset)
            flipped = f.read(1)[0] ^ 0x04
            f.seek(offset)
            f.write(bytes([flipped]))
    found = tier.get_many([_key(0), _key(1), _key(2)])
    assert [read.data for read in found] == [_block(0), None, _block(2)]
    assert found[1].corrupt
    assert _key(1) not in tier  # deleted: the next read fetches it again
    assert all(str(path) not in target for target in _open_cache_files(tmp_path))
    tier.close()


_OTHER_PROCESS = """
import sys
from pffs.cache.disk import DiskTier
tier = DiskTier(sys.argv[1], capacity=1 << 30, free_ratio=0.0, compress=False)
if sys.argv[2] == "delete":
    tier.delete(sys.argv[3])
else:  # replace: the key stored again, in a new file
    assert tier.put(sys.argv[3], sys.stdin.buffer.read(), "src")
tier.close()
"""


def _in_other_process(directory: Path, action: str, key: str, data: bytes = b"") -> None:
    argv = [sys.executable, "-c", _OTHER_PROCESS, str(directory), action, key]
    subprocess.run(argv, input=data, check=True)


def test_entries_another_process_deletes_or_replaces_are_never_served_stale(
    tmp_path: Path,
) -> None:
    """Held open from an earlier batch, one entry is deleted and one replaced by another mount
    sharing the directory: the next batch misses the first and reads the second's new file.
    (The replacement has other bytes here only to tell the files apart: a key names one
    version of a block.)"""
    tier = _filled(tmp_path, 3)
    assert [read.data for read in tier.get_many([_key(0), _key(1)])] == [_block(0), _block(1)]
    _in_other_process(tmp_path, "delete", _key(0))
    _in_other_process(tmp_path, "replace", _key(1), _block(11))
    found = tier.get_many([_key(0), _key(1), _key(2)])
    assert [read.data for read in found] == [None, _block(11), _block(2)]
    assert not found[0].corrupt  # gone, not damaged
    assert not any(target.endswith("(deleted)") for target in _open_cache_files(tmp_path))
    tier.close()


def test_an_entry_deleted_between_the_lookup_and_its_read_is_a_miss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = _filled(tmp_path, 3)
    lookup = tier.index.lookup

    def then_deleted(keys: list[str]) -> dict[str, tuple[str, int]]:
        rows = lookup(keys)
        _in_other_process(tmp_path, "delete", _key(1))  # after the SELECT, before the opens
        return rows

    monkeypatch.setattr(tier.index, "lookup", then_deleted)
    found = tier.get_many([_key(0), _key(1), _key(2)])
    assert [read.data for read in found] == [_block(0), None, _block(2)]
    tier.close()
    assert _open_cache_files(tmp_path) == set()


def test_a_failed_index_lookup_is_a_miss_for_the_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = _filled(tmp_path, 2)

    def locked(keys: list[str]) -> dict[str, tuple[str, int]]:
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(tier.index, "lookup", locked)
    assert [read.data for read in tier.get_many([_key(0), _key(1)])] == [None, None]
    tier.close()


def test_a_short_read_of_a_payload_is_finished_not_served_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pread may return less than asked (a signal, some file systems): the rest is read."""
    tier = _filled(tmp_path, 2)
    real_pread = os.pread

    def short_pread(fd: int, length: int, offset: int) -> bytes:
        return real_pread(fd, min(length, CHUNK // 2), offset)

    monkeypatch.setattr(os, "pread", short_pread)
    assert [read.data for read in tier.get_many([_key(0), _key(1)])] == [_block(0), _block(1)]
    tier.close()


def test_index_connections_do_not_pile_up_as_worker_threads_come_and_go(tmp_path: Path) -> None:
    """trio's worker threads end when idle and new ones start: a connection per thread would
    leave one open behind each; the pool holds as many as ran at once."""
    tier = _filled(tmp_path, 2)
    for _ in range(20):
        thread = threading.Thread(target=tier.get_many, args=([_key(0), _key(1)],))
        thread.start()
        thread.join()
    assert len(tier.index._connections) == 1
    tier.close()


# --- DiskIO's read batches -------------------------------------------------------------------


def _disk_io(tier: DiskTier) -> tuple[DiskIO, Background]:
    background = Background()
    return DiskIO(tier, BLOCK, 8, CacheStats(), background), background


def _block_key(index: int) -> BlockKey:
    return BlockKey("src", "u", f"file{index}", "v1", 0)


def _counting_batches(monkeypatch: pytest.MonkeyPatch, tier: DiskTier) -> list[int]:
    sizes: list[int] = []
    get_many = tier.get_many

    def counting(keys: list[str]) -> list[object]:
        sizes.append(len(keys))
        return get_many(keys)  # type: ignore[return-value]

    monkeypatch.setattr(tier, "get_many", counting)
    return sizes


def _read_at_once(
    disk: DiskIO, background: Background, indexes: range, size: int
) -> dict[int, bytes | None]:
    """Read those blocks whole, each in a task of its own, all started together."""
    got: dict[int, bytes | None] = {}

    async def read(index: int) -> None:
        got[index] = await disk.get(_block_key(index), size)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            background.attach(nursery)
            async with trio.open_nursery() as readers:
                for index in indexes:
                    readers.start_soon(read, index)
            nursery.cancel_scope.cancel()

    trio.run(main)
    return got


def test_small_blocks_read_together_share_worker_thread_hops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = _filled(tmp_path, 40)
    disk, background = _disk_io(tier)
    batches = _counting_batches(monkeypatch, tier)
    got = _read_at_once(disk, background, range(41), SMALL)  # the last one is not on disk
    assert got == {**{n: _block(n) for n in range(40)}, 40: None}
    assert sum(batches) == 41 and len(batches) <= 41 // 16 + 2
    assert disk.stats.disk_hits == 40 and disk.stats.disk_misses == 1
    tier.close()


def test_reads_arriving_during_a_hop_wait_for_it_and_go_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Less than a batch does not start a hop of its own beside a running one: the reads
    that trickle in meanwhile are taken together once it is back."""
    tier = _filled(tmp_path, 11)
    disk, background = _disk_io(tier)
    batches: list[int] = []
    first_hop_running, first_hop_may_end = threading.Event(), threading.Event()
    get_many = tier.get_many

    def held(keys: list[str]) -> list[object]:
        batches.append(len(keys))
        if len(batches) == 1:  # held until every other read has arrived, however slow the machine
            first_hop_running.set()
            first_hop_may_end.wait(30)
        return get_many(keys)  # type: ignore[return-value]

    monkeypatch.setattr(tier, "get_many", held)
    got: dict[int, bytes | None] = {}

    async def read(index: int) -> None:
        got[index] = await disk.get(_block_key(index), SMALL)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            background.attach(nursery)
            async with trio.open_nursery() as readers:
                readers.start_soon(read, 0)
                with trio.fail_after(30):
                    while not first_hop_running.is_set():
                        await trio.sleep(0.001)
                for index in range(1, 11):  # one at a time, while the first hop runs
                    readers.start_soon(read, index)
                    await trio.testing.wait_all_tasks_blocked()  # it has asked, and waits
                first_hop_may_end.set()
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert got == {n: _block(n) for n in range(11)}
    assert batches == [1, 10]
    tier.close()


def test_large_blocks_are_read_one_per_hop_several_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole 4 MiB block is a batch of its own, and the hops run side by side (a warm
    sequential read keeps several blocks in flight)."""
    tier = _tier(tmp_path)
    large = 2 * 1024 * KIB
    assert all(tier.put_batch([(_key(n), _block(n, large), "src") for n in range(4)]))
    disk, background = _disk_io(tier)
    batches = _counting_batches(monkeypatch, tier)
    running, most = 0, 0
    changed = threading.Condition()
    get_many = tier.get_many

    def overlapping(keys: list[str]) -> list[object]:
        nonlocal running, most
        with changed:
            running += 1
            most = max(most, running)
            changed.notify_all()
            # Each hop waits (30 s at most: a failing run) for a second to run beside it; were
            # the hops one at a time, none would come and `most` would stay 1.
            changed.wait_for(lambda: most >= 2, timeout=30)
        try:
            return get_many(keys)  # type: ignore[return-value]
        finally:
            with changed:
                running -= 1

    monkeypatch.setattr(tier, "get_many", overlapping)
    got = _read_at_once(disk, background, range(4), large)
    assert got == {n: _block(n, large) for n in range(4)}
    assert batches == [1, 1, 1, 1] and most >= 2
    tier.close()


def test_a_cancelled_reader_leaves_the_others_served(tmp_path: Path) -> None:
    tier = _filled(tmp_path, 20)
    disk, background = _disk_io(tier)
    got: dict[int, bytes | None] = {}

    async def read(index: int) -> None:
        got[index] = await disk.get(_block_key(index), SMALL)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            background.attach(nursery)
            async with trio.open_nursery() as readers:
                for index in range(20):
                    readers.start_soon(read, index)
                with trio.move_on_after(0):  # cancelled while queued
                    await read(99)
            # Nothing is left queued or running once every reader is served.
            assert disk._reads == [] and disk._queued_bytes == 0
            await background.idle()
            assert disk._readers == 0
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert got == {n: _block(n) for n in range(20)}
    tier.close()


def test_without_background_tasks_a_read_takes_its_own_hop(tmp_path: Path) -> None:
    tier = _filled(tmp_path, 2)
    disk, _background = _disk_io(tier)  # never attached: no reader task can run

    async def main() -> list[bytes | None]:
        return [await disk.get(_block_key(n)) for n in range(3)]

    assert trio.run(main) == [_block(0), _block(1), None]
    tier.close()
