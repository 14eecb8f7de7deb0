"""Any `pyarrow.fs.FileSystem` as a source; HDFS and arrow's local filesystem share it.

`ArrowBackend` holds everything but the connect call: stat, list, ranged reads (read_at on a
random-access file), error translation and retries. A subclass only says how to reach its
filesystem and where its root is (see backends/hdfs.py). `arrow+file:///dir` mounts a local
directory through pyarrow's LocalFileSystem, which exercises exactly the HDFS code paths
without a cluster.

Arrow filesystems have no ETag: an object's version is its mtime and size, checked before each
ranged read, so an open file never mixes two versions.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import posixpath
from collections.abc import Callable, Iterator
from typing import TypeVar
from urllib.parse import unquote, urlsplit

import pyarrow.fs as pafs

from pffs import metrics
from pffs.backends.base import Capabilities, ObjectInfo, WritableBackend, is_valid_name
from pffs.backends.principal import local_principal
from pffs.config import RetryConfig, SourceConfig
from pffs.errors import (
    BackendError,
    Changed,
    Exists,
    IsADirectory,
    NoSpace,
    NotADirectory,
    NotEmpty,
    NotFound,
    PermissionDenied,
    PffsError,
    Transient,
    UsageError,
)
from pffs.retry import RetryTerms, call_with_retry

T = TypeVar("T")
# Bytes copied per write into an output stream.
COPY_CHUNK = 8 << 20
log = logging.getLogger("pffs.arrow")

_TRANSIENT_ERRNOS = {
    errno.ECONNREFUSED,
    errno.ECONNRESET,
    errno.ECONNABORTED,
    errno.ETIMEDOUT,
    errno.EHOSTUNREACH,
    errno.ENETUNREACH,
    errno.EPIPE,
    errno.EAGAIN,
}


class ArrowBackend:
    """The protocol over a pyarrow filesystem; subclasses provide `_connect`."""

    capabilities = Capabilities(writes=True)
    writer: ArrowBackend  # it takes its writes itself

    def __init__(self, source: SourceConfig, root: str, source_id: str, principal: str) -> None:
        self.source = source
        self.root = root.rstrip("/") or "/"
        self.source_id = source_id
        self.principal = principal
        self.principal_key: bytes | None = None  # no credential of its own
        self.max_concurrency = source.max_concurrency
        self.retry_policy: RetryConfig = source.retry
        self.retries = 0
        self.writer = self
        self._fs: pafs.FileSystem | None = None

    def _connect(self) -> pafs.FileSystem:
        raise NotImplementedError

    @property
    def fs(self) -> pafs.FileSystem:
        # Connecting may start a JVM and talk to a namenode: done once, on first use.
        if self._fs is None:
            self._fs = self._connect()
        return self._fs

    # --- the protocol ------------------------------------------------------------------------

    def check(self) -> None:
        info = self._call(lambda: self.fs.get_file_info(self.root), "stat", "")
        if info.type == pafs.FileType.NotFound:
            raise NotFound(f"{self._where('')} does not exist")
        if info.type != pafs.FileType.Directory:
            raise NotADirectory(f"{self._where('')} is not a directory")
        self._call(lambda: self.fs.get_file_info(self._selector("")), "list", "")

    def probe(self) -> None:
        self.check()  # pyarrow's filesystems own their connections and their timeouts

    def stat(self, path: str, terms: RetryTerms | None = None) -> ObjectInfo:
        full = self._full(path)
        info = self._call(lambda: self.fs.get_file_info(full), "stat", path, terms=terms)
        if info.type == pafs.FileType.NotFound:
            raise NotFound(f"{self._where(path)} does not exist")
        return _object_info(posixpath.basename(path), info)

    def list(self, path: str, terms: RetryTerms | None = None) -> Iterator[ObjectInfo]:
        selector = self._selector(path)
        infos = self._call(
            lambda: self.fs.get_file_info(selector), "list", path, listing=True, terms=terms
        )
        for info in sorted(infos, key=lambda i: i.base_name):
            if (
                is_valid_name(info.base_name)
                and info.type != pafs.FileType.NotFound
                and self._inside_root(info.path)
            ):
                yield _object_info(info.base_name, info)

    def read_range(
        self,
        path: str,
        start: int,
        length: int,
        version: str | None,
        terms: RetryTerms | None = None,
    ) -> bytes:
        full = self._full(path)

        def read() -> bytes:
            if version is not None:
                info = self.fs.get_file_info(full)
                if info.type == pafs.FileType.NotFound:
                    raise FileNotFoundError(errno.ENOENT, "no such file", full)
                if _object_info("", info).version != version:
                    raise Changed(f"{self._where(path)} changed while open")
            with self.fs.open_input_file(full) as f:
                if start >= f.size():
                    return b""
                return bytes(f.read_at(min(length, f.size() - start), start))

        return self._call(read, "read", path, terms=terms)

    # --- writing -----------------------------------------------------------------------------
    # No multipart here: put() streams the staged file through the filesystem's output stream
    # into a temporary name, then moves it over the target, so readers never see half a file.

    def put(self, path: str, local_path: str) -> ObjectInfo:
        full = self._full(path)
        parent, name = posixpath.split(full)
        temporary = posixpath.join(parent, f".{name}.pffs-{os.getpid()}-{id(self):x}")

        def send() -> pafs.FileInfo:
            try:
                with open(local_path, "rb") as src, self.fs.open_output_stream(temporary) as out:
                    while chunk := src.read(COPY_CHUNK):
                        out.write(chunk)
                self.fs.move(temporary, full)
            except BaseException:
                with contextlib.suppress(OSError):
                    self.fs.delete_file(temporary)
                raise
            return self.fs.get_file_info(full)

        return _object_info(name, self._call(send, "write", path))

    def delete(self, path: str) -> None:
        full = self._full(path)
        self._call(lambda: self.fs.delete_file(full), "delete", path)

    def make_dir(self, path: str) -> ObjectInfo:
        full = self._full(path)
        self._call(lambda: self.fs.create_dir(full, recursive=False), "mkdir", path)
        return self.stat(path)

    def remove_dir(self, path: str) -> None:
        full = self._full(path)
        self._call(lambda: self.fs.delete_dir(full), "rmdir", path)

    def rename(self, old: str, new: str) -> None:
        old_full, new_full = self._full(old), self._full(new)
        self._call(lambda: self.fs.move(old_full, new_full), "rename", old)

    # --- helpers -----------------------------------------------------------------------------

    def _full(self, path: str) -> str:
        """The filesystem path of a source-relative path; `..` cannot leave the root."""
        if any(part in ("..", ".") for part in path.split("/")):
            raise PermissionDenied(f"{path!r} escapes the source root {self._where('')}")
        return posixpath.join(self.root, path) if path else self.root

    def _inside_root(self, full: str) -> bool:
        """Whether a listed entry may be shown; filesystems without symlinks show them all."""
        return True

    def _selector(self, path: str) -> pafs.FileSelector:
        return pafs.FileSelector(self._full(path), allow_not_found=False, recursive=False)

    def _where(self, path: str) -> str:
        return f"{self.source_id}/{path}" if path else self.source_id

    def _call(
        self,
        fn: Callable[[], T],
        what: str,
        path: str,
        listing: bool = False,
        terms: RetryTerms | None = None,
    ) -> T:
        try:
            # Counted, timed and logged when slow by pffs.metrics (retries included).
            with metrics.BackendRequest(self.source_id, what, path, self._count_retry) as request:
                result: T = request.received(
                    call_with_retry(
                        fn,
                        is_transient=_is_transient,
                        policy=self.retry_policy,
                        what=f"{what} {self._where(path)}",
                        on_retry=request.retried,
                        terms=terms,
                    )
                )
            return result
        except PffsError:
            raise
        except OSError as exc:
            raise self._translate(exc, path, listing) from exc

    def _count_retry(self, exc: BaseException) -> None:
        self.retries += 1

    def _translate(self, exc: OSError, path: str, listing: bool) -> PffsError:
        where = self._where(path)
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(exc, FileNotFoundError) or exc.errno == errno.ENOENT:
            return NotFound(f"{where} does not exist")
        if isinstance(exc, PermissionError) or exc.errno in (errno.EACCES, errno.EPERM):
            return PermissionDenied(f"{where}: permission denied")
        if isinstance(exc, NotADirectoryError) or exc.errno == errno.ENOTDIR:
            return NotADirectory(f"{where} is not a directory") if listing else NotFound(where)
        if isinstance(exc, IsADirectoryError) or exc.errno == errno.EISDIR:
            return IsADirectory(f"{where} is a directory")
        if exc.errno == errno.ENOTEMPTY:
            return NotEmpty(f"{where} is not empty")
        if isinstance(exc, FileExistsError) or exc.errno == errno.EEXIST:
            return Exists(f"{where} already exists")
        if exc.errno == errno.ENOSPC:
            return NoSpace(f"{where}: no space left")
        if _is_transient(exc):
            return Transient(f"{where}: {text}")
        # Arrow reports some of these only in its message, without an errno.
        lowered = text.lower()
        if "not a directory" in lowered:
            return NotADirectory(f"{where} is not a directory")
        if "not found" in lowered or "does not exist" in lowered:
            return NotFound(f"{where} does not exist")
        return BackendError(f"{where}: {text}")


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    return isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS


def _object_info(name: str, info: pafs.FileInfo) -> ObjectInfo:
    is_dir = info.type == pafs.FileType.Directory
    mtime_ns = info.mtime_ns or 0
    return ObjectInfo(
        name=name,
        size=0 if is_dir else int(info.size or 0),
        mtime=mtime_ns / 1e9,
        etag=None,
        is_dir=is_dir,
    )


class ArrowLocalBackend(ArrowBackend):
    """`arrow+file:///dir`: a local directory through pyarrow's LocalFileSystem."""

    def __init__(self, source: SourceConfig) -> None:
        parts = urlsplit(source.url)
        path = unquote(parts.path)
        if parts.netloc not in ("", "localhost") or not path.startswith("/"):
            raise UsageError(f"malformed URL {source.url!r}: use arrow+file:///absolute/path")
        root = os.path.realpath(path)
        super().__init__(source, root, f"arrow+file://{root}", local_principal())

    def _connect(self) -> pafs.FileSystem:
        return pafs.LocalFileSystem()

    def _inside_root(self, full: str) -> bool:
        # A symlink leading out of the root is hidden from listings, as backends/local.py does;
        # opening it by name is refused by _full.
        real = os.path.realpath(full)
        return real == self.root or real.startswith(self.root + os.sep)

    def _full(self, path: str) -> str:
        # A local tree can hold symlinks, which arrow follows: confine their targets too.
        full = os.path.realpath(super()._full(path))
        if full != self.root and not full.startswith(self.root + os.sep):
            raise PermissionDenied(f"{path!r} escapes the source root {self.root}")
        return full


# What ArrowBackend declares, checked by mypy.
_ARROW: type[WritableBackend] = ArrowLocalBackend
