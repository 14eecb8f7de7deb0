"""The one retry helper every backend uses.

Jittered exponential backoff ("full jitter"), bounded in attempts and in total time, with the log
level rising as attempts pile up. Which failures are worth retrying is the backend's call: it
passes its own `is_transient(exc)`.

This runs inside worker threads (backend calls are blocking), so it sleeps with time.sleep.

What a request's retries answer to is handed down to them as a value, `RetryTerms`, built on
the trio side (`terms()`) and passed with the request to the backend, whose retry loops take it
as an argument; nothing travels beside the call:

- when its reader asked. A reader's bound counts from then, not from when its request started:
  a read that waited for a permit (pffs.flow), or joined a load ahead of its block that then
  failed, must not start a fresh budget. The trio side marks the moment (`asking()`, a context
  variable of the reader's task), and the retry loop stops starting attempts once
  `total_timeout` has passed since then. So a read gets its bytes or its error within
  `total_timeout` plus one request's timeout of asking.
- a gate (its source's breaker, pffs.routing.health): called before each attempt, it raises
  when the source has gone down meanwhile, so a request already under way stops at its next
  attempt instead of spending the rest of its budget on a store known to be down.
- who hears of the store's throttling (the source's flow of loading ahead, pffs.flow.permits):
  told of each failure the loop retries, while it retries.
- how many times its source has come back up (`recovered`, the breaker's count): a backend
  that sees the count grow lets go of every connection it opened before, since a connection
  opened while the store was down, or idle through the outage, may lead nowhere (a load
  balancer or NAT keeping it bound to a backend that died; pffs.backends.s3connections).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from pffs.config import RetryConfig
from pffs.errors import Transient

T = TypeVar("T")
log = logging.getLogger("pffs.retry")

# When the reader whose request this is asked (time.monotonic), in the reader's trio task.
_asked_at: contextvars.ContextVar[float | None] = contextvars.ContextVar("asked_at", default=None)


@dataclass(frozen=True, slots=True)
class RetryTerms:
    """What one store request's retries answer to (see the module's docstring)."""

    asked_at: float | None = None  # time.monotonic() its reader asked; None: its first attempt
    gate: Callable[[], None] | None = None  # raises to stop the attempts (the source's breaker)
    on_throttled: Callable[[BaseException], None] | None = None  # told of each failure retried
    recovered: int = 0  # times its source came back up: connections older than that go


_NO_TERMS = RetryTerms()


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


def terms(
    gate: Callable[[], None] | None = None,
    on_throttled: Callable[[BaseException], None] | None = None,
    recovered: int = 0,
) -> RetryTerms:
    """The terms of a request made now, from a trio task: its budget counted from when its
    reader asked (`asking()`), if it is a reader's."""
    return RetryTerms(_asked_at.get(), gate, on_throttled, recovered)


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
    terms: RetryTerms | None = None,
) -> T:
    """Call `fn` until it succeeds, fails permanently, or the policy's bounds are reached.

    The last exception is re-raised unchanged, so the backend translates it at its own edge.
    Under `terms`, the budget counts from when the reader asked, the gate is passed before
    each attempt and the throttling is told.
    """
    (result,) = stream_with_retry(
        lambda: iter((fn(),)),
        is_transient=is_transient,
        policy=policy,
        what=what,
        on_retry=on_retry,
        terms=terms,
    )
    return result


def stream_with_retry(
    start: Callable[[], Iterator[T]],
    *,
    is_transient: Callable[[BaseException], bool],
    policy: RetryConfig,
    what: str,
    on_retry: Callable[[BaseException], None] | None = None,
    terms: RetryTerms | None = None,
) -> Iterator[T]:
    """What `start()` yields, started again on a failure as `call_with_retry` calls again (a
    streamed read: each attempt asks only for what the ones before it did not hand over,
    which `start` keeps count of)."""
    terms = terms or _NO_TERMS
    asked_at, gate, throttled = terms.asked_at, terms.gate, terms.on_throttled
    deadline = (time.monotonic() if asked_at is None else asked_at) + policy.total_timeout
    attempt = 0
    while True:
        attempt += 1
        if gate is not None:
            gate()
        if attempt == 1 and time.monotonic() >= deadline:
            raise Transient(f"{what}: no time left of {policy.total_timeout:g}s to try it")
        try:
            yield from start()
            return
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
            if throttled is not None:
                throttled(exc)
            time.sleep(delay)


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
