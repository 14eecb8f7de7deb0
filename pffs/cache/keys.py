"""What names a block, and the shapes of the fetch functions the cache is handed.

Shared by every module of the cache and by its callers (the read path, warmup). A block is
identified by (source, path, object version, index): a changed object has a new version, so its
old blocks can never be served for it. The cache never sees a backend; the caller hands it a
function that loads the bytes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import NamedTuple


class BlockKey(NamedTuple):
    source: str
    path: str
    version: str
    block: int


# Loads one block from the store (a reader's miss, or warmup).
Fetch = Callable[[], Awaitable[bytes]]
# Hands over one block of a run as soon as it has arrived: (position in the window, bytes).
Deliver = Callable[[int, bytes], Awaitable[None]]
# Loads `count` consecutive blocks from window position `first` (one store request where the
# store allows), calling `deliver` for each in order.
FetchRun = Callable[[int, int, Deliver], Awaitable[None]]


class ColdStart(NamedTuple):
    """How a reader that wants a small part of a block nobody holds gets it early: the whole
    block is loaded in the background through `fetch_run`, while the reader's own bytes come
    from `fetch_part`, one request of their own, without waiting for the rest of the block."""

    size: int  # the block's length
    fetch_run: FetchRun
    fetch_part: Fetch
