"""The protocols every store implements, and the record it describes objects with.

What a backend must do (`Backend`, the read side, which every store has): name itself
(`source_id`, no credentials) and the principal it reads as (`principal`, a digest), say how
many calls may run at once (`max_concurrency`), count the transient failures it retried
(`retries`), check its root, and stat, list and read ranges of what is under that root. Paths
given to a backend are relative to the source root, '/'-separated, without a leading or trailing
slash; "" is the root. Every object has a version (its etag, or its mtime and size): a read
given a version that no longer matches raises Changed, so an open file never mixes two versions.
Backends are synchronous and thread-safe: the VFS calls them from worker threads, each call
holding a permit of its source's flow (pffs.flow.permits). They raise only `pffs.errors` types.
A read (stat, list, a range, a run of blocks) takes the `RetryTerms` of its request (pffs.retry:
when its reader asked, the source's breaker, who hears of throttling), which its retries answer
to.

What a store can do beyond reading is declared, never probed: each backend class has a
`capabilities` class attribute (a `Capabilities`), and for each declared capability it
implements the methods of its protocol. `block_runs`: the class implements `read_blocks` of
`BlockRunReader`. `tree_pages`: the class implements `list_tree` of `TreeLister`. `writes`: the
backend's `writer` attribute (the backend itself, or an object it owns, declared by the class's
annotation of `writer`) implements those of `WritableBackend`, and `multipart` (the store's part
limits) those of `MultipartBackend` too. Callers get the typed view of a capability from
`writable`, `multipart`, `block_runs` or `tree_lister`, which give that object when the
backend's class declares the capability and None otherwise; they never look for methods.
The contract suite (tests/backends/test_contract*.py, test_capabilities.py) holds every backend
to the reads and to what it declares.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from pffs.retry import RetryTerms


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


@dataclass(frozen=True, slots=True)
class PartLimits:
    """What a store allows of an upload in parts."""

    min_size: int  # of every part but the last
    max_size: int
    max_count: int

    def part_size(self, total: int, preferred: int) -> int:
        """The size of the parts of a `total`-byte upload (0: not known yet): `preferred`,
        larger where the store's minimum or its part count require; ValueError where even the
        largest parts cannot hold `total`."""
        size = max(preferred, self.min_size, -(-total // self.max_count))
        if size > self.max_size:
            raise ValueError(f"{total} bytes need parts larger than the store's {self.max_size}")
        return size


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a store does beyond the reads every backend has."""

    # put, delete, make_dir, remove_dir, rename: the WritableBackend methods of `writer`.
    writes: bool = False
    # Large objects in parts sent in parallel, within these limits: the MultipartBackend
    # methods of `writer`.
    multipart: PartLimits | None = None
    # Consecutive pieces read with one request, each yielded as it arrives (read_blocks).
    block_runs: bool = False
    # What lies under a directory at every depth, its first page in one request (list_tree).
    tree_pages: bool = False

    def __post_init__(self) -> None:
        if self.multipart is not None and not self.writes:
            raise ValueError("a store with multipart uploads takes writes too (MultipartBackend)")


class Backend(Protocol):
    """A store behind the VFS: the read side, which every store has."""

    # A stable identifier of the store and root, used in cache keys and logs (no credentials).
    source_id: str
    # A digest of the principal the store is read as (principal.py): with `source_id` it names
    # a source's blocks in the cache, so two principals never share them. Never logged.
    principal: str
    # The key proving that principal to a cache group's peers, from a static credential of its
    # own (principal.s3_principal_key); None where it has none. Never logged.
    principal_key: bytes | None
    # How many readers' calls may run at once (the source's flow: pffs.flow.permits).
    max_concurrency: int
    # What the store does beyond reads, declared by its class (see Capabilities).
    capabilities: Capabilities

    @property
    def retries(self) -> int:
        """Transient failures retried so far (reported at unmount)."""

    def check(self) -> None:
        """Verify the source exists and is readable; raise a one-line pffs error otherwise."""

    def probe(self) -> None:
        """Whether the store answers now, asked of a source marked down (pffs.routing.health):
        one small request within seconds, whatever the source's own timeouts, never on a
        connection opened before; raises while it does not answer."""

    def stat(self, path: str, terms: RetryTerms | None = None) -> ObjectInfo:
        """The entry at `path` (file or directory); NotFound when neither exists."""

    def list(self, path: str, terms: RetryTerms | None = None) -> Iterator[ObjectInfo]:
        """The entries directly under directory `path`, streamed in the store's order."""

    def read_range(
        self,
        path: str,
        start: int,
        length: int,
        version: str | None,
        terms: RetryTerms | None = None,
    ) -> bytes:
        """Up to `length` bytes from `start`; Changed if `version` no longer matches."""


