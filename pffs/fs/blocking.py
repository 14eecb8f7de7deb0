"""The one way the file system runs a blocking call: in a worker thread, under a limiter.

Backends (boto3, pyarrow) and staging files block; trio tasks must not. Every such call goes
through `run_blocking` with the limiter of the backend it talks to (one per source, so a slow
store cannot starve the others' threads) or of the staging area. Threads touch bytes and file
descriptors only; shared state of the file system is touched only from trio tasks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import trio

T = TypeVar("T")


async def run_blocking(limiter: trio.CapacityLimiter, fn: Callable[..., T], *args: object) -> T:
    """Run `fn(*args)` in a worker thread within `limiter`."""
    return await trio.to_thread.run_sync(functools.partial(fn, *args), limiter=limiter)
