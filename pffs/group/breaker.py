"""A breaker per peer: stop asking a member that failed, try it again after a while.

Like a source's breaker (pffs.routing.health), but a broken peer costs nothing to go around:
its blocks go to stand-ins (pffs.group.peers) or the store. A failure (refused, timed out, a
5xx, a wrong reply) marks the peer broken for `FIRST_PAUSE` seconds, doubling up to `MAX_PAUSE`
while it keeps failing; after the pause one request tries it again. Each change is one log line
and the gauge `pffs_group_member_up{member}`. Touched only from trio tasks.

A verdict counts only from a request sent after the breaker last changed: with several kept-alive
connections per member, a block already in a dead peer's socket buffers can arrive whole after
another request saw the connection break, and must not call the peer back up (nor a late failure
of a request sent before a recovery break it again).
"""

from __future__ import annotations

import logging
import time

from pffs.group import stats

log = logging.getLogger("pffs.group")

FIRST_PAUSE = 2.0
MAX_PAUSE = 60.0


class PeerBreaker:
    def __init__(self, name: str) -> None:
        self.name = name
        self.broken_until: float | None = None
        self._pause = FIRST_PAUSE
        self._trying = False
        self._changed_at = time.monotonic()
        self._gauge = stats.MEMBER_UP.labels(member=name)
        self._gauge.set(1)

    @property
    def up(self) -> bool:
        return self.broken_until is None

    def allows(self) -> bool:
        """Whether a request may go to the peer now (one trial at a time once a pause ends)."""
        if self.broken_until is None:
            return True
        if self._trying or time.monotonic() < self.broken_until:
            return False
        self._trying = True
        return True

    def may_try(self) -> bool:
        """Whether `allows` would let a request go now, without taking the trial."""
        if self.broken_until is None:
            return True
        return not self._trying and time.monotonic() >= self.broken_until

    def stands_aside(self) -> bool:
        """Whether this peer's blocks go to their stand-ins now: it is broken, and its pause has
        not ended or a trial is under way (the trial is the only request it gets)."""
        return self.broken_until is not None and (
            self._trying or time.monotonic() < self.broken_until
        )

    def _stale(self, sent: float) -> bool:
        return sent < self._changed_at

    def succeeded(self, sent: float) -> None:
        """A request sent at `sent` (time.monotonic()) got an answer."""
        if self._stale(sent):
            return
        self._trying = False
        if self.broken_until is not None:
            self.broken_until = None
            self._pause = FIRST_PAUSE
            self._changed_at = time.monotonic()
            self._gauge.set(1)
            log.warning("group: peer %s answers again", self.name)

    def abandoned(self, sent: float) -> None:
        """A request ended without an answer either way (cancelled): another may try."""
        if not self._stale(sent):
            self._trying = False

    def failed(self, reason: str, sent: float) -> None:
        if self._stale(sent):
            return
        self._trying = False
        self._changed_at = time.monotonic()
        if self.broken_until is None:
            log.warning("group: peer %s broken (%s); its blocks go to stand-ins", self.name, reason)
            self._gauge.set(0)
        else:  # a trial after the pause failed again: already said
            log.debug("group: peer %s still broken (%s)", self.name, reason)
            self._pause = min(self._pause * 2, MAX_PAUSE)
        self.broken_until = time.monotonic() + self._pause

    def forget(self) -> None:
        """The member left the group."""
        stats.MEMBER_UP.remove(self.name)
