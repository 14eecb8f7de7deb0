"""The serving process's own settings: glibc's malloc, the open-file limit, the collector.

A mount is one long-lived process that holds most of its memory in cache blocks and keeps disk
entries open; the defaults of glibc, the shell and Python's garbage collector suit neither.
`serve_here` applies all three before it serves.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import resource

log = logging.getLogger("pffs.mounting.process")
# mallopt parameters, from glibc's malloc.h
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8


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
    is no better for speed: every 4 KiB page of it faults and is zeroed by the kernel, a cost
    paid on every block fetched or read from disk.

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
    collector scans every tracked object, and a remounted epoch paid several such passes.
    Frozen, they are never scanned again; what the mount makes later is collected as before.
    """
    gc.collect()
    gc.freeze()
