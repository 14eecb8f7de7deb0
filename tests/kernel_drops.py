"""`unless_dropped`: a test whose claim is what the kernel holds (pages pushed into its page
cache, a negative dentry) repeats its step when, meanwhile, someone dropped the kernel's caches.

The suite runs in two processes, and the bench's tests (and tests/mount/test_cache_mount.py)
write /proc/sys/vm/drop_caches, which empties every mount's page cache and dentries at once,
this test's too. Whether that happened is told by the kernel itself: /proc/vmstat counts each
drop (`drop_pagecache`, `drop_slab`). A step that fails with no drop during it fails the test.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

VMSTAT = "/proc/vmstat"
# Steps run at most: each repeat needs another drop inside one short step. The bench's smoke
# test drops the caches every few seconds for about a minute; a step lasts a fraction of a
# second, so a few attempts suffice, and these are plenty.
ATTEMPTS = 20


def kernel_drops(vmstat: str = VMSTAT) -> tuple[int, int]:
    """(page cache drops, dentry and inode drops) since boot."""
    counters: dict[str, int] = {}
    with open(vmstat) as f:
        for line in f:
            name, _, value = line.partition(" ")
            counters[name] = int(value)
    return counters.get("drop_pagecache", 0), counters.get("drop_slab", 0)


def unless_dropped(step: Callable[[], T], attempts: int = ATTEMPTS, vmstat: str = VMSTAT) -> T:
    """`step()`'s value; when it fails (AssertionError) and the kernel's caches were dropped
    while it ran, it runs again, `attempts` times in all. Any other failure is raised at once."""
    for _ in range(attempts - 1):
        before = kernel_drops(vmstat)
        try:
            return step()
        except AssertionError:
            if kernel_drops(vmstat) == before:
                raise
    return step()  # the last attempt: its failure is the test's
