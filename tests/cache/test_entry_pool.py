"""Entry files created ahead (pffs.cache.entrypool): a write takes one instead of creating a
file, the pool never leaks files (closed, killed, swept), no pool file is ever old enough for
another process's sweep to take it for an orphan, and a mount's filler refills it once quiet.
Real files in a real tier directory throughout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pffs.cache.entrypool import MAX_AGE, EntryPool
from pffs.cache.orphans import GRACE, sweep_orphans
from tests.cache.test_disk_batch import BLOCK, _block, _check_every_row, _key, _rows, _tier
from tests.cache.test_disk_batch import _entry_files as entry_files
from tests.waiting import eventually


def _pooled(directory: Path) -> set[str]:
    """Entry files no row names: the pool's, here."""
    return entry_files(directory) - set(_rows(directory).values())


def test_a_write_takes_a_file_created_ahead_and_creates_none(tmp_path: Path) -> None:
    tier = _tier(tmp_path)
    assert tier.fill_pool(8) == tier.pool.size - 8
    created = entry_files(tmp_path)
    assert len(created) == 8
    assert all(os.path.getsize(tmp_path / name) == 0 for name in created)
    keys = [_key(index) for index in range(5)]

    assert tier.put_batch([(key, _block(key), "src") for key in keys]) == [True] * 5

    assert entry_files(tmp_path) == created  # the blocks went into the files made ahead
    assert set(_rows(tmp_path).values()) < created
    assert len(tier.pool) == 3
    for key in keys:
        assert tier.get(key).data == _block(key)
    tier.close()


def test_closing_the_tier_removes_the_pool_and_keeps_every_entry(tmp_path: Path) -> None:
    tier = _tier(tmp_path)
    tier.fill_pool(6)
    keys = [_key(index) for index in range(10)]  # more than the pool: the rest are created
    assert tier.put_batch([(key, _block(key), "src") for key in keys]) == [True] * 10
    tier.fill_pool(6)
    assert len(_pooled(tmp_path)) == 6

    tier.close()

    assert entry_files(tmp_path) == set(_rows(tmp_path).values())
    _check_every_row(tmp_path, BLOCK)
    assert tier.pool.fill(4) == 0 and entry_files(tmp_path) == set(_rows(tmp_path).values())


# Commits a batch, fills the pool, and is killed (SIGKILL) with it full.
_KILLED_WITH_A_POOL = """
import hashlib, sys, time
from pffs.cache.disk import DiskTier, entry_key
from pffs.cache.keys import BlockKey

tier = DiskTier(sys.argv[1], 1 << 30, free_ratio=0.0, compress=False)
size = int(sys.argv[2])

def block(key):  # as test_disk_batch's blocks: derived from the key
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]

keys = [entry_key(BlockKey("src", "u", "p", "v", n), size) for n in range(4)]
assert all(tier.put_batch([(key, block(key), "src") for key in keys]))
tier.fill_pool(16)
print("filled", flush=True)
time.sleep(60)
"""


def test_a_process_killed_with_its_pool_leaves_only_files_the_sweep_removes(
    tmp_path: Path,
) -> None:
    command = [sys.executable, "-c", _KILLED_WITH_A_POOL, str(tmp_path), str(BLOCK)]
    writer = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None
    assert writer.stdout.readline().strip() == "filled"
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=10)
    left = _pooled(tmp_path)
    assert len(left) == 16
    when = time.time() - GRACE - 60
    for name in entry_files(tmp_path):  # all of them old: rows keep theirs
        os.utime(tmp_path / name, (when, when))

    swept = sweep_orphans(str(tmp_path))

    assert (swept.files, swept.bytes) == (16, 0)
    assert entry_files(tmp_path) == set(_rows(tmp_path).values())
    _check_every_row(tmp_path, BLOCK)


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_pool_files_never_grow_old_enough_for_a_sweep(tmp_path: Path) -> None:
    tier = _tier(tmp_path)  # the directory's index, for the sweep
    clock = _Clock()
    names = iter(f"{n:02x}/{n:030x}.val" for n in range(1, 100))
    pool = EntryPool(str(tmp_path), lambda: next(names), size=4, clock=clock)
    assert pool.fill(4) == 0
    files = _pooled(tmp_path)
    long_ago = time.time() - GRACE - 60
    for name in files:  # as if created long ago (the pool's clock says when)
        os.utime(tmp_path / name, (long_ago, long_ago))
    clock.now += MAX_AGE * 0.75

    assert pool.fill(4) == 0  # full: it only brings the files up to date

    assert all(os.path.getmtime(tmp_path / name) > time.time() - 60 for name in files)
    assert sweep_orphans(str(tmp_path)).files == 0
    clock.now += MAX_AGE + 1  # no fill for longer than MAX_AGE: too old to be taken
    assert pool.take() is None
    assert _pooled(tmp_path) == set() and len(pool) == 0
    tier.close()


def test_a_pool_file_removed_meanwhile_is_created_again(tmp_path: Path) -> None:
    tier = _tier(tmp_path)
    tier.fill_pool(2)
    for name in _pooled(tmp_path):  # a clear, or another process's sweep
        os.remove(tmp_path / name)
    keys = [_key(index) for index in range(2)]

    assert tier.put_batch([(key, _block(key), "src") for key in keys]) == [True, True]

    for key in keys:
        assert tier.get(key).data == _block(key)
    assert entry_files(tmp_path) == set(_rows(tmp_path).values())
    tier.close()


def test_a_mounts_filler_fills_the_pool_at_once_and_again_after_writes(tmp_path: Path) -> None:
    tier = _tier(tmp_path)
    tier.pool.size = 8
    tier.fill_pool_in_background()
    eventually(lambda: len(tier.pool) == 8, 10, "the first fill")
    keys = [_key(index) for index in range(20)]

    assert tier.put_batch([(key, _block(key), "src") for key in keys]) == [True] * 20

    eventually(lambda: len(tier.pool) == 8, 10, "the fill once the writes are quiet")
    assert len(_pooled(tmp_path)) == 8
    for key in keys:
        assert tier.get(key).data == _block(key)
    tier.close()
    assert _pooled(tmp_path) == set()


def test_closing_while_the_filler_creates_files_leaves_none(tmp_path: Path) -> None:
    tier = _tier(tmp_path)
    tier.pool.size = 100_000  # still filling when closed
    tier.fill_pool_in_background()
    eventually(lambda: len(tier.pool) > 20, 10, "a fill under way")

    tier.close()

    assert _pooled(tmp_path) == set()
