"""Staged writes: the local files written data lands in, and their uploads to the store.

Object stores cannot change part of an object, so a file open for writing is a local file (the
"staging file", under the cache directory) until it is committed: on close and on fsync its
whole content is uploaded, and only then does close or fsync return. A failed upload returns
its error and leaves the staging file where it is (logged with its path), so nothing a writer
was told is written can be lost. Each staging file has a small manifest beside it naming its
source and path, so a restarted pffs can upload or report what a crash left behind
(pffs.mounting.recovery). The manifest's `state` says what the data is: "writing" (changed,
still open), "closed" (closed by its writer but not uploaded: complete, to upload) or "clean"
(the store holds these bytes). While a process has a staging file open it holds a flock on it, so a
recovery never touches the file of a live mount sharing the cache directory.

Large files go up in parts (S3 multipart), several at a time, each part one call holding a
reader permit of the source's flow (pffs.flow.permits), so uploads share the store fairly with
reads.

Threading rule as in the cache: worker threads only move bytes (pread/pwrite on the staging
file descriptor, the store calls); the Staged records are touched only from trio tasks.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import trio

from pffs.backends.base import (
    MultipartBackend,
    ObjectInfo,
    PartLimits,
    WritableBackend,
    multipart,
    writable,
)
from pffs.errors import NoSpace, PffsError, Unsupported
from pffs.privatefiles import private_dir
from pffs.routing.table import Mounted

T = TypeVar("T")
log = logging.getLogger("pffs.fs.staging")

# The size of parts, where the store's PartLimits allow it.
PART_SIZE = 8 << 20
# Objects up to this size go up in one PUT: below it, parts only add requests.
MULTIPART_THRESHOLD = 16 << 20
# Parts of one file in flight at once (the staging file's bytes read at once); the source's reader
# permits bound all its calls together (pffs.flow.permits).
PARTS_IN_FLIGHT = 4
# Bytes per store read when an existing object is fetched into a staging file.
FETCH_CHUNK = 8 << 20

Run = Callable[..., Awaitable[Any]]


@dataclass(eq=False)
class Staged:
    """One file's local copy while it is open for writing (shared by all its write handles)."""

    mounted: Mounted
    path_in_source: str
    file: str
    fd: int
    size: int = 0
    # Changed since the last successful upload (a new, empty file counts as changed).
    dirty: bool = True
    handles: int = 0
    # Unlinked while open: its data must not reappear in the store at close.
    unlinked: bool = False
    lock: trio.Lock = field(default_factory=trio.Lock)
    # Parts already on their way while the file is written front to back (see StreamingUpload).
    streaming: StreamingUpload | None = None
    # (size, version) of the existing object whose bytes are not copied in yet: opening it for
    # writing copies them lazily, and a truncate to zero before that skips the copy.
    unfilled: tuple[int, str] | None = None

    @property
    def where(self) -> str:
        return f"{self.mounted.backend.source_id}/{self.path_in_source}"


class StagingArea:
    """The directory of staging files (0700; files 0600: they hold the user's data)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        private_dir(directory)  # never chmod through another user's symlink

    def create(self, mounted: Mounted, path_in_source: str, state: str = "writing") -> Staged:
        """A new, empty staging file for `path_in_source` (blocking: run in a thread)."""
        try:
            fd, file = tempfile.mkstemp(dir=self.directory, prefix="w-", suffix=".data")
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # "in use by a live process"
            staged = Staged(mounted, path_in_source, file, fd)
            write_manifest(staged, state)
        except OSError as exc:
            raise _staging_error(exc, self.directory) from None
        return staged

    @staticmethod
    def discard(staged: Staged) -> None:
        """Close and remove a staging file whose data is in the store (or was unlinked)."""
        _close(staged)
        for path in (staged.file, manifest_path(staged.file)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    @staticmethod
    def keep(staged: Staged) -> None:
        """Close a staging file that could not be uploaded, leaving it for recovery."""
        with contextlib.suppress(OSError):  # the data file itself is what matters
            write_manifest(staged, "closed")
        _close(staged)
        log.error("%s: not uploaded; its data is kept in %s", staged.where, staged.file)


def write_manifest(staged: Staged, state: str) -> None:
    """Record the staging file's source, principal, path and state beside it (blocking,
    atomic)."""
    manifest = {
        "source": staged.mounted.backend.source_id,
        "principal": staged.mounted.backend.principal,
        "path": staged.path_in_source,
        "state": state,
        "updated": time.time(),
        "pid": os.getpid(),
    }
    target = manifest_path(staged.file)
    temporary = target + ".tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(manifest, f)
    os.replace(temporary, target)


def manifest_path(file: str) -> str:
    return file.removesuffix(".data") + ".json"


def _close(staged: Staged) -> None:
    if staged.fd >= 0:
        os.close(staged.fd)
        staged.fd = -1


def _staging_error(exc: OSError, where: str) -> PffsError:
    if exc.errno == 28:  # ENOSPC: the writer is told; readers never see it
        return NoSpace(f"staging area {where} is full")
    return PffsError(f"staging area {where}: {exc.strerror or exc}")


def write_at(staged: Staged, offset: int, data: bytes) -> int:
    """pwrite into the staging file (blocking)."""
    try:
        view = memoryview(data)
        written = 0
        while written < len(view):
            written += os.pwrite(staged.fd, view[written:], offset + written)
        return written
    except OSError as exc:
        raise _staging_error(exc, staged.file) from None


def read_at(staged: Staged, offset: int, length: int) -> bytes:
    return os.pread(staged.fd, length, offset)


def truncate(staged: Staged, size: int) -> None:
    try:
        os.ftruncate(staged.fd, size)
    except OSError as exc:
        raise _staging_error(exc, staged.file) from None


async def fill_from_store(staged: Staged, size: int, version: str, run: Run) -> None:
    """Copy the object's current bytes into the staging file (to overwrite part of it)."""
    mounted = staged.mounted
    for start in range(0, size, FETCH_CHUNK):
        length = min(FETCH_CHUNK, size - start)
        data = await run(
            mounted.flow.permit("reader"),
            mounted.backend.read_range,
            staged.path_in_source,
            start,
            length,
            version,
        )
        await run(
            mounted.flow.permit("reader"), write_at, staged, start, data
        )  # one request, then its write
    staged.size = size


