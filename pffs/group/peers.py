"""The group as the fetch path sees it: a block source (pffs.group.sources) that asks a
block's owner before the store.

Blocks another member owns are asked of it, the others (this member's own, and any a peer did
not give) come from the store as before. A peer that fails is a fallback to the store, counted
and told to its breaker; a reader never sees a peer's error. A block is asked once however
many read it: every ask is made under the block's flight in the cache (the one registry of
blocks on their way, pffs.cache.singleflight), which the other loads of the block join.

A block's owner is the first member in its rendezvous order (pffs.group.placement) that this
member may ask: a member whose breaker is open, or that answered it does not serve the block's
source (not mounted there; remembered for `NOT_SERVED_FOR` seconds), is passed over, and the
next member stands in for it. Every asker that sees the same passes over the same members, so
the stand-in fetches the block from the store once and serves all of them.

A handover (after a membership change, the previous owner asked before the store) lasts
`handover` seconds (pffs.group.placement), and ends early once `HANDOVER_PROBES` asks of
previous owners in a row miss: the previous owners no longer hold the blocks.

The owner's side is `fetch_for_peer`: during a handover it asks the previous owner for a
block it does not hold yet (None: the caller fetches it from its store); and `to_second`,
which sends every second request for a hot block to its second copy (pffs.group.hot), which
gets it from the owner once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from pffs.cache.keys import ObjectBlocks
from pffs.config import GroupConfig
from pffs.flow.permits import PeerFlow, Priority
from pffs.group import stats
from pffs.group.breaker import PeerBreaker
from pffs.group.client import (
    PeerAskSecond,
    PeerClient,
    PeerFailed,
    PeerMiss,
    PeerNotServed,
    PeerStoreFailed,
)
from pffs.group.hot import Asked
from pffs.group.members import Member
from pffs.group.placement import Placement
from pffs.group.protocol import BlockRequest

log = logging.getLogger("pffs.group")

# A handover ends once this many asks of previous owners in a row missed: the group started
# cold, or the previous owners no longer hold their old blocks, and asking on would cost a round
# trip per block for nothing.
HANDOVER_PROBES = 16
# What `_ask` gives for "ask the block's second copy" (a hot block): a block is never empty.
ASK_SECOND = b""
# How long a member that does not serve a source is left out of that source's owners; then it
# is asked again (it may mount the source by then).
NOT_SERVED_FOR = 600.0
# Members asked for one block at most: the owner, then stand-ins as each fails.
MAX_ASKED = 3


class Group:
    """This member's view of the group: members, owners, peers' breakers, the client."""

    def __init__(
        self,
        self_name: str,
        client: PeerClient,
        members: Sequence[Member] = (),
        handover: float = GroupConfig.handover,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.self_name = self_name
        self.client = client
        self.placement = Placement(handover=handover, clock=clock)
        self.breakers: dict[str, PeerBreaker] = {}
        # Requests to peers at once, a reader's apart from loading ahead's (pffs.flow.permits).
        self.permits = PeerFlow()
        self._handover_misses = 0  # asks of previous owners that missed, in a row
        # (member, source, principal) -> when that member may be asked for that source again
        self._not_served: dict[tuple[str, str, str], float] = {}
        self.asked = Asked()  # requests for the blocks this member owns (hot blocks)
        if members:
            self.update(members)

    # --- membership ----------------------------------------------------------------------

    def update(self, members: Sequence[Member]) -> None:
        """A new member list (one log line when it differs from the last)."""
        before = {m.name: m for m in self.placement.members}
        after = {m.name: m for m in members}
        if before == after:
            return
        self._handover_misses = 0
        if not before and self.self_name in after:
            # This member's first list: the others held the blocks before it joined, so its
            # own blocks are asked of their owners of then during the handover.
            self.placement.update(members, [m for m in members if m.name != self.self_name])
        else:
            self.placement.update(members)
        for name in before.keys() - after.keys():
            self._forget_not_served(name)
            breaker = self.breakers.pop(name, None)
            if breaker is not None:
                breaker.forget()
        for name in after.keys() - before.keys() - {self.self_name}:
            self.breakers[name] = PeerBreaker(name)
        stats.MEMBERS.set(len(after))
        joined = sorted(after.keys() - before.keys())
        left = sorted(before.keys() - after.keys())
        moved = sorted(n for n in after.keys() & before.keys() if after[n] != before[n])
        log.warning(
            "group: %d members%s%s%s%s",
            len(after),
            f"; joined {', '.join(joined)}" if joined else "",
            f"; left {', '.join(left)}" if left else "",
            f"; changed {', '.join(moved)}" if moved else "",
            ""
            if self.self_name in after
            else f"; {self.self_name} itself not listed (owns nothing)",
        )

    def peer_owner(self, blocks: ObjectBlocks, index: int) -> Member | None:
        """The member to ask for the block when it is another member: its owner, or the stand-in
        for an owner this member may not ask now; None when this member owns or stands in."""
        for member in self.placement.ranked(blocks.key(index)):
            if member.name == self.self_name:
                return None
            if self._may_ask(member, blocks):
                return member
        return None

    def _may_ask(self, member: Member, blocks: ObjectBlocks) -> bool:
        breaker = self.breakers.get(member.name)
        if breaker is None or breaker.stands_aside():
            return False
        until = self._not_served.get((member.name, blocks.source, blocks.principal))
        if until is None:
            return True
        if time.monotonic() < until:
            return False
        del self._not_served[(member.name, blocks.source, blocks.principal)]
        return True

    def _forget_not_served(self, name: str) -> None:
        for entry in [entry for entry in self._not_served if entry[0] == name]:
            del self._not_served[entry]

    # --- asking ----------------------------------------------------------------------------

    def previous_owner(self, blocks: ObjectBlocks, index: int) -> Member | None:
        """During a handover, the block's owner before the last change, when another member."""
        previous = self.placement.previous_owner(blocks.key(index))
        return None if previous is None or previous.name == self.self_name else previous

    async def fetch_block(
        self, blocks: ObjectBlocks, index: int, priority: Priority = "reader"
    ) -> bytes | None:
        """The block from its owner, or during a handover from its previous owner (after the
        owner failed, or first when this member is the new owner: only what it holds); None
        when the store must serve it. Each ask takes a permit of `priority` (who waits on
        it: a reader, or a load ahead)."""
        request = BlockRequest(blocks, index)
        asked: set[str] = set()
        owner = self.peer_owner(blocks, index)
        while owner is not None and owner.name not in asked and len(asked) < MAX_ASKED:
            asked.add(owner.name)
            data = await self._ask(owner, request, priority)
            if data == ASK_SECOND:
                data = await self._from_second(blocks, index, owner, priority)
            if data is not None:
                return data
            owner = self.peer_owner(blocks, index)  # a stand-in, if that one broke or refused
        previous = self.previous_owner(blocks, index)
        if previous is None or previous.name in asked:
            return None
        if asked:  # the owners failed: the previous owner, which fetches it if it must
            return await self._ask(previous, request, priority)
        return await self._handed_over(previous, blocks, index, priority)  # this member owns it

    async def _handed_over(
        self, previous: Member, blocks: ObjectBlocks, index: int, priority: Priority
    ) -> bytes | None:
        """What the previous owner holds of a block this member owns now (a handover ask)."""
        request = BlockRequest(blocks, index, cached_only=True)
        data = await self._ask(previous, request, priority)
        self._handover_misses = 0 if data is not None else self._handover_misses + 1
        if self._handover_misses >= HANDOVER_PROBES:
            self.placement.end_handover()
        return data

    async def _from_second(
        self, blocks: ObjectBlocks, index: int, owner: Member, priority: Priority
    ) -> bytes | None:
        """A hot block its owner sent this asker away for: from its second copy, else (it
        failed, or this member is that copy) from the owner, forwarded."""
        second = self.placement.second(blocks.key(index))
        data = None
        if second is not None and second.name not in (self.self_name, owner.name):
            data = await self._ask(second, BlockRequest(blocks, index), priority)
        if not data:
            forwarded = BlockRequest(blocks, index, forwarded=True)
            data = await self._ask(owner, forwarded, priority)
        return data or None

    def to_second(self, blocks: ObjectBlocks, index: int) -> bool:
        """Whether a peer's request for a block this member owns goes to its second copy (a
        hot block, every second request; pffs.group.hot)."""
        if self.peer_owner(blocks, index) is not None:
            return False
        key = blocks.key(index)
        second = self.placement.second(key)
        if second is None or second.name == self.self_name:
            return False
        breaker = self.breakers.get(second.name)
        return breaker is not None and breaker.may_try() and self.asked.to_second(key)

    async def fetch_for_peer(
        self, blocks: ObjectBlocks, index: int, forwarded: bool = False
    ) -> bytes | None:
        """A miss of a block a peer asked for: at a member that does not own it (a hot block's
        second copy, or the asker's member list differs), the owner's copy unless the request
        was `forwarded` already; during a handover, the previous owner's; None: the caller's
        store serves it. Asked as a reader's: a reader on another node waits on it."""
        owner = self.peer_owner(blocks, index)
        if owner is not None and not forwarded:
            data = await self._ask(owner, BlockRequest(blocks, index, forwarded=True), "reader")
            if data:
                return data
        previous = self.previous_owner(blocks, index)
        if previous is not None:
            return await self._handed_over(previous, blocks, index, "reader")
        return None

    async def _ask(self, member: Member, request: BlockRequest, priority: Priority) -> bytes | None:
        """One request to `member`, holding a permit of `priority`; None on any failure. Not
        joined here: every ask is made under the block's flight in the cache
        (pffs.cache.singleflight), which the other loads of the block join."""
        if self.client.proof_key(request.blocks) is None:
            stats.FALLBACKS.labels(reason="principal unprovable").inc()
            return None  # no owner serves it (pffs.group.principals): not asked
        breaker = self.breakers.get(member.name)
        if breaker is None or not breaker.allows():
            stats.FALLBACKS.labels(reason="peer broken").inc()
            return None
        sent = time.monotonic()
        try:
            async with self.permits.permit(priority):
                data = await self.client.get(member, request)
        except PeerMiss:
            breaker.succeeded(sent)
            return None
        except PeerAskSecond:
            breaker.succeeded(sent)
            return ASK_SECOND
        except PeerNotServed as exc:  # the peer is fine; it does not mount that source
            breaker.succeeded(sent)
            blocks = request.blocks
            self._not_served[(member.name, blocks.source, blocks.principal)] = (
                time.monotonic() + NOT_SERVED_FOR
            )
            stats.FALLBACKS.labels(reason=str(exc)).inc()
            return None
        except PeerStoreFailed as exc:  # the peer is fine; its store failed this block
            breaker.succeeded(sent)
            stats.FALLBACKS.labels(reason=str(exc)).inc()
            return None
        except PeerFailed as exc:
            breaker.failed(str(exc), sent)
            stats.FALLBACKS.labels(reason=str(exc)).inc()
            return None
        except BaseException:  # cancelled (its reader went away): no verdict on the peer
            breaker.abandoned(sent)
            raise
        breaker.succeeded(sent)
        stats.PEER_BYTES.labels(way="received").inc(len(data))
        return data

    # --- as a block source (pffs.group.sources) ----------------------------------------------

    def asks(self, blocks: ObjectBlocks, index: int) -> bool:
        if self.client.proof_key(blocks) is None:
            return False  # a principal this process cannot prove: no peer would serve it
        return (
            self.peer_owner(blocks, index) is not None
            or self.previous_owner(blocks, index) is not None
        )

    def landed(self, blocks: ObjectBlocks, index: int, data: bytes) -> None:
        """A block the store served: nothing to do (its owner is this member, or a peer failed)."""

    def close(self) -> None:
        self.client.close()
