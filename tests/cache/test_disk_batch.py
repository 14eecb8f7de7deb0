"""The disk tier's batched writes: DiskTier.put_batch and DiskIO's write-behind batches.

A batch writes its entry files, then indexes them in one transaction. These tests check what
must hold whatever happens to a batch: a block that fails alone is skipped alone, an index
transaction that fails stores nothing and leaves no file behind, eviction keeps the bound and
removes what it evicts, two processes writing at once keep one consistent index, and a writer
killed in the middle of a batch leaves no entry that reads back wrong.
"""

from __future__ import annotations

import errno
import hashlib
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import diskcache
import pytest
import trio

from pffs.cache import disk as disk_module
from pffs.cache import entries
from pffs.cache.blocks import Background
from pffs.cache.disk import DiskTier, entry_key
from pffs.cache.diskio import DiskIO
from pffs.cache.keys import BlockKey
from pffs.cache.stats import CacheStats
from tests.cache.configs import KIB

BLOCK = 64 * KIB


def _key(index: int, path: str = "p") -> str:
    return entry_key(BlockKey("src", "u", path, "v", index), BLOCK)


def _block(key: str, size: int = BLOCK) -> bytes:
    """The block's bytes, derived from its key (as the store's bytes are from the object's)."""
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def _rows(directory: Path) -> dict[str, str]:
    """The index's rows as key -> entry file, read as `pffs cache info` would (read-only)."""
    uri = f"{(directory / diskcache.core.DBNAME).absolute().as_uri()}?mode=ro"
    with sqlite3.connect(uri, uri=True) as connection:
        return dict(connection.execute("SELECT key, filename FROM Cache").fetchall())


def _entry_files(directory: Path) -> set[str]:
    return {str(path.relative_to(directory)) for path in directory.rglob("*.val")}


def _tier(directory: Path, capacity: int = 1 << 30) -> DiskTier:
    return DiskTier(str(directory), capacity, free_ratio=0.0, compress=False)


def test_a_batch_stores_every_block_and_indexes_exactly_its_files(tmp_path: Path) -> None:
    tier = _tier(tmp_path)
    keys = [_key(index) for index in range(10)]
    assert tier.put_batch([(key, _block(key), "src") for key in keys]) == [True] * 10
    for key in keys:
        assert tier.get(key).data == _block(key)
    rows = _rows(tmp_path)
    assert set(rows) == set(keys)
    assert set(rows.values()) == _entry_files(tmp_path)
    # The same keys again: each row now names a new file, and the old files are gone.
    assert tier.put_batch([(key, _block(key), "src") for key in keys[:4]]) == [True] * 4
    assert set(_rows(tmp_path).values()) == _entry_files(tmp_path)
    assert len(_entry_files(tmp_path)) == 10
    # A key twice in one batch (a block written behind twice): the last one stays.
    twice = [(keys[0], b"first" * 100, "src"), (keys[0], _block(keys[0]), "src")]
    assert tier.put_batch(twice) == [True, True]
    assert tier.get(keys[0]).data == _block(keys[0])
    assert set(_rows(tmp_path).values()) == _entry_files(tmp_path)
    _check_diskcache(tmp_path)
    tier.close()


def test_a_block_whose_file_fails_is_skipped_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = _tier(tmp_path)
    keys = [_key(index) for index in range(5)]
    real_write = entries.write_entry
    writes = 0

    def failing_third(path: str, key: str, data: bytes, compress: bool) -> int:
        nonlocal writes
        writes += 1
        if writes == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(path, key, data, compress)

    monkeypatch.setattr("pffs.cache.disk.write_entry", failing_third)
    assert tier.put_batch([(key, _block(key), "src") for key in keys]) == [
        True,
        True,
        False,
        True,
        True,
    ]
    assert tier.get(keys[2]).data is None
    for key in keys[:2] + keys[3:]:
        assert tier.get(key).data == _block(key)
    assert set(_rows(tmp_path).values()) == _entry_files(tmp_path)
    tier.close()


def test_a_batch_whose_index_update_fails_half_way_stores_nothing_and_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = _tier(tmp_path)
    before = [_key(index, "before") for index in range(3)]
    assert all(tier.put_batch([(key, _block(key), "src") for key in before]))

    def failing_after_the_rows(*_args: object) -> list[str]:
        # Every row of the batch is in, the replaced row deleted: then the transaction fails.
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(tier.index, "_cull", failing_after_the_rows)
    # The batch replaces an entry first: its old file must outlive the rollback.
    batch = [_key(index) for index in range(5)]
    blocks = [(before[0], _block(before[0]), "src")] + [(key, _block(key), "src") for key in batch]
    assert tier.put_batch(blocks) == [False] * 6
    monkeypatch.undo()
    for key in batch:
        assert tier.get(key).data is None  # the rows inserted before the failure rolled back
    for key in before:
        assert tier.get(key).data == _block(key)
    rows = _rows(tmp_path)
    assert set(rows) == set(before)
    assert set(rows.values()) == _entry_files(tmp_path)  # the batch's files were removed
    tier.close()


