"""Sweeping the disk tier's orphans: entry files that no row of its index names.

`DiskTier.put_batch` writes a batch's entry files first and commits their rows after
(diskindex.py). A process killed between the two (kill -9, a crash, a power loss) leaves files
no row names: never read, never evicted, outside the tier's bound for good. The sweep removes
them: files in the tier's entry directories (`xx/<name>.val`, where the tier puts entries) that
no row names and that were last modified more than `grace` seconds ago.

The grace keeps other processes' batches safe: a mount or `pffs warmup` sharing the directory
may have written a file and not committed its row yet. A batch's files are written within
seconds, and its commit waits at most SQLite's busy timeout (diskcache's 60 s), so
`GRACE` (ten minutes) is far beyond both. Files are listed first and the rows read after, in
one SELECT (one snapshot), so a row committed before the listing ended is always seen; a file
written after the listing is never a candidate.

The candidates go into a temporary table of the sweep's own read-only connection, one
directory at a time, and one query keeps those no row names: a cache of a million entries
costs SQLite's temporary storage, not a million Python strings in the mount's memory. Only
files are removed, never rows; the index is only read.
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import diskcache

from pffs.cache.diskindex import read_only

log = logging.getLogger("pffs.cache.orphans")

# How old an unnamed entry file must be before it is taken for an orphan (see the module doc).
GRACE = 600.0
# The tier's entry directories and files (disk.py's _BlockDisk.filename).
_DIRECTORY = re.compile(r"[0-9a-f]{2}")
_ENTRY = re.compile(r"[0-9a-f]{30}\.val")
# diskcache's busy timeout, for the read of the index while writers commit.
_TIMEOUT = 60.0


@dataclass(frozen=True)
class Swept:
    """What a sweep removed: orphaned files and their bytes."""

    files: int = 0
    bytes: int = 0


def sweep_orphans(
    directory: str,
    grace: float = GRACE,
    stop: threading.Event | None = None,
) -> Swept:
    """Remove the orphaned entry files of the disk tier in `directory`. Stops early, having
    removed what it found so far, once `stop` is set."""
    if not os.path.exists(os.path.join(directory, diskcache.core.DBNAME)):
        return Swept()  # no index: nothing can be told an orphan
    with read_only(directory, _TIMEOUT) as connection:
        connection.execute("CREATE TEMP TABLE candidates(filename TEXT, size INTEGER)")
        cutoff = time.time() - grace
        for name in sorted(os.listdir(directory)):
            if stop is not None and stop.is_set():
                return Swept()
            if _DIRECTORY.fullmatch(name):
                connection.executemany(
                    "INSERT INTO temp.candidates VALUES (?, ?)",
                    _old_entries(os.path.join(directory, name), name, cutoff),
                )
        orphans = connection.execute(
            "SELECT filename, size FROM temp.candidates WHERE filename NOT IN"
            " (SELECT filename FROM main.Cache WHERE filename IS NOT NULL)"
        )
        return _remove(directory, orphans, stop)


def _old_entries(path: str, name: str, cutoff: float) -> list[tuple[str, int]]:
    """The entry files of one entry directory last modified before `cutoff`: (filename as the
    index names it, size)."""
    found: list[tuple[str, int]] = []
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                if not _ENTRY.fullmatch(entry.name):
                    continue
                try:
                    status = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # evicted or deleted meanwhile
                if status.st_mtime < cutoff:
                    found.append((f"{name}/{entry.name}", status.st_size))
    except OSError as exc:  # an unreadable directory: its files are left alone
        log.debug("orphan sweep skipped %s: %s", path, exc)
    return found


def _remove(directory: str, orphans: sqlite3.Cursor, stop: threading.Event | None) -> Swept:
    files = size = 0
    for filename, length in orphans:
        if stop is not None and stop.is_set():
            break
        try:
            os.remove(os.path.join(directory, filename))
        except FileNotFoundError:
            continue  # another sweep got there first
        except OSError as exc:
            log.debug("orphan sweep could not remove %s: %s", filename, exc)
            continue
        files += 1
        size += int(length)
    return Swept(files, size)


def sweep_in_background(directory: str, grace: float = GRACE) -> Callable[[], None]:
    """Start a sweep of `directory` in a thread of its own (a mount starting never waits for
    it); returns the function that stops it and waits for its thread (before the tier closes).
    """
    stop = threading.Event()

    def run() -> None:
        try:
            swept = sweep_orphans(directory, grace, stop)
        except (OSError, sqlite3.Error) as exc:  # a sweep is housekeeping: it never fails a mount
            log.warning("disk cache orphan sweep of %s failed: %s", directory, exc)
            return
        if swept.files:
            log.info(
                "disk cache: removed %d orphaned entry files (%d bytes) left by a crash",
                swept.files,
                swept.bytes,
            )

    thread = threading.Thread(target=run, name="pffs-orphan-sweep", daemon=True)
    thread.start()

    def stop_sweep() -> None:
        stop.set()
        thread.join()

    return stop_sweep
