"""A breaker per peer: stop asking a member that failed, try it again after a while.

Like a source's breaker (pffs.routing.health), but a broken peer costs nothing to go around:
its blocks go to stand-ins (pffs.group.peers) or the store. A failure (refused, timed out, a
5xx, a wrong reply) marks the peer broken for `FIRST_PAUSE` seconds, doubling up to `MAX_PAUSE`
while it keeps failing; after the pause one request tries it again. Each change is one log line
and the gauge `pffs_group_member_up{member}`. Touched only from trio tasks.
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

    def stands_aside(self) -> bool:
        """Whether this peer's blocks go to their stand-ins now: it is broken, and its pause has
        not ended or a trial is under way (the trial is the only request it gets)."""
        return self.broken_until is not None and (
            self._trying or time.monotonic() < self.broken_until
        )

    def succeeded(self) -> None:
        self._trying = False
        if self.broken_until is not None:
            self.broken_until = None
            self._pause = FIRST_PAUSE
            self._gauge.set(1)
            log.warning("group: peer %s answers again", self.name)

    def abandoned(self) -> None:
        """A request ended without an answer either way (cancelled): another may try."""
        self._trying = False

    def failed(self, reason: str) -> None:
        self._trying = False
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
