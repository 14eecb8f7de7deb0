"""Mounting: the preflight checks, serving in this process, or handing off to a daemon.

`mount(config)` is what every front end calls. In the foreground it serves until unmounted. In
the background (the default for `pffs mount`) it starts a daemon in its own session, so the
mount outlives the shell or the CSI driver that asked for it, and returns only once the daemon
reports the mount live, or with the daemon's own one-line error.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import gc
import logging
import os
import resource
import select
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence

from pffs.backends import open_backend
from pffs.cache.blocks import BlockCache
from pffs.config import CacheConfig, MountConfig, TableEntry, from_json, to_json
from pffs.errors import CacheDirError, MountFailed, PffsError
from pffs.fs.vfs import Vfs
from pffs.fuse_ops import PffsOperations, serve
from pffs.mounting.kernel import prepare_mountpoint, set_kernel_readahead
from pffs.mounting.observe import start_observing
from pffs.mounting.recovery import recover_staged
from pffs.routing.table import Mounted, MountTable

log = logging.getLogger("pffs.mounting.daemon")
READY_FD_ENV = "PFFS_READY_FD"
# mallopt parameters, from glibc's malloc.h
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
# How long `pffs mount` waits for the daemon: the preflight checks have their own short bounds,
# so this only trips when something is badly wrong.
DAEMON_START_TIMEOUT = 60.0


class DaemonError(PffsError):
    """An error the daemon reported before the mount came up, with the daemon's exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def serve_here(config: MountConfig, on_ready: Callable[[], None] | None = None) -> None:
    """Check everything that can be checked, mount, and serve until unmounted."""
    table = open_table(config.table)
    mountpoint = prepare_mountpoint(config.fuse.mountpoint)
    for mounted in table.mounted:
        with _naming_entry(mounted.path, len(table.mounted)):
            mounted.backend.check()
    # Cache blocks and logs hold the user's data: nobody else may read what this process writes.
    os.umask(0o077)
    tune_malloc(config.cache.block_size)
    raise_descriptor_limit()
    cache = open_cache(config.cache)
    try:
        vfs = Vfs(
            table,
            config.meta,
            config.fuse,
            cache,
            staging_dir=staging_dir(config),
            dataset=config.dataset,
        )
    except OSError as exc:
        raise CacheDirError(f"staging directory {staging_dir(config)}: {exc.strerror}") from None
    if not config.fuse.read_only:
        recover_staged(staging_dir(config), table.mounted, notify=note_to_parent)
    stop_observing = start_observing(config, vfs)
    for mounted in table.mounted:
        log.info("mounting %s at %s/%s", mounted.backend.source_id, mountpoint, mounted.path)
    record = register_mount(mountpoint, config)
    freeze_startup_objects()
    try:
        if cache.disk is not None:  # files a crash left unindexed: swept while the mount serves
            cache.disk.sweep_in_background()
        serve(
            PffsOperations(vfs, config),
            mountpoint,
            on_ready,
            after_init=lambda: set_kernel_readahead(mountpoint, config.fuse.kernel_readahead),
        )
    finally:
        stop_observing()
        log.info("cache counters at exit: %s", cache.stats.as_dict())
        retries = {m.backend.source_id: m.backend.retries for m in table.mounted}
        log.info("transient store failures retried: %s", retries)
        cache.close()
        with contextlib.suppress(OSError):
            os.unlink(record)


def open_table(entries: Sequence[TableEntry]) -> MountTable:
    """Backends for every entry (no network traffic yet), as the VFS's routing table."""
    mounted = []
    for entry in entries:
        with _naming_entry(entry.path, len(entries)):
            backend = open_backend(entry.source)
        read_only = entry.source.read_only
        mounted.append(Mounted(entry.path, backend, read_only, entry.cache == "disk"))
    return MountTable(mounted)


@contextlib.contextmanager
def _naming_entry(path: str, entries: int) -> Iterator[None]:
    """Prefix an error with the mount table entry it came from, when there are several."""
    try:
        yield
    except PffsError as exc:
        if entries == 1:
            raise
        exc.args = (f"mount table entry /{path}: {exc}",)
        raise


