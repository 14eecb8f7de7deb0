"""Which member owns a block: rendezvous (highest random weight) hashing of its key.

Each member scores each key with a hash of both; the highest score owns the block. A change of
membership moves only the blocks of the members that came or went (about 1/N of them), and
every member computes the same owner from the same list, with no coordination. A member's
weight scales its share (weighted rendezvous: score = -weight / ln(hash in (0, 1))).

The members in a block's score order (`ranked`) are where it goes when its owner cannot serve
it: the first one an asker may use is the block's stand-in owner, the same at every asker that
knows the same (pffs.group.peers); the second is where a hot block's second copy goes
(pffs.group.hot). Only members that own blocks (`Member.owns`: not a terminating endpoint) are
candidates. After a change, the owner a block had before it is remembered for `handover` seconds
(or until `end_handover`), so a new owner missing the block asks the previous one before the
store; the time is read from `clock` (time.monotonic; tests pass their own).

A block's order is asked several times per block (whether to ask a peer, whom, its second
copy), each time hashing the key with every member: `Placement` keeps the orders of the last
`RANKED_KEPT` keys it was asked, forgotten on a change of membership.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Sequence

from pffs.cache.keys import BlockKey
from pffs.config import GroupConfig
from pffs.group.members import Member

RANKED_KEPT = 8192  # block orders kept (past it, all are forgotten: a new epoch's keys)


def key_bytes(key: BlockKey) -> bytes:
    return "\0".join((key.source, key.principal, key.path, key.version, str(key.block))).encode()


def score(member: Member, key: bytes) -> float:
    digest = hashlib.blake2b(key, digest_size=8, key=member.name.encode()[:64]).digest()
    unit = (int.from_bytes(digest, "big") + 0.5) / 2.0**64  # in (0, 1), never 0 or 1
    return -member.weight / math.log(unit)


def ranked(members: Sequence[Member], key: BlockKey) -> tuple[Member, ...]:
    """The members that own blocks in their score order for `key`: its owner first."""
    raw = key_bytes(key)
    scored = sorted(
        ((score(member, raw), member.name, member) for member in members if member.owns),
        key=lambda item: (item[0], item[1]),
        reverse=True,
    )
    return tuple(member for _score, _name, member in scored)


def owner(members: Sequence[Member], key: BlockKey) -> Member | None:
    """The member owning `key` among `members` (None when none owns blocks)."""
    order = ranked(members, key)
    return order[0] if order else None


class Placement:
    """The members now, and until the handover ends, the members before the last change."""

    def __init__(
        self,
        members: Sequence[Member] = (),
        handover: float = GroupConfig.handover,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.members: tuple[Member, ...] = tuple(members)
        self.handover = handover  # seconds after a change the previous owners are asked
        self._clock = clock
        self._previous: tuple[Member, ...] = ()
        self._handover_ends = 0.0
        self._ranked: dict[BlockKey, tuple[Member, ...]] = {}

    def update(self, members: Sequence[Member], previous: Sequence[Member] | None = None) -> None:
        """The members now; `previous` the list before (default: the members until now), asked
        for `handover` seconds from now."""
        before = self.members if previous is None else tuple(previous)
        self._previous, self.members = before, tuple(members)
        self._ranked.clear()
        self._handover_ends = self._clock() + self.handover

    def owner(self, key: BlockKey) -> Member | None:
        order = self.ranked(key)
        return order[0] if order else None

    def ranked(self, key: BlockKey) -> tuple[Member, ...]:
        order = self._ranked.get(key)
        if order is None:
            if len(self._ranked) >= RANKED_KEPT:
                self._ranked.clear()
            order = self._ranked[key] = ranked(self.members, key)
        return order

    def second(self, key: BlockKey) -> Member | None:
        """Where a hot block's second copy goes: its second choice, when there is one."""
        order = self.ranked(key)
        return order[1] if len(order) > 1 else None

    def end_handover(self) -> None:
        """Forget the previous members now (their caches stopped holding what was asked)."""
        self._previous = ()

    def previous_owner(self, key: BlockKey) -> Member | None:
        """The owner before the last change, while the handover lasts and the owner moved."""
        if not self._previous:
            return None
        if self._clock() >= self._handover_ends:
            self._previous = ()  # its time is up
            return None
        before = owner(self._previous, key)
        now = self.owner(key)
        if before is None or (now is not None and before.name == now.name):
            return None
        return next((m for m in self.members if m.name == before.name), None)

    def member(self, name: str) -> Member | None:
        return next((m for m in self.members if m.name == name), None)
