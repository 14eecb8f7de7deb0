"""The small protocol every store implements, and the record it describes objects with.

Paths given to a backend are relative to the source root, '/'-separated, without a leading or
trailing slash; "" is the root. Backends are synchronous and thread-safe: the VFS calls them
from worker threads under a per-backend limiter. They raise only `pffs.errors` types.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What a store tells about one entry. `name` is the last path component."""

    name: str
    size: int
    mtime: float
    etag: str | None
    is_dir: bool

    @property
    def version(self) -> str:
        """Identity of this object's content: the etag, or mtime and size where there is none.

        Cache keys and read preconditions use it, so a changed object is never served old bytes.
        """
        if self.etag:
            return self.etag
        return f"{int(self.mtime * 1e9)}:{self.size}"


@runtime_checkable
class Backend(Protocol):
    """A store behind the VFS."""

    # A stable identifier of the store and root, used in cache keys and logs (no credentials).
    source_id: str
    # How many calls may run at once (the VFS makes a CapacityLimiter of this size).
    max_concurrency: int

    def check(self) -> None:
        """Verify the source exists and is readable; raise a one-line pffs error otherwise."""

    def stat(self, path: str) -> ObjectInfo:
        """The entry at `path` (file or directory); NotFound when neither exists."""

    def list(self, path: str) -> Iterator[ObjectInfo]:
        """The entries directly under directory `path`, streamed in the store's order."""

    def read_range(self, path: str, start: int, length: int, version: str | None) -> bytes:
        """Up to `length` bytes from `start`; Changed if `version` no longer matches."""

    # Optional: `read_blocks(path, start, lengths, version, deliver)` reads consecutive blocks
    # with one request and calls `deliver(index, bytes)` for each as it arrives (S3 has it).
    # The VFS prefetches through it in runs of blocks; without it, one read_range per block.


@runtime_checkable
class WritableBackend(Backend, Protocol):
    """A store that takes writes. The VFS stages data locally and calls these on commit."""

    # True when the store takes large objects in parts (begin/upload_part/finish/abort_upload),
    # which the VFS then sends in parallel; otherwise `put` sends the whole staged file.
    multipart: bool

    def put(self, path: str, local_path: str) -> ObjectInfo:
        """Store the content of local file `local_path` as `path`; what the store now holds."""

    def delete(self, path: str) -> None:
        """Remove the object at `path`."""

    def make_dir(self, path: str) -> ObjectInfo:
        """Create an empty directory."""

    def remove_dir(self, path: str) -> None:
        """Remove an empty directory (the VFS checks it is empty)."""

    def rename(self, old: str, new: str) -> None:
        """Move a file or a directory, replacing a file or empty directory at `new`."""


def join(parent: str, name: str) -> str:
    """Join a relative backend path and a name."""
    return f"{parent}/{name}" if parent else name


def is_valid_name(name: str) -> bool:
    """Whether a key component can be shown as a file name in a POSIX tree."""
    return bool(name) and name not in (".", "..") and "\0" not in name and len(name.encode()) <= 255
