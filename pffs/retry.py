"""The one retry helper every backend uses.

Jittered exponential backoff ("full jitter"), bounded in attempts and in total time, with the log
level rising as attempts pile up. Which failures are worth retrying is the backend's call: it
passes its own `is_transient(exc)`.

This runs inside worker threads (backend calls are blocking), so it sleeps with time.sleep.

A reader's bound counts from when it asked, not from when its request started: a read that
waited for a place in a limiter, or joined a load ahead of its block that then failed, must not
start a fresh budget. The trio side marks the moment (`asking()`, a context variable), the
fetch carries it into its worker thread (`carrying()`), and every retry loop that thread enters
stops starting attempts once `total_timeout` has passed since then. So a read gets its bytes or
its error within `total_timeout` plus one request's timeout of asking.

A request may also carry a gate (its source's breaker, pffs.routing.health): called in the
worker thread before the request starts and before each retry, it raises when the source has
gone down meanwhile, so a request already under way stops at its next attempt instead of
spending the rest of its budget on a store known to be down.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from pffs.config import RetryConfig
from pffs.errors import Transient

T = TypeVar("T")
log = logging.getLogger("pffs.retry")

# When the reader whose request this is asked (time.monotonic), on the trio side...
_asked_at: contextvars.ContextVar[float | None] = contextvars.ContextVar("asked_at", default=None)
# ...and in the worker thread running its request.
_thread = threading.local()


@contextlib.contextmanager
def asking() -> Iterator[None]:
    """A reader's request: store calls made inside count their retry budget from now (or from
    the outer request's start when nested)."""
    if _asked_at.get() is not None:
        yield
        return
    token = _asked_at.set(time.monotonic())
    try:
        yield
    finally:
        _asked_at.reset(token)


def carrying(
    fn: Callable[..., T],
    on_pushback: Callable[[BaseException], None] | None = None,
    gate: Callable[[], None] | None = None,
) -> Callable[..., T]:
    """`fn` wrapped to run in a worker thread with the asking reader's start (if any),
    `on_pushback` told of each failure its retry loops retry (the pace of loading ahead), and
    `gate` called before it starts and before each retry (it raises to stop them)."""
    asked_at = _asked_at.get()
    if asked_at is None and on_pushback is None and gate is None:
        return fn

    def call(*args: object) -> T:
        if gate is not None:
            gate()
        _thread.asked_at, _thread.on_pushback, _thread.gate = asked_at, on_pushback, gate
        try:
            return fn(*args)
        finally:
            _thread.asked_at = _thread.on_pushback = _thread.gate = None

    return call


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
    The budget counts from the asking reader's start when this thread carries one.
    """
    asked_at = getattr(_thread, "asked_at", None)
    deadline = (time.monotonic() if asked_at is None else asked_at) + policy.total_timeout
    attempt = 0
    while True:
        attempt += 1
        if attempt == 1 and time.monotonic() >= deadline:
            raise Transient(f"{what}: no time left of {policy.total_timeout:g}s to try it")
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
            pushback = getattr(_thread, "on_pushback", None)
            if pushback is not None:
                pushback(exc)
            time.sleep(delay)
            gate = getattr(_thread, "gate", None)
            if gate is not None:
                gate()


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
