"""Which member owns a block: rendezvous (highest random weight) hashing of its key.

Each member scores each key with a hash of both; the highest score owns the block. A change of
membership moves only the blocks of the members that came or went (about 1/N of them), and
every member computes the same owner from the same list, with no coordination. A member's
weight scales its share (weighted rendezvous: score = -weight / ln(hash in (0, 1))).

The second highest score is where a hot block's second copy goes (pffs.group.hot).
Only members that own blocks (`Member.owns`: not a terminating endpoint) are candidates. For
`HANDOVER` seconds after a change, the owner a block had before it is remembered, so a new owner
missing the block asks the previous one before the store.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import time
from collections.abc import Sequence

from pffs.cache.keys import BlockKey
from pffs.group.members import Member

# Seconds after a membership change during which the previous owner is asked first.
HANDOVER = 300.0


def key_bytes(key: BlockKey) -> bytes:
    return "\0".join((key.source, key.principal, key.path, key.version, str(key.block))).encode()


def score(member: Member, key: bytes) -> float:
    digest = hashlib.blake2b(key, digest_size=8, key=member.name.encode()[:64]).digest()
    unit = (int.from_bytes(digest, "big") + 0.5) / 2.0**64  # in (0, 1), never 0 or 1
    return -member.weight / math.log(unit)


def ranked(members: Sequence[Member], key: BlockKey, count: int) -> list[Member]:
    """The first `count` members by their score for `key` (only members that own blocks):
    its owner first, then where its second copy goes."""
    raw = key_bytes(key)
    scored = heapq.nlargest(
        count,
        ((score(member, raw), member.name, member) for member in members if member.owns),
        key=lambda item: (item[0], item[1]),
    )
    return [member for _score, _name, member in scored]


def owner(members: Sequence[Member], key: BlockKey) -> Member | None:
    """The member owning `key` among `members` (None when none owns blocks)."""
    first = ranked(members, key, 1)
    return first[0] if first else None


class Placement:
    """The members now, and for a while after a change, the members before it."""

    def __init__(self, members: Sequence[Member] = ()) -> None:
        self.members: tuple[Member, ...] = tuple(members)
        self._previous: tuple[Member, ...] = ()
        self._changed_at = -math.inf

    def update(self, members: Sequence[Member], previous: Sequence[Member] | None = None) -> None:
        """The members now; `previous` the list before (default: the members until now)."""
        before = self.members if previous is None else tuple(previous)
        self._previous, self.members = before, tuple(members)
        self._changed_at = time.monotonic()

    def owner(self, key: BlockKey) -> Member | None:
        return owner(self.members, key)

    def second(self, key: BlockKey) -> Member | None:
        """Where a hot block's second copy goes: its second choice, when there is one."""
        choices = ranked(self.members, key, 2)
        return choices[1] if len(choices) == 2 else None

    def end_handover(self) -> None:
        """Forget the previous members now (their caches turned out to hold nothing)."""
        self._previous = ()

    def previous_owner(self, key: BlockKey) -> Member | None:
        """The owner before the last change, while it is recent and the owner moved."""
        if time.monotonic() - self._changed_at > HANDOVER or not self._previous:
            return None
        before = owner(self._previous, key)
        now = self.owner(key)
        if before is None or (now is not None and before.name == now.name):
            return None
        return next((m for m in self.members if m.name == before.name), None)

    def member(self, name: str) -> Member | None:
        return next((m for m in self.members if m.name == name), None)
