"""The orphan sweep (pffs.cache.orphans): entry files a writer killed between writing them and
committing their rows are removed once older than the grace; indexed files and fresh ones are
kept, and a second process writing while the sweep runs loses nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pffs.cache.orphans import GRACE, sweep_orphans
from pffs.cli.cacheadmin import cache_admin
from tests.cache.test_disk_batch import _check_every_row, _rows, _tier, _writer
from tests.cache.test_disk_batch import _entry_files as entry_files
from tests.waiting import eventually

BLOCKS = 8
SIZE = 16 << 10

# Commits a batch, then is killed (SIGKILL) with its second batch written and not indexed.
_KILLED_WRITER = """
import hashlib, sys, time
from pffs.cache.disk import DiskTier, entry_key
from pffs.cache.keys import BlockKey

tier = DiskTier(sys.argv[1], 1 << 30, free_ratio=0.0, compress=False)
blocks, size = int(sys.argv[2]), int(sys.argv[3])

def block(key):  # as test_disk_batch's blocks: derived from the key
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]

def batch(name):
    keys = [entry_key(BlockKey("src", "u", name, "v", n), size) for n in range(blocks)]
    return [(key, block(key), "src") for key in keys]

assert all(tier.put_batch(batch("indexed")))

def never_commits(rows):
    print("written", flush=True)
    time.sleep(60)

tier.index.add = never_commits
tier.put_batch(batch("orphaned"))
"""


def kill_a_writer_before_its_commit(directory: Path) -> None:
    command = [sys.executable, "-c", _KILLED_WRITER, str(directory), str(BLOCKS), str(SIZE)]
    writer = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None
    assert writer.stdout.readline().strip() == "written"
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=10)


def orphans_of(directory: Path) -> set[str]:
    return entry_files(directory) - set(_rows(directory).values())


def age(directory: Path, files: set[str], seconds: float) -> None:
    when = time.time() - seconds
    for name in files:
        os.utime(directory / name, (when, when))


def test_orphans_of_a_killed_writer_are_removed_and_indexed_and_fresh_files_kept(
    tmp_path: Path,
) -> None:
    kill_a_writer_before_its_commit(tmp_path)
    indexed = set(_rows(tmp_path).values())
    orphans = orphans_of(tmp_path)
    assert len(indexed) == BLOCKS and len(orphans) == BLOCKS
    old, fresh = set(sorted(orphans)[: BLOCKS // 2]), set(sorted(orphans)[BLOCKS // 2 :])
    age(tmp_path, old | indexed, GRACE + 60)  # indexed files as old: their rows keep them
    old_bytes = sum(os.path.getsize(tmp_path / name) for name in old)

    swept = sweep_orphans(str(tmp_path))

    assert (swept.files, swept.bytes) == (len(old), old_bytes)
    assert entry_files(tmp_path) == indexed | fresh
    _check_every_row(tmp_path, SIZE)
    assert sweep_orphans(str(tmp_path)).files == 0  # nothing left to sweep


def test_a_second_process_writing_during_sweeps_loses_nothing(tmp_path: Path) -> None:
    """Sweeps with a grace of one second run back to back while another process writes
    batches: every block it stored reads back, and only the old orphans are gone."""
    kill_a_writer_before_its_commit(tmp_path)
    old = orphans_of(tmp_path)
    age(tmp_path, old, 60)
    writer = _writer(tmp_path, "busy", 300, 1 << 30, SIZE)
    swept = 0
    while writer.poll() is None:
        swept += sweep_orphans(str(tmp_path), grace=1.0).files
    assert writer.returncode == 0
    swept += sweep_orphans(str(tmp_path), grace=1.0).files
    assert swept == len(old)
    rows = _check_every_row(tmp_path, SIZE)
    assert len(rows) == BLOCKS + 300 * 16
    assert entry_files(tmp_path) == set(rows.values())  # no orphan left, no entry lost


def test_a_tier_sweeps_in_the_background_and_stops_at_close(tmp_path: Path) -> None:
    kill_a_writer_before_its_commit(tmp_path)
    orphans = orphans_of(tmp_path)
    age(tmp_path, orphans, GRACE + 60)
    tier = _tier(tmp_path)
    tier.sweep_in_background()
    eventually(lambda: not entry_files(tmp_path) & orphans, 10, "the orphans swept")
    tier.close()
    assert not entry_files(tmp_path) & orphans
    assert len(entry_files(tmp_path)) == BLOCKS


def test_cache_clear_also_removes_orphans(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kill_a_writer_before_its_commit(tmp_path)
    age(tmp_path, orphans_of(tmp_path), GRACE + 60)
    assert cache_admin(str(tmp_path), "clear") == 0
    out = capsys.readouterr().out
    assert f"removed {BLOCKS} blocks" in out
    assert f"removed {BLOCKS} orphaned files" in out
    assert entry_files(tmp_path) == set()