def test_the_free_space_floor_skips_the_rest_of_a_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = _tier(tmp_path)
    real_usage = shutil.disk_usage(tmp_path)
    # Room for two and a half blocks above the floor (the tier keeps 10% of the disk free).
    tier.free_ratio = 0.1
    free = int(0.1 * real_usage.total) + 5 * BLOCK // 2
    monkeypatch.setattr(
        "pffs.cache.disk.shutil.disk_usage",
        lambda _path: real_usage._replace(free=free),
    )
    keys = [_key(index) for index in range(4)]
    assert tier.put_batch([(key, _block(key), "src") for key in keys]) == [
        True,
        True,
        False,
        False,
    ]
    assert set(_rows(tmp_path)) == set(keys[:2])
    tier.close()


def test_eviction_during_a_batch_keeps_the_bound_and_removes_what_it_evicts(
    tmp_path: Path,
) -> None:
    capacity = 1 << 20
    tier = _tier(tmp_path, capacity)
    keys = [_key(index) for index in range(40)]  # 40 entries of 68 KiB: 2.6x the capacity
    assert all(tier.put_batch([(key, _block(key), "src") for key in keys[:20]]))
    assert all(tier.put_batch([(key, _block(key), "src") for key in keys[20:]]))
    assert sum(usage.bytes for usage in tier.usage_by_source()) <= capacity
    rows = _rows(tmp_path)
    assert 0 < len(rows) < len(keys)
    assert set(rows.values()) == _entry_files(tmp_path)  # evicted entries' files are gone
    for key in keys:
        found = tier.get(key).data
        assert found is None or found == _block(key)
        assert (found is not None) == (key in rows)
    assert keys[-1] in rows  # least recently stored goes first: the newest stays
    _check_diskcache(tmp_path)
    tier.close()


_WRITER = """
import hashlib, sys
from pffs.cache.disk import DiskTier, entry_key
from pffs.cache.keys import BlockKey

def block(key, size):
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]

directory, name, rounds, capacity, size = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
tier = DiskTier(directory, capacity, free_ratio=0.0, compress=False)
print("ready", flush=True)
for round_ in range(rounds):
    # Half of each batch is this writer's own, half shared with the other writer.
    keys = [entry_key(BlockKey("src", "u", name, "v", round_ * 8 + n), size) for n in range(8)]
    keys += [entry_key(BlockKey("src", "u", "shared", "v", round_ * 8 + n), size) for n in range(8)]
    stored = tier.put_batch([(key, block(key, size), name) for key in keys])
    assert all(stored), stored
    print("committed", flush=True)
tier.close()
"""


def _writer(
    directory: Path, name: str, rounds: int, capacity: int, size: int
) -> subprocess.Popen[str]:
    command = [sys.executable, "-c", _WRITER, str(directory)]
    command += [name, str(rounds), str(capacity), str(size)]
    writer = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None
    assert writer.stdout.readline().strip() == "ready"
    return writer


def _check_every_row(directory: Path, size: int) -> dict[str, str]:
    """Every indexed entry reads back exactly its block; the index's rows."""
    tier = _tier(directory)
    rows = _rows(directory)
    for key in rows:
        assert tier.get(key).data == _block(key, size), key
    tier.close()
    return rows


def test_two_processes_writing_batches_at_once_keep_one_consistent_index(
    tmp_path: Path,
) -> None:
    capacity = 2 << 20  # small enough that both evict while they write
    writers = [_writer(tmp_path, name, 40, capacity, 16 * KIB) for name in ("one", "two")]
    for writer in writers:
        assert writer.wait(timeout=60) == 0
    rows = _check_every_row(tmp_path, 16 * KIB)
    assert set(rows.values()) == _entry_files(tmp_path)  # no file leaked, none missing
    assert _check_diskcache(tmp_path) <= capacity


def _check_diskcache(directory: Path) -> int:
    """diskcache's own consistency check of the index (its count and size against the rows,
    the files against the rows) finds nothing; its volume."""
    cache = diskcache.Cache(str(directory), tag_index=True)  # the tier's settings, kept
    # Only the tier's 256 entry directories, made once and kept, may be empty.
    problems = [str(warning.message) for warning in cache.check()]
    assert [problem for problem in problems if "empty directory" not in problem] == []
    volume = int(cache.volume())
    cache.close()
    return volume


def test_a_writer_killed_in_the_middle_of_batches_leaves_no_entry_read_wrong(
    tmp_path: Path,
) -> None:
    size = 1 << 20  # batches of 16 MiB: a kill lands inside one more often than not
    for attempt in range(3):
        writer = _writer(tmp_path, f"killed{attempt}", 1000, 1 << 30, size)
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "committed"  # one batch in, however slow
        time.sleep(0.05 * attempt)  # the kill lands somewhere in a later batch
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=10)
    rows = _check_every_row(tmp_path, size)
    assert rows  # the batches committed before the kills
    # A batch killed before its commit leaves files no row names; they are never served.
    assert set(rows.values()) <= _entry_files(tmp_path)


