"""`eventually`: the one way a test waits for something another process or thread will do (a
log line, a metric, a file, a mount): the condition asked again and again until it holds, and a
failure that says what was waited for, and what was last seen, when it has not within its
bound. The bound only ends a failing test; a passing one returns as soon as the condition
holds, however fast or slow the machine. A fixed sleep in its place either waits for nothing
on a fast machine or too little on a slow one."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(
    condition: Callable[[], T],
    timeout: float = 30.0,
    what: str = "",
    *,
    interval: float = 0.05,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """`condition()`'s first true value, asked every `interval` seconds; AssertionError, naming
    `what` (else the condition) and its last value, if it is still false after `timeout`
    seconds. An exception of `condition` is raised at once."""
    deadline = clock() + timeout
    while True:
        value = condition()
        if value:
            return value
        if clock() >= deadline:
            name = what or getattr(condition, "__qualname__", repr(condition))
            raise AssertionError(f"{name}: not so after {timeout:g}s (last seen: {value!r})")
        sleep(interval)