def raise_descriptor_limit() -> None:
    """Raise the soft limit on open files to the hard one.

    The disk tier keeps verified entries open, as many as a share of the soft limit allows
    (pffs.cache.openentries); systemd and many shells start services at a soft limit of 1,024
    under a hard one of 500,000 or more, which would hold only 256 entries open.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:  # a hard limit the kernel refuses (nr_open)
            log.debug("open-file limit stays at %d: %s", soft, exc)


def tune_malloc(block_size: int) -> None:
    """Reuse freed cache blocks' memory without letting it inflate the resident set (glibc).

    By default glibc serves 4 MiB blocks with mmap until the first is freed, then raises its
    threshold, after which they come from per-thread arenas that keep their memory: with two
    dozen worker threads that held the RSS at twice the cache's bound. A fresh mmap per block
    is no better for speed: every 4 KiB page of it faults and is zeroed by the kernel, about
    3 ms of CPU per block here, paid on every block fetched or read from disk.

    So: one arena (the threads mostly wait on sockets and disks, so contention is rare), and
    blocks from the heap, where a freed block is reused in place; anything larger than a block
    (upload parts, at 8 MiB) still gets its own mapping, returned to the kernel when freed, so
    it never leaves holes in the heap. Free memory at the heap's top is kept up to 64 MiB.
    """
    threshold = min(block_size + 64 * 1024, 32 * 1024 * 1024)  # glibc's maximum is 32 MiB
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(M_MMAP_THRESHOLD, threshold)
        libc.mallopt(M_TRIM_THRESHOLD, 64 * 1024 * 1024)
        libc.mallopt(M_ARENA_MAX, 1)
    except (OSError, AttributeError):
        pass


def freeze_startup_objects() -> None:
    """Keep what the mount's startup made out of the garbage collector's passes (gc.freeze).

    The imports (boto3's service models above all), the backends and the cache are most of
    the objects the process ever holds, and none of them is garbage; yet each full pass of the
    collector scans every tracked object: a remounted epoch of 2,000 files paid three such
    passes of about 40 ms each (bench/epoch_cpu.py --remount). Frozen, they are never scanned
    again; what the mount makes later is collected as before.
    """
    gc.collect()
    gc.freeze()


def staging_dir(config: MountConfig) -> str:
    """Where written data waits for upload: beside the disk cache, else in the state dir."""
    base = config.cache.disk_dir or state_dir()
    return os.path.join(base, "staging")


def state_dir() -> str:
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(state, "pffs")


def _escaped(mountpoint: str) -> str:
    return os.path.abspath(mountpoint).strip("/").replace("/", "_") or "root"


def registry_path(mountpoint: str) -> str:
    """Where a live mount records its configuration (for `pffs warmup` inside the mount)."""
    return os.path.join(state_dir(), "mounts", f"{_escaped(mountpoint)}.json")


def register_mount(mountpoint: str, config: MountConfig) -> str:
    path = registry_path(mountpoint)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(to_json(config))
    return path


def registered_config(mountpoint: str) -> MountConfig | None:
    try:
        with open(registry_path(mountpoint), encoding="utf-8") as f:
            return from_json(f.read())
    except (OSError, ValueError, KeyError, TypeError):
        return None


def open_cache(config: CacheConfig) -> BlockCache:
    """The block cache, or a one-line error when its directory cannot be used.

    A full disk is no reason to refuse a mount: the disk tier is then left out (a warning
    says so) and reads go around it, from memory and the store.
    """
    try:
        return BlockCache(config)
    except (OSError, sqlite3.Error) as exc:
        if _disk_full(exc):
            log.warning("cache directory %s: disk full, caching in memory only", config.disk_dir)
            return BlockCache(dataclasses.replace(config, disk_dir=None))
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise CacheDirError(f"cache directory {config.disk_dir}: {detail}") from None


def _disk_full(exc: BaseException) -> bool:
    if isinstance(exc, OSError):
        return exc.errno == errno.ENOSPC
    return "full" in str(exc).lower()  # sqlite3: "database or disk is full"


def default_log_path(mountpoint: str) -> str:
    return os.path.join(state_dir(), "log", f"{_escaped(mountpoint)}.log")


def start_daemon(config: MountConfig) -> tuple[int, str]:
    """Start a daemon serving `config`; return (pid, log path) once the mount is live."""
    log_path = config.log_file or default_log_path(config.fuse.mountpoint)
    os.makedirs(os.path.dirname(log_path), mode=0o700, exist_ok=True)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    read_end, write_end = os.pipe()
    env = dict(os.environ, **{READY_FD_ENV: str(write_end)})
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pffs", "_daemon"],
            stdin=subprocess.PIPE,
            stdout=log_fd,
            stderr=log_fd,
            pass_fds=(write_end,),
            env=env,
            start_new_session=True,  # survives the caller's terminal and process group
        )
    finally:
        os.close(write_end)
        os.close(log_fd)
    assert proc.stdin is not None
    proc.stdin.write(to_json(config).encode())
    proc.stdin.close()
    try:
        message = _read_report(read_end, proc)
    finally:
        os.close(read_end)
    if message == "ok":
        return proc.pid, log_path
    code, _, text = message.partition(" ")
    if code.isdigit():
        raise DaemonError(text, int(code))
    raise MountFailed(f"the pffs daemon failed to start: {message} (log: {log_path})")


def _read_report(fd: int, proc: subprocess.Popen[bytes]) -> str:
    """The daemon's report: 'ok', or '<exit code> <message>'.

    Lines 'note <text>' before it are printed on stderr (what the user must know, such as
    staged writes recovered or kept) and show the daemon is busy: each restarts the clock.
    """
    deadline = time.monotonic() + DAEMON_START_TIMEOUT
    buffer = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                text = line.decode(errors="replace")
                if not text.startswith("note "):
                    return text
                sys.stderr.write(f"pffs: {text[5:]}\n")
                deadline = time.monotonic() + DAEMON_START_TIMEOUT
    if buffer:
        return buffer.decode(errors="replace").strip()
    status = proc.poll()
    if status is None:
        proc.terminate()
        return f"no answer within {DAEMON_START_TIMEOUT:.0f}s"
    return f"exited with status {status}"


def note_to_parent(line: str) -> None:
    """A line for the stderr of the `pffs mount` that started this daemon (if any)."""
    fd_text = os.environ.get(READY_FD_ENV)
    if fd_text is None:
        return
    with contextlib.suppress(OSError):  # the parent is gone
        os.write(int(fd_text), ("note " + line.replace("\n", " ") + "\n").encode())


def report_to_parent(line: str) -> None:
    """Send the daemon's first report line to the `pffs mount` that started it."""
    fd_text = os.environ.pop(READY_FD_ENV, None)
    if fd_text is None:
        return
    fd = int(fd_text)
    try:
        os.write(fd, (line.replace("\n", " ") + "\n").encode())
        os.close(fd)
    except OSError:
        pass  # the parent is gone; nothing to tell