def test_write_behind_writes_blocks_in_batches(tmp_path: Path) -> None:
    tier = _tier(tmp_path)
    batches: list[int] = []
    real_put_batch = tier.put_batch

    def counting(blocks: Sequence[tuple[str, bytes, str]]) -> list[bool]:
        batches.append(len(blocks))
        return real_put_batch(blocks)

    tier.put_batch = counting  # type: ignore[method-assign]
    stats = CacheStats()
    keys = [BlockKey("src", "u", "p", "v", index) for index in range(40)]
    background = Background()
    disk = DiskIO(tier, BLOCK, threads=4, stats=stats, background=background)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            background.attach(nursery)
            for key in keys[:20]:  # blocks loaded ahead: each waits for the disk's backlog
                await disk.wait_for_room()
                disk.write_behind(key, _block(disk.name(key)))
            for key in keys[20:]:  # a reader's blocks: queued in the background
                disk.write_behind(key, _block(disk.name(key)))
            await background.idle()
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert (stats.disk_writes, stats.disk_write_skips) == (40, 0)
    assert sum(batches) == 40
    assert len(batches) < 40 // 2  # blocks queued together are written together
    for key in keys:
        assert tier.get(disk.name(key)).data == _block(disk.name(key))
    tier.close()


def test_write_behind_counts_a_skipped_block_and_frees_its_slot(tmp_path: Path) -> None:
    tier = _tier(tmp_path)
    tier.put_batch = lambda blocks: [False] * len(blocks)  # type: ignore[method-assign]
    stats = CacheStats()
    background = Background()
    disk = DiskIO(tier, BLOCK, threads=1, stats=stats, background=background)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            background.attach(nursery)
            # Two write slots (2 x threads): ten blocks get through only if slots come back.
            for index in range(10):
                key = BlockKey("src", "u", "p", "v", index)
                with trio.fail_after(10):
                    await disk.wait_for_room()
                disk.write_behind(key, b"x" * 100)
            await background.idle()
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert (stats.disk_writes, stats.disk_write_skips) == (0, 10)
    tier.close()


@pytest.mark.parametrize(("write_room", "room_blocks"), [(0, 2), (8 * BLOCK, 8)])
def test_blocks_loaded_ahead_wait_for_the_disk_only_beyond_its_write_room(
    tmp_path: Path, write_room: int, room_blocks: int
) -> None:
    """A window's GETs land while the disk is busy (`write_room`: the budget of bytes loaded
    ahead), rather than waiting, nothing in flight, for each batch (two blocks per thread)."""
    tier = _tier(tmp_path)
    disk_free = threading.Event()
    real_put_batch = tier.put_batch

    def busy_disk(blocks: Sequence[tuple[str, bytes, str]]) -> list[bool]:
        disk_free.wait(10)
        return real_put_batch(blocks)

    tier.put_batch = busy_disk  # type: ignore[method-assign]
    stats = CacheStats()
    background = Background()
    disk = DiskIO(tier, BLOCK, threads=1, stats=stats, background=background, write_room=write_room)
    keys = [BlockKey("src", "u", "p", "v", index) for index in range(room_blocks + 1)]

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            background.attach(nursery)
            for key in keys[:-1]:  # the room's blocks land while the disk writes nothing
                with trio.fail_after(10):
                    await disk.wait_for_room()
                disk.write_behind(key, _block(disk.name(key)))
            # Every slot held by a block the disk has not taken: the next load ahead waits.
            with trio.move_on_after(0.2) as waiting:
                await disk.wait_for_room()
            assert waiting.cancelled_caught
            disk_free.set()
            with trio.fail_after(10):
                await disk.wait_for_room()  # a batch written: room again
            disk.write_behind(keys[-1], _block(disk.name(keys[-1])))
            await background.idle()
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert (stats.disk_writes, stats.disk_write_skips) == (room_blocks + 1, 0)
    tier.close()


def test_batches_at_once_never_take_the_same_room_above_the_floor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two batches written at once, with room above the free-space floor for one entry: one is
    stored, not both (each used to write what one statvfs had shown it); and a block takes its
    whole entry's room, header and padding, not its bytes' alone. The disk is real; its free
    space is held still (`_room`), as two writer threads see it between their writes."""
    tier = DiskTier(str(tmp_path / "d"), capacity=1 << 30, free_ratio=0.0, compress=False)
    block = 256 * 1024
    entry = entries.entry_size(block)
    monkeypatch.setattr(tier, "_room", lambda: entry + entry // 2)
    real_write = entries.write_entry

    def slow_write(*args: object) -> int:
        time.sleep(0.2)  # both batches have taken their room before either file is written
        return real_write(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(disk_module, "write_entry", slow_write)
    together = threading.Barrier(2)
    stored: list[bool] = []

    def put(n: int) -> None:
        key = entry_key(BlockKey("src", "u", f"f{n}", "v", 0), block)
        together.wait()
        stored.extend(tier.put_batch([(key, bytes(block), "src")]))

    threads = [threading.Thread(target=put, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(stored) == [False, True]
    monkeypatch.setattr(tier, "_room", lambda: block + 1)  # room for the bytes, not the entry
    key = entry_key(BlockKey("src", "u", "g", "v", 0), block)
    assert tier.put_batch([(key, bytes(block), "src")]) == [False]
    tier.close()
