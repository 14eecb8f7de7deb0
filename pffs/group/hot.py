"""Hot blocks: a block many members want at once gets a second copy.

The owner counts the requests for each block (`Asked`). Once a block was asked `ASKS` times
within `WINDOW` seconds, every second request for it is answered "ask its second copy" (307,
no body): the asker then asks the block's second rendezvous choice, which gets the block from
the owner once (a forwarded request: never redirected nor forwarded again), keeps it in its
cache and serves it, so the owner's NIC carries about half the copies of a hot block. A second
copy that fails is one more fallback: the asker asks the owner again, forwarded. The counts are
bounded: past `MAX_BLOCKS` blocks they start afresh.
"""

from __future__ import annotations

import time

from pffs.cache.keys import BlockKey

ASKS = 8  # requests for one block within WINDOW that make it hot
WINDOW = 10.0
MAX_BLOCKS = 4096


class Asked:
    """The owner's count of requests per block, in windows of WINDOW seconds."""

    def __init__(self) -> None:
        self._counts: dict[BlockKey, tuple[float, int]] = {}

    def to_second(self, key: BlockKey) -> bool:
        """One more request for `key`: whether it goes to the second copy (the block is hot,
        and this is every second request)."""
        now = time.monotonic()
        started, count = self._counts.get(key, (now, 0))
        if now - started > WINDOW:
            started, count = now, 0
        if len(self._counts) >= MAX_BLOCKS and key not in self._counts:
            self._counts.clear()
        count += 1
        self._counts[key] = (started, count)
        return count >= ASKS and count % 2 == 0
