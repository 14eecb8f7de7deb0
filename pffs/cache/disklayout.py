"""Which layout a disk tier directory holds, and clearing one written in another.

A cache directory outlives the mount, and the pffs that wrote it: its layout (the entry format
of entries.py, diskcache's index, the entry directories of disk.py) is named by a small file,
`LAYOUT_FILE`, in it. Before the tier opens a directory, `check_layout`:
- a directory with no index yet gets the marker;
- one whose marker names this layout is used as it is;
- one with an index and no marker (written before markers were) is adopted when its entries
  are in this layout's format (the first entry file found is looked at), else cleared;
- one whose marker names another layout is cleared.

Clearing removes the index, the entry directories and the marker, with one warning in the log,
and the tier starts empty: a directory of another layout is never an error to readers, nor a
warning per entry. Files in the directory that are not the tier's are left alone. Two
processes opening the same old directory at once may both clear it; neither serves from it.
"""

from __future__ import annotations

import logging
import os
import re
import shutil

from pffs.cache.entries import has_current_format

log = logging.getLogger("pffs.cache.disk")

LAYOUT_FILE = "layout"
# PFB3 entries (entries.py) in 256 directories, indexed by diskcache's cache.db.
LAYOUT = "pffs disk tier 3\n"
_INDEX_FILES = ("cache.db", "cache.db-wal", "cache.db-shm")
_ENTRY_DIRECTORY = re.compile(r"[0-9a-f]{2}")


def check_layout(directory: str) -> None:
    """Make `directory` hold this layout: mark it, adopt it, or clear it (module doc)."""
    marker = os.path.join(directory, LAYOUT_FILE)
    try:
        with open(marker) as f:
            found: str | None = f.read(256)
    except FileNotFoundError:
        found = None
    except (OSError, UnicodeDecodeError) as exc:
        found = f"unreadable ({exc})"
    if found == LAYOUT:
        return
    has_index = os.path.exists(os.path.join(directory, "cache.db"))
    if has_index and (found is not None or not _entries_current(directory)):
        described = "an older one" if found is None else repr(found.strip())
        log.warning(
            "disk cache %s was written in another layout (%s): cleared", directory, described
        )
        _clear(directory)
    _write_marker(marker)


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
        if name in _INDEX_FILES or name == LAYOUT_FILE:
            os.remove(path)
        elif _ENTRY_DIRECTORY.fullmatch(name) and os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)


def _write_marker(marker: str) -> None:
    """Write the marker whole or not at all (a reader never sees half of it)."""
    temporary = f"{marker}.{os.getpid()}.tmp"
    with open(temporary, "w") as f:
        f.write(LAYOUT)
    os.replace(temporary, marker)
