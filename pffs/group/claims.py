"""Single flight across the mounts of a shared tier: the first mount to miss a block claims it.

A claim is a small object beside the block's, holding a token of the mount, written with
`If-None-Match: *`, so where the shared store honours the condition (moto, Ceph RGW, S3 and S3
Express) exactly one mount's write succeeds. That mount fetches the block from the origin,
writes it to the tier and removes its claim; the others poll the tier for the block object
(pffs.group.shared) for at most `WAIT` seconds, then fetch it from the origin themselves: a
claimant that died or failed costs its waiters that wait, never a wrong byte. A claim is named
by its `PERIOD` too (`NAME.claim-N`, N the number of periods since the epoch), so a claim left
by a dead mount lapses at the next period with nothing to delete or overwrite; in a period's
first `WAIT` seconds a claim won is checked against the previous period's, so a block claimed
just before a period ends is not claimed once more just after it.

Whether the store honours the condition is checked once, when the tier opens (`probe`). Where
it does not (s3rver answers every PUT with 200), a claim is written only when none is there,
then read back after twice the time its write took (at least `SETTLE` seconds): the mount whose
token is there won. A mount that found none at the same time writes about as slowly, so its
write has landed by then; one whose write took more than twice as long may win too, costing
one more origin fetch.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Literal, Protocol

import trio

from pffs.errors import NotFound
from pffs.flow.permits import SourceFlow
from pffs.group import stats
from pffs.workers import run_blocking

log = logging.getLogger("pffs.group")

WAIT = 5.0  # the longest a mount waits for another's claimed block before the origin
PERIOD = 60.0  # a claim lapses at the end of its period (wall clock: every mount's the same)
SETTLE = 0.02  # without conditional writes: how long writes of one claim may race
MAX_CLAIM = 64  # a claim object's size bound (a token)
MAX_HELD = 4096  # claims this mount remembers to release


Outcome = Literal["won", "lost", "failed"]


def claim_name(name: str, when: float) -> str:
    """The claim of block object `name` made at wall-clock time `when`."""
    return f"{name}.claim-{int(when // PERIOD)}"


class ClaimStore(Protocol):
    """What claims need of the shared store (a pffs backend and its writer)."""

    def read_range(self, path: str, start: int, length: int, version: str | None) -> bytes: ...

    def put_new(self, path: str, body: bytes) -> bool: ...

    def delete(self, path: str) -> None: ...


def probe(store: ClaimStore, prefix: str) -> bool:
    """Whether the store refuses a second `If-None-Match: *` write of one name (blocking)."""
    name = f"{prefix}claims-probe-{os.urandom(8).hex()}"
    try:
        return store.put_new(name, b"1") and not store.put_new(name, b"2")
    finally:
        try:
            store.delete(name)
        except Exception as exc:  # a leftover probe object harms nothing
            log.debug("shared cache: probe %s left behind: %s", name, exc)


class Claims:
    """This mount's claims in one shared tier."""

    def __init__(
        self,
        store: ClaimStore,
        conditional: bool,
        flow: SourceFlow,  # the shared store's: a claim takes a reader's permit
        clock: Callable[[], float] = time.time,  # the wall clock, every mount's the same
    ) -> None:
        self.store = store
        self.clock = clock
        self.conditional = conditional
        self.flow = flow
        self.token = os.urandom(8).hex().encode()
        # Block objects this mount claimed and has not released: its claim, and when.
        self._held: dict[str, tuple[str, float]] = {}

    def mine(self, name: str) -> bool:
        """Whether this mount claimed block object `name` lately (it is fetching it)."""
        held = self._held.get(name)
        return held is not None and time.monotonic() - held[1] < WAIT

    async def claim(self, name: str) -> Outcome:
        """Whether this mount is the one to fetch block object `name` ("won"), or waits for
        it ("lost"); "failed" when the store fails (the origin serves, as without claims)."""
        now = self.clock()
        claim = claim_name(name, now)
        try:
            won = await self._write(claim)
            if won and now % PERIOD < WAIT:
                # A claim of the previous period may be a few seconds old: its claimant is
                # still fetching, and its waiters would see this block fetched twice.
                previous = await self._read(claim_name(name, now - PERIOD))
                if previous not in (None, self.token):
                    await run_blocking(self.flow.permit("reader"), self.store.delete, claim)
                    stats.CLAIMS.labels(outcome="lost to the previous period").inc()
                    return "lost"
        except Exception as exc:
            log.debug("shared cache: claim %s failed: %s", claim, exc)
            stats.CLAIMS.labels(outcome="failed").inc()
            return "failed"
        stats.CLAIMS.labels(outcome="won" if won else "lost").inc()
        if won:
            if len(self._held) >= MAX_HELD:  # claims never released: forgotten (they lapse)
                self._held.clear()
            self._held[name] = (claim, time.monotonic())
        return "won" if won else "lost"

    async def _write(self, claim: str) -> bool:
        """Whether this mount's token is the claim `claim` now."""
        if self.conditional:
            return await self._put_new(claim)
        held = await self._read(claim)
        if held is not None:
            return held == self.token
        started = trio.current_time()
        await self._put_new(claim)  # the condition ignored: written whatever is there
        # Another mount that found none when this one did writes as slowly as this one wrote:
        # read back once its write has surely landed too (twice this write's time).
        await trio.sleep(max(SETTLE, 2 * (trio.current_time() - started)))
        return await self._read(claim) in (None, self.token)

    async def release(self, name: str) -> None:
        """Remove this mount's claim of block object `name`, now written (a claim left behind
        lapses at the end of its period)."""
        held = self._held.pop(name, None)
        if held is None:
            return
        claim = held[0]
        stats.CLAIM_LIVES.observe(time.monotonic() - held[1])
        try:
            await run_blocking(self.flow.permit("reader"), self.store.delete, claim)
        except Exception as exc:
            log.debug("shared cache: claim %s left behind: %s", claim, exc)

    async def _put_new(self, claim: str) -> bool:
        return await run_blocking(self.flow.permit("reader"), self.store.put_new, claim, self.token)

    async def _read(self, claim: str) -> bytes | None:
        try:
            return await run_blocking(
                self.flow.permit("reader"), self.store.read_range, claim, 0, MAX_CLAIM, None
            )
        except NotFound:
            return None