class BlockRunReader(Backend, Protocol):
    """A store that reads consecutive blocks with one request (`block_runs`)."""

    def read_blocks(
        self,
        path: str,
        start: int,
        lengths: Sequence[int],
        version: str | None,
        terms: RetryTerms | None = None,
    ) -> Iterator[bytes]:
        """Pieces of `lengths` from `start`, each yielded on arrival."""


@dataclass(frozen=True, slots=True)
class TreePage:
    """The listings of a directory and of every directory below it, from one request
    (`list_tree`): by path relative to the listed one ("" for itself), the entries `list` would
    give, in its order. Only a `complete` page holds them: the store had nothing more under it
    (a page cut short holds none, as what a directory lacks would be a guess)."""

    directories: dict[str, list[ObjectInfo]]
    complete: bool


class TreeLister(Backend, Protocol):
    """A store that lists what lies under a directory at every depth (`tree_pages`)."""

    def list_tree(self, path: str, limit: int, terms: RetryTerms | None = None) -> TreePage:
        """The listings under directory `path` from one request of at most `limit` entries."""


class WritableBackend(Protocol):
    """What takes a store's writes (`writes`): the backend's `writer`. The VFS stages data
    locally and calls these on commit."""

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


class MultipartBackend(WritableBackend, Protocol):
    """What takes a store's writes where large objects go up in parts (`multipart`), which the
    VFS sends in parallel within the store's PartLimits; `put` still sends small ones whole."""

    def begin_upload(self, path: str) -> str:
        """Start an upload of `path`; its id."""

    def upload_part(
        self, path: str, upload_id: str, number: int, local_path: str, offset: int, length: int
    ) -> str:
        """Send part `number` (from 1): `length` bytes of `local_path` at `offset`; its etag."""

    def finish_upload(
        self, path: str, upload_id: str, etags: Sequence[str], size: int
    ) -> ObjectInfo:
        """Join the parts (their etags in order) into the object; what the store now holds."""

    def abort_upload(self, path: str, upload_id: str) -> None:
        """Drop an unfinished upload and its parts."""


class Writing(Backend, Protocol):
    """A backend whose class declares `writes`."""

    @property
    def writer(self) -> WritableBackend:
        """What takes its writes: the backend itself, or an object it owns."""


# The declared capabilities are the one place a backend is seen as more than a Backend.


def writable(backend: Backend) -> WritableBackend | None:
    return cast(Writing, backend).writer if backend.capabilities.writes else None


def multipart(backend: Backend) -> MultipartBackend | None:
    if backend.capabilities.multipart is None:
        return None
    return cast(MultipartBackend, cast(Writing, backend).writer)


def block_runs(backend: Backend) -> BlockRunReader | None:
    return cast(BlockRunReader, backend) if backend.capabilities.block_runs else None


def tree_lister(backend: Backend) -> TreeLister | None:
    return cast(TreeLister, backend) if backend.capabilities.tree_pages else None


def join(parent: str, name: str) -> str:
    """Join a relative backend path and a name."""
    return f"{parent}/{name}" if parent else name


def is_valid_name(name: str) -> bool:
    """Whether a key component can be shown as a file name in a POSIX tree."""
    return bool(name) and name not in (".", "..") and "\0" not in name and len(name.encode()) <= 255
