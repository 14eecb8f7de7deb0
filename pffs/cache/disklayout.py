"""Which layout a disk tier directory holds, and clearing one written in another.

A cache directory outlives the mount, and the pffs that wrote it. Its layout (the entry format
of entries.py, diskcache's index, the entry directories of disk.py) is the `user_version` of
its index database, a number SQLite keeps in the file's header for its user and diskcache does
not use; a marker file would be an unknown file to diskcache's own `check()`. Before the tier
opens a directory, `check_layout`:
- a directory with no index yet gets one, marked;
- one whose index is marked with this layout is used as it is;
- one whose index is unmarked (written before marks were) is adopted when its entries are in
  this layout's format (the first entry file found is looked at), else cleared;
- one marked with another layout is cleared.

Clearing removes the index and the entry directories, with one warning in the log, and the
tier starts empty: a directory of another layout is never an error to readers, nor a warning
per entry. Other files in the directory (a mount's `staging/`) are left alone. Two processes
opening the same old directory at once may both clear it; neither serves from it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import sqlite3

from pffs.cache.entries import has_current_format

log = logging.getLogger("pffs.cache.disk")

# PFB3 entries (entries.py) in 256 directories, indexed by diskcache's cache.db, under keys
# that name the principal that read each block (keys.py). Layout 3 had the same entries under
# keys without the principal, shared by every mount of a source: a directory of it is cleared.
LAYOUT = 4
INDEX = "cache.db"
_INDEX_FILES = (INDEX, f"{INDEX}-wal", f"{INDEX}-shm")
_ENTRY_DIRECTORY = re.compile(r"[0-9a-f]{2}")
# diskcache's busy timeout: marking the index waits for other processes' writes as theirs do.
_TIMEOUT = 60.0
_UNREADABLE = -1


def check_layout(directory: str) -> None:
    """Make `directory` hold this layout: mark it, adopt it, or clear it (module doc)."""
    index = os.path.join(directory, INDEX)
    found = read_mark(index) if os.path.exists(index) else None
    if found == LAYOUT:
        return
    if found is not None and (found != 0 or not _entries_current(directory)):
        log.warning(
            "disk cache %s was written in another layout (%s): cleared", directory, _named(found)
        )
        _clear(directory)
    mark(index, LAYOUT)


def _named(layout: int) -> str:
    return {0: "an older one", _UNREADABLE: "an unreadable index"}.get(layout, f"layout {layout}")


def read_mark(index: str) -> int:
    """The layout an index database is marked with: 0 when unmarked, _UNREADABLE when it
    cannot be read as a database (then it is cleared as another layout's)."""
    try:
        with contextlib.closing(sqlite3.connect(index, timeout=_TIMEOUT)) as connection:
            return int(connection.execute("PRAGMA user_version").fetchone()[0])
    except sqlite3.OperationalError:
        raise  # locked past the timeout, or not reachable: no verdict on what it holds
    except sqlite3.DatabaseError:  # "file is not a database"
        return _UNREADABLE


def mark(index: str, layout: int) -> None:
    """Mark the index database (made empty when there is none) with `layout`."""
    with contextlib.closing(sqlite3.connect(index, timeout=_TIMEOUT)) as connection:
        connection.execute(f"PRAGMA user_version = {int(layout)}")
        connection.commit()


def _entries_current(directory: str) -> bool:
    """Whether the first entry file found is in this layout's format (True when none is)."""
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if not _ENTRY_DIRECTORY.fullmatch(name) or not os.path.isdir(path):
            continue
        for root, _dirs, files in os.walk(path):
            for file in files:
                if file.endswith(".val"):
                    return has_current_format(os.path.join(root, file))
    return True


def _clear(directory: str) -> None:
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if name in _INDEX_FILES:
            os.remove(path)
        elif _ENTRY_DIRECTORY.fullmatch(name) and os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
