"""A directory on local disk as a source (`file:///dir`).

Useful on its own (a dataset on a shared NFS path, cached on fast local disk) and as the
reference backend for the contract tests. Paths are confined to the root, also against a tree
changing meanwhile: every operation opens its path beneath the root's descriptor in one walk
that follows no symlink and no `..` (backends.beneath), then acts on what it opened. A symlink
in the tree is neither listed nor followed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
import threading
from collections.abc import Callable, Iterator
from urllib.parse import unquote, urlsplit

from pffs.backends import beneath
from pffs.backends.base import Capabilities, ObjectInfo, WritableBackend, is_valid_name
from pffs.backends.principal import local_principal
from pffs.config import SourceConfig
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
    UsageError,
)
from pffs.retry import RetryTerms

# A new file: created here, never through a name that exists (a symlink planted there).
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class LocalBackend:
    """file:///absolute/dir"""

    capabilities = Capabilities(writes=True)
    writer: LocalBackend  # it takes its writes itself

    def __init__(self, source: SourceConfig) -> None:
        parts = urlsplit(source.url)
        if parts.netloc not in ("", "localhost"):
            raise UsageError(f"malformed URL {source.url!r}: use file:///absolute/path")
        path = unquote(parts.path)
        if not path.startswith("/"):
            raise UsageError(f"malformed URL {source.url!r}: use file:///absolute/path")
        self.root = os.path.realpath(path)
        self.source_id = f"file://{self.root}"
        self.principal = local_principal()
        self.principal_key: bytes | None = None  # no credential of its own
        self.max_concurrency = source.max_concurrency
        self.retries = 0  # local files are never retried
        self.writer = self
        self._root: int | None = None
        self._root_lock = threading.Lock()

    # --- the protocol ------------------------------------------------------------------------

    def check(self) -> None:
        try:
            st = os.stat(self.root)
        except OSError as exc:
            raise self._translate(exc, "") from exc
        if not stat.S_ISDIR(st.st_mode):
            raise NotADirectory(f"{self.root} is not a directory")
        if not os.access(self.root, os.R_OK | os.X_OK):
            raise PermissionDenied(f"{self.root} is not readable")

    def probe(self) -> None:
        self.check()  # a local call: no connection to hang

    # A local directory is never retried: a read's terms (pffs.retry) have nothing to bound.

    def stat(self, path: str, terms: RetryTerms | None = None) -> ObjectInfo:
        try:
            with self._opened(path, os.O_PATH) as fd:
                st = os.fstat(fd)
        except OSError as exc:
            raise self._translate(exc, path) from exc
        return _info(os.path.basename(path), st)

    def list(self, path: str, terms: RetryTerms | None = None) -> Iterator[ObjectInfo]:
        try:
            with self._opened(path, os.O_RDONLY | os.O_DIRECTORY) as fd:
                with os.scandir(fd) as it:
                    entries = sorted(it, key=lambda e: e.name)
                infos = []
                for entry in entries:
                    # A symlink is never followed (an open of one is refused): not listed.
                    if not is_valid_name(entry.name) or entry.is_symlink():
                        continue
                    try:
                        infos.append(_info(entry.name, entry.stat(follow_symlinks=False)))
                    except OSError:  # gone since the listing
                        continue
        except OSError as exc:
            raise self._translate(exc, path, listing=True) from exc
        yield from infos

    def read_range(
        self,
        path: str,
        start: int,
        length: int,
        version: str | None,
        terms: RetryTerms | None = None,
    ) -> bytes:
        try:
            with self._opened(path, os.O_RDONLY) as fd:
                if version is not None:
                    current = _info("", os.fstat(fd)).version
                    if current != version:
                        raise Changed(f"{self.source_id}/{path} changed while open")
                return os.pread(fd, length, start)
        except OSError as exc:
            raise self._translate(exc, path) from exc

    # --- writing -----------------------------------------------------------------------------

    def put(self, path: str, local_path: str) -> ObjectInfo:
        try:
            with self._parent(path) as (parent, name):
                # Written beside the target and renamed over it: readers never see half a file.
                temporary = f".{name}.pffs-{secrets.token_hex(6)}"
                fd = os.open(temporary, _CREATE, 0o600, dir_fd=parent)
                try:
                    with os.fdopen(fd, "wb") as out, open(local_path, "rb") as src:
                        shutil.copyfileobj(src, out, 8 << 20)
                        out.flush()
                        os.fsync(out.fileno())
                        os.fchmod(out.fileno(), 0o644)  # 0600 would hide it from other readers
                    os.replace(temporary, name, src_dir_fd=parent, dst_dir_fd=parent)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(temporary, dir_fd=parent)
                    raise
                return _info(name, os.stat(name, dir_fd=parent, follow_symlinks=False))
        except OSError as exc:
            raise self._translate(exc, path) from exc

    def delete(self, path: str) -> None:
        self._at(path, lambda parent, name: os.unlink(name, dir_fd=parent))

    def make_dir(self, path: str) -> ObjectInfo:
        self._at(path, lambda parent, name: os.mkdir(name, 0o755, dir_fd=parent))
        return self.stat(path)

    def remove_dir(self, path: str) -> None:
        self._at(path, lambda parent, name: os.rmdir(name, dir_fd=parent))

    def rename(self, old: str, new: str) -> None:
        try:
            with (
                self._parent(old) as (old_parent, old_name),
                self._parent(new) as (
                    new_parent,
                    new_name,
                ),
            ):
                os.rename(old_name, new_name, src_dir_fd=old_parent, dst_dir_fd=new_parent)
        except OSError as exc:
            raise self._translate(exc, old) from exc

    def _at(self, path: str, act: Callable[[int, str], object]) -> None:
        """`act(parent descriptor, name)` on `path`'s last name, which it never follows."""
        try:
            with self._parent(path) as (parent, name):
                act(parent, name)
        except OSError as exc:
            raise self._translate(exc, path) from exc

    # --- helpers -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _opened(self, path: str, flags: int) -> Iterator[int]:
        """A descriptor of `path`, opened beneath the root in one walk (backends.beneath)."""
        with beneath.opened(self._root_fd(), path.strip("/"), flags) as fd:
            yield fd

    @contextlib.contextmanager
    def _parent(self, path: str) -> Iterator[tuple[int, str]]:
        with beneath.parent_of(self._root_fd(), path) as parent:
            yield parent

    def _root_fd(self) -> int:
        """The root's descriptor, opened once (the admin's path; everything under it is
        walked from here)."""
        with self._root_lock:
            if self._root is None:
                self._root = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            return self._root

    def _translate(self, exc: OSError, path: str, listing: bool = False) -> PffsError:
        where = os.path.join(self.root, path) if path else self.root
        if exc.errno == errno.ENOENT or (exc.errno == errno.ENOTDIR and not listing):
            # "a/b" where a is a file does not exist, as on S3.
            return NotFound(f"{where} does not exist")
        if exc.errno in (errno.EACCES, errno.EPERM):
            return PermissionDenied(f"{where}: permission denied")
        if exc.errno in (errno.ELOOP, errno.EXDEV):
            return PermissionDenied(
                f"{path!r} escapes the source root {self.root} (a symlink or ..)"
            )
        if exc.errno == errno.ENOTDIR:
            return NotADirectory(f"{where} is not a directory")
        if exc.errno == errno.ENOTEMPTY:
            return NotEmpty(f"{where} is not empty")
        if exc.errno == errno.EEXIST:
            return Exists(f"{where} already exists")
        if exc.errno == errno.EISDIR:
            return IsADirectory(f"{where} is a directory")
        if exc.errno == errno.ENOSPC:
            return NoSpace(f"{where}: no space left")
        return BackendError(f"{where}: {exc.strerror}")


def _info(name: str, st: os.stat_result) -> ObjectInfo:
    is_dir = stat.S_ISDIR(st.st_mode)
    return ObjectInfo(
        name=name,
        size=0 if is_dir else st.st_size,
        mtime=st.st_mtime_ns / 1e9,
        etag=None,
        is_dir=is_dir,
    )


# What LocalBackend declares, checked by mypy.
_LOCAL: type[WritableBackend] = LocalBackend
