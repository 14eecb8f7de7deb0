"""The one retry helper every backend uses.

Jittered exponential backoff ("full jitter"), bounded in attempts and in total time, with the log
level rising as attempts pile up. Which failures are worth retrying is the backend's call: it
passes its own `is_transient(exc)`.

This runs inside worker threads (backend calls are blocking), so it sleeps with time.sleep.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from pffs.config import RetryConfig

T = TypeVar("T")
log = logging.getLogger("pffs.retry")


def backoff_delay(policy: RetryConfig, attempt: int) -> float:
    """Sleep before retry number `attempt` (1-based): uniform in [0, min(cap, base * 2^n)]."""
    ceiling = min(policy.max_delay, policy.base_delay * (2 ** (attempt - 1)))
    return random.uniform(0, ceiling)


def call_with_retry(
    fn: Callable[[], T],
    *,
    is_transient: Callable[[BaseException], bool],
    policy: RetryConfig,
    what: str,
    on_retry: Callable[[BaseException], None] | None = None,
) -> T:
    """Call `fn` until it succeeds, fails permanently, or the policy's bounds are reached.

    The last exception is re-raised unchanged, so the backend translates it at its own edge.
    """
    deadline = time.monotonic() + policy.total_timeout
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn()
        except Exception as exc:
            if not is_transient(exc) or attempt >= policy.attempts:
                raise
            delay = backoff_delay(policy, attempt)
            if time.monotonic() + delay > deadline:
                raise
            level = (
                logging.DEBUG if attempt == 1 else logging.INFO if attempt == 2 else logging.WARNING
            )
            log.log(level, "%s failed (%s), retry %d in %.2fs", what, _short(exc), attempt, delay)
            if on_retry is not None:
                on_retry(exc)
            time.sleep(delay)


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
