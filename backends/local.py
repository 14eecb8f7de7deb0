"""A directory on local disk as a source (`file:///dir`).

Useful on its own (a dataset on a shared NFS path, cached on fast local disk) and as the
reference backend for the contract tests. Paths are confined to the root: neither `..` nor a
symlink can reach outside it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from urllib.parse import unquote, urlsplit

from pffs.backends.base import Capabilities, ObjectInfo, WritableBackend, is_valid_name
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
        self.max_concurrency = source.max_concurrency
        self.retries = 0  # local files are never retried
        self.writer = self

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

    def stat(self, path: str) -> ObjectInfo:
        full = self._resolve(path)
        try:
            st = os.stat(full)
        except OSError as exc:
            raise self._translate(exc, path) from exc
        return _info(os.path.basename(path), st)

    def list(self, path: str) -> Iterator[ObjectInfo]:
        full = self._resolve(path)
        try:
            with os.scandir(full) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            raise self._translate(exc, path, listing=True) from exc
        for entry in entries:
            if not is_valid_name(entry.name):
                continue
            try:
                st = entry.stat()  # follows symlinks; a dangling one is skipped below
            except OSError:
                continue
            if entry.is_symlink() and not self._inside(os.path.realpath(entry.path)):
                continue
            yield _info(entry.name, st)

    def read_range(self, path: str, start: int, length: int, version: str | None) -> bytes:
        full = self._resolve(path)
        try:
            fd = os.open(full, os.O_RDONLY)
        except OSError as exc:
            raise self._translate(exc, path) from exc
        try:
            if version is not None:
                current = _info("", os.fstat(fd)).version
                if current != version:
                    raise Changed(f"{self.source_id}/{path} changed while open")
            return os.pread(fd, length, start)
        except OSError as exc:
            raise self._translate(exc, path) from exc
        finally:
            os.close(fd)

    # --- writing -----------------------------------------------------------------------------

    def put(self, path: str, local_path: str) -> ObjectInfo:
        full = self._resolve(path)
        parent, name = os.path.split(full)
        try:
            # Written beside the target and renamed over it: readers never see half a file.
            fd, temporary = tempfile.mkstemp(dir=parent, prefix=f".{name}.pffs-")
            try:
                with os.fdopen(fd, "wb") as out, open(local_path, "rb") as src:
                    shutil.copyfileobj(src, out, 8 << 20)
                    out.flush()
                    os.fsync(out.fileno())
                os.chmod(temporary, 0o644)  # mkstemp's 0600 would hide it from other readers
                os.replace(temporary, full)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                raise
            return _info(name, os.stat(full))
        except OSError as exc:
            raise self._translate(exc, path) from exc

    def delete(self, path: str) -> None:
        self._os(os.unlink, path)

    def make_dir(self, path: str) -> ObjectInfo:
        self._os(os.mkdir, path)
        return self.stat(path)

    def remove_dir(self, path: str) -> None:
        self._os(os.rmdir, path)

    def rename(self, old: str, new: str) -> None:
        old_full, new_full = self._resolve(old), self._resolve(new)
        try:
            os.rename(old_full, new_full)
        except OSError as exc:
            raise self._translate(exc, old) from exc

    def _os(self, fn: Callable[[str], object], path: str) -> None:
        full = self._resolve(path)
        try:
            fn(full)
        except OSError as exc:
            raise self._translate(exc, path) from exc

    # --- helpers -----------------------------------------------------------------------------

    def _inside(self, real: str) -> bool:
        return real == self.root or real.startswith(self.root + os.sep)

    def _resolve(self, path: str) -> str:
        full = os.path.realpath(os.path.join(self.root, path))
        if not self._inside(full):
            raise PermissionDenied(f"{path!r} escapes the source root {self.root}")
        return full

    def _translate(self, exc: OSError, path: str, listing: bool = False) -> PffsError:
        where = os.path.join(self.root, path) if path else self.root
        if exc.errno == errno.ENOENT or (exc.errno == errno.ENOTDIR and not listing):
            # "a/b" where a is a file does not exist, as on S3.
            return NotFound(f"{where} does not exist")
        if exc.errno in (errno.EACCES, errno.EPERM):
            return PermissionDenied(f"{where}: permission denied")
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
