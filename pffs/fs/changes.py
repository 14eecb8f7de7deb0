"""Changes made through the mount, counted, so that an answer of the store asked before one and
landing after it is told apart and not kept.

The store may have answered such a request before the change: a directory's listing lacking the
file just written (its lookups then answered "no such file" for the directory TTL), a HEAD's size
and ETag from before an upload (reads of the new bytes then failing with ESTALE for the
attribute TTL), a HEAD's "no such key" for a file just created. The namespace (pffs.fs.namespace)
notes each change here, takes a mark as it asks the store, and keeps an answer only where
nothing it covers changed since the mark.
"""

from __future__ import annotations

# Changed entries told apart at once: past it, every answer under way is taken for one of a
# changed entry (a request asked again, never a stale answer kept).
MAX_CHANGED = 4096


class ChangeMarks:
    """The count of changes made through the mount, and the count at each path's last one."""

    def __init__(self) -> None:
        self._count = 0
        self._entry_at: dict[str, int] = {}  # path -> the count at its last change
        self._within_at: dict[str, int] = {}  # directory -> the same, for an entry in it
        self._forgotten = 0  # below this count, changes are no longer told apart

    def note(self, path: str) -> None:
        """The entry at `path` changed through the mount (written, removed, renamed); a
        directory's change covers everything below it."""
        self._count += 1
        if len(self._entry_at) >= MAX_CHANGED:
            self._entry_at.clear()
            self._within_at.clear()
            self._forgotten = self._count
        self._entry_at[path] = self._count
        self._within_at[path.rpartition("/")[0]] = self._count

    def mark(self) -> int:
        """What an answer asked of the store from now on is checked against."""
        return self._count

    def entry_changed(self, path: str, asked: int) -> bool:
        """Whether the entry at `path` or a directory above it changed since mark `asked`."""
        if asked >= self._count:  # nothing changed since: every answer's case but a race's
            return False
        if self._forgotten > asked:
            return True
        while True:
            if self._entry_at.get(path, 0) > asked:
                return True
            if not path:
                return False
            path = path.rpartition("/")[0]

    def listing_changed(self, directory: str, asked: int) -> bool:
        """Whether directory `directory`'s entries changed since mark `asked`."""
        if asked >= self._count:
            return False
        return self._within_at.get(directory, 0) > asked or self.entry_changed(directory, asked)