async def upload(staged: Staged, run: Run) -> ObjectInfo:
    """Put the staging file's content in the store; returns what the store now holds."""
    streaming, staged.streaming = staged.streaming, None
    if streaming is not None:
        streamed = await streaming.finish()
        if streamed is not None:
            return streamed
    mounted = staged.mounted
    path = staged.path_in_source
    backend = multipart(mounted.backend)
    if backend is None or staged.size <= MULTIPART_THRESHOLD:
        info: ObjectInfo = await run(
            mounted.flow.permit("reader"), _writable(mounted).put, path, staged.file
        )
        return info
    part_size = _part_size(mounted, staged.size)
    count = -(-staged.size // part_size)
    upload_id: str = await run(mounted.flow.permit("reader"), backend.begin_upload, path)
    etags: dict[int, str] = {}
    try:
        await _send_parts(staged, run, upload_id, part_size, range(count), etags)
        return await _complete(staged, run, upload_id, count, etags)
    except BaseException as failure:
        with trio.CancelScope(shield=True):
            await _abort(staged, run, upload_id)
        raise _first_error(failure) from None


async def _send_parts(
    staged: Staged,
    run: Run,
    upload_id: str,
    part_size: int,
    indices: range,
    etags: dict[int, str],
) -> None:
    """Upload parts `indices` of the staging file, PARTS_IN_FLIGHT at a time."""
    mounted = staged.mounted
    backend = _multipart(mounted)
    slots = trio.Semaphore(PARTS_IN_FLIGHT)

    async def send(index: int) -> None:
        async with slots:
            offset = index * part_size
            etags[index] = await run(
                mounted.flow.permit("reader"),
                backend.upload_part,
                staged.path_in_source,
                upload_id,
                index + 1,
                staged.file,
                offset,
                min(part_size, staged.size - offset),
            )

    async with trio.open_nursery() as nursery:
        for index in indices:
            nursery.start_soon(send, index)


async def _complete(
    staged: Staged, run: Run, upload_id: str, count: int, etags: dict[int, str]
) -> ObjectInfo:
    mounted = staged.mounted
    backend = _multipart(mounted)
    ordered = [etags[index] for index in range(count)]
    info: ObjectInfo = await run(
        mounted.flow.permit("reader"),
        backend.finish_upload,
        staged.path_in_source,
        upload_id,
        ordered,
        staged.size,
    )
    return info


async def _abort(staged: Staged, run: Run, upload_id: str) -> None:
    mounted = staged.mounted
    backend = _multipart(mounted)
    try:
        await run(
            mounted.flow.permit("reader"), backend.abort_upload, staged.path_in_source, upload_id
        )
    except PffsError as exc:  # the store expires abandoned uploads by its own rules
        log.warning("%s: could not abort upload %s: %s", staged.where, upload_id, exc)


class StreamingUpload:
    """The parts of a file written front to back, uploaded while it is still being written.

    A sequential writer (a checkpoint, a log being copied in) then waits at close only for the
    last part and the completion, not for the whole upload. A write behind what was already
    sent, a truncate or a failed part gives up on it: the commit then aborts it and uploads the
    whole file as usual. Only files that start empty stream, and only on multipart stores.
    """

    def __init__(self, staged: Staged, run: Run, nursery: trio.Nursery) -> None:
        self.staged = staged
        self.run = run
        self.nursery = nursery
        self.upload_id: str | None = None
        self.sent = 0  # parts handed out: 0 .. sent-1
        self.etags: dict[int, str] = {}
        self.usable = True
        self._running = 0
        self._idle = trio.Event()
        self._idle.set()
        self._begin_lock = trio.Lock()
        self._slots = trio.Semaphore(PARTS_IN_FLIGHT)
        self.part_size = _part_size(staged.mounted, 0)
        self.max_parts = _part_limits(staged.mounted).max_count

    def wrote(self, offset: int) -> None:
        """After a write at `offset` (the staged size already updated): send completed parts."""
        if offset < self.sent * self.part_size:
            self.usable = False  # bytes already sent changed
        if not self.usable or self.staged.size <= MULTIPART_THRESHOLD:
            return  # a small file goes up in one PUT at close
        while (self.sent + 1) * self.part_size <= self.staged.size:
            if self.sent >= self.max_parts - 1:  # too large for streamed parts: whole upload later
                self.usable = False
                return
            if self._running == 0:
                self._idle = trio.Event()
            self._running += 1
            self.nursery.start_soon(self._send, self.sent)
            self.sent += 1

    def give_up(self) -> None:
        self.usable = False

    async def _send(self, index: int) -> None:
        staged = self.staged
        try:
            async with self._slots:
                if not self.usable:
                    return
                async with self._begin_lock:
                    if self.upload_id is None:
                        mounted = staged.mounted
                        backend = _multipart(mounted)
                        path = staged.path_in_source
                        self.upload_id = await self.run(
                            mounted.flow.permit("reader"), backend.begin_upload, path
                        )
                await _send_parts(
                    staged,
                    self.run,
                    self.upload_id,
                    self.part_size,
                    range(index, index + 1),
                    self.etags,
                )
        except Exception as exc:  # the commit uploads everything again and reports for real
            log.info(
                "%s: streamed part %d failed (%s); uploading at close", staged.where, index, exc
            )
            self.usable = False
        finally:
            self._running -= 1
            if self._running == 0:
                self._idle.set()

    async def finish(self) -> ObjectInfo | None:
        """Complete the upload with the remaining parts, or None (aborted) when it cannot be."""
        await self._idle.wait()
        staged = self.staged
        part_size = self.part_size
        if self.usable and self.upload_id is not None and self.sent * part_size <= staged.size:
            count = -(-staged.size // part_size)
            try:
                rest = range(self.sent, count)
                await _send_parts(staged, self.run, self.upload_id, part_size, rest, self.etags)
                return await _complete(staged, self.run, self.upload_id, count, self.etags)
            except BaseException as failure:
                with trio.CancelScope(shield=True):
                    await _abort(staged, self.run, self.upload_id)
                raise _first_error(failure) from None
        if self.upload_id is not None:
            await _abort(staged, self.run, self.upload_id)
        return None


def _first_error(exc: BaseException) -> BaseException:
    """The part failure inside a nursery's exception group, so callers see a pffs error."""
    while isinstance(exc, BaseExceptionGroup):
        inner = [e for e in exc.exceptions if not isinstance(e, trio.Cancelled)]
        exc = (inner or list(exc.exceptions))[0]
    return exc


def _writable(mounted: Mounted) -> WritableBackend:
    backend = writable(mounted.backend)
    if backend is None:
        raise Unsupported(f"{mounted.backend.source_id} does not take writes")
    return backend


def _multipart(mounted: Mounted) -> MultipartBackend:
    backend = multipart(mounted.backend)
    if backend is None:  # only reached through a store that declared it
        raise Unsupported(f"{mounted.backend.source_id} does not take uploads in parts")
    return backend


def _part_limits(mounted: Mounted) -> PartLimits:
    limits = mounted.backend.capabilities.multipart
    if limits is None:  # only reached through a store that declared it
        raise Unsupported(f"{mounted.backend.source_id} does not take uploads in parts")
    return limits


def _part_size(mounted: Mounted, total: int) -> int:
    """The parts' size for an upload of `total` bytes (0: not known yet), in the store's limits."""
    try:
        return _part_limits(mounted).part_size(total, PART_SIZE)
    except ValueError as exc:
        raise NoSpace(f"{mounted.backend.source_id}: {exc}") from exc
