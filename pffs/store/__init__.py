"""A source as a fetch sees it: the store adapter, below the file system.

fetching.py  `Store`: one source's parts a request goes through (its backend, the readers'
             limiter, its pace, its breaker); `StoreBlocks`: the store as the block source of
             one open object version, with its streamed reads; `open_blocks` puts a tier joined
             (a cache group, a shared tier) before it.

Below it: pffs.routing (a source's `Mounted`, its breaker), pffs.cache (block keys, the board
of arriving blocks) and the backends. Above it: pffs.fs (reads, regions, preload by dataset),
pffs.group (the owner's side of a peer's ask) and pffs.mounting (warmup), none of which goes
through another to reach it.
"""
