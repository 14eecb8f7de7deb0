"""The read path: open for reading, and reads through the block cache.

Each open file is pinned to the version (ETag, or mtime and size) it opened, so one open never
mixes old and new bytes. A read first asks the cache for the blocks its readahead window wants
next (without waiting), then for its own blocks; sequential reads take whole blocks from the
memory tier, random reads only the bytes asked of the disk tier.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from pffs import retry
from pffs.backends.base import block_runs
from pffs.cache.blocks import BlockCache
from pffs.cache.keys import ObjectBlocks
from pffs.cache.readahead import LARGE_READ, Readahead
from pffs.cache.sweeps import FileSweep
from pffs.errors import Changed, IsADirectory
from pffs.fs.handles import Handles, ReadHandle
from pffs.fs.namespace import Namespace
from pffs.fs.pagecache import PageCache
from pffs.fs.parking import ParkedSpans, Parking
from pffs.fs.regions import RegionStreams, SpansFirst
from pffs.store.fetching import Store, StoreBlocks, open_blocks

if TYPE_CHECKING:  # a mount without a group never imports pffs.group
    from pffs.group.sources import Joined

# A file this small is fetched whole from its open on: the kernel's first read (up to the
# mount's max_read) will want all of it, and the GET then overlaps the open's reply.
FETCH_AT_OPEN = 1 << 20
# A read wanting at most this share of a block nobody holds gets its bytes with a request of
# its own while the block loads behind it (the first byte of a file, a random 4 KiB read).
COLD_START_SHARE = 4
# Such a read of at least LARGE_READ (pffs.cache.readahead) that continues no run gets its bytes
# alone, the block not loaded behind it: it is the kernel's read-around of a page fault in a
# mapped file (or a region's first bytes), which brings its own neighbourhood; whether the rest
# of the block is wanted shows only when the run continues (a lazy loader's neighbour tensors
# mostly are not), and the run's readahead then loads blocks.
# A short region run (Readahead.stream_to) is streamed (pffs.fs.regions), its bytes held or
# coming within the mount's budget of bytes ahead (pffs.flow.budget).


class Reader:
    """Opens files for reading and serves their bytes from the cache or the store."""

    def __init__(
        self,
        namespace: Namespace,
        handles: Handles,
        cache: BlockCache,
        pages: PageCache,
        parking: Parking,
        tier: Joined | None = None,
    ) -> None:
        """`parking`: where open files' dropped region spans go (pffs.fs.parking); `tier`: the
        cache group or shared tier the mount joined, asked before the store."""
        self.namespace = namespace
        self.tier = tier
        self.handles = handles
        self.cache = cache
        self.block_size = cache.block_size
        self.pages = pages
        self.parking = parking

    async def open(self, ino: int) -> tuple[int, bool]:
        """Open for reading. Returns (handle, keep_cache): whether the kernel may keep pages
        from an earlier open (PageCache.opened)."""
        inode = await self.namespace.getattr(ino, ask_store=True)
        if inode.is_dir:
            raise IsADirectory(f"{inode.path} is a directory")
        info = inode.info
        keep_cache = await self.pages.opened(inode, info.version)
        mounted, inside = self.namespace.route(inode.path)
        backend = mounted.backend
        blocks = ObjectBlocks(
            backend.source_id, backend.principal, inside, info.version, info.size, self.block_size
        )
        # A window for files of several blocks: only they have blocks to load ahead.
        window = self.cache.windows.reader(info.size) if info.size > 2 * self.block_size else None
        readahead = Readahead(self.block_size, self.cache.readahead_max, info.size, window)
        source = open_blocks(Store.of(mounted, tier=self.tier), blocks)
        handle = ReadHandle(inode, blocks, readahead, mounted, source)
        if 0 < info.size <= min(FETCH_AT_OPEN, self.block_size):
            self.cache.load_soon([blocks.key(0)], [info.size], source)
        return self.handles.add(handle), keep_cache

    async def read(self, handle: ReadHandle, offset: int, size: int) -> bytes | memoryview:
        """Bytes [offset, offset+size) of the version opened, through the block cache."""
        blocks = handle.blocks
        if offset >= blocks.size or size <= 0:
            return b""
        end = min(offset + size, blocks.size)
        # Ask for blocks ahead before waiting on this one, so both travel at once.
        ahead = handle.readahead.on_read(offset, end)
        if handle.shape is not None:  # how its dataset's files are read (pffs.fs.datasets)
            handle.shape.read(offset, end, handle.readahead)
        if ahead:
            self.cache.read_ahead(
                blocks.keys(ahead),
                blocks.lengths(ahead),
                handle.source,
                coalesce=block_runs(handle.mounted.backend) is not None,
                at_end=ahead.stop > handle.readahead.last_block,
                window=handle.readahead.reader_window,
            )
        elif handle.readahead.sweeping:
            self._sweep_of(handle).advance()
        try:
            with retry.asking():  # the bound on this read counts from now (pffs.retry)
                # Most reads have no region run: no coroutine for them on the read path.
                streamed = None
                if handle.readahead.stream_to is not None or handle.regions is not None:
                    streamed = await self._read_streamed(handle, offset, end)
                data = (
                    streamed
                    if streamed is not None
                    else await self._read_blocks(handle, offset, end)
                )
        except Changed:
            # The store holds a newer version: this open keeps failing (never mixing versions),
            # the next open must not trust the listing or attributes that named the old one.
            self.namespace.outdated(handle.inode.path)
            raise
        self.pages.after_read(handle, offset, end)
        return data

    def _sweep_of(self, handle: ReadHandle) -> FileSweep:
        """The handle's sweep (pffs.cache.sweeps), made at its first READ once swept."""
        if handle.sweep is None:
            coalesce = block_runs(handle.mounted.backend) is not None
            handle.sweep = FileSweep(
                self.cache, handle.blocks, handle.readahead, handle.source, coalesce=coalesce
            )
        return handle.sweep

    async def _read_streamed(
        self, handle: ReadHandle, offset: int, end: int
    ) -> bytes | memoryview | None:
        """The read's bytes from its region's spans (pffs.fs.regions) when its run is streamed
        or spans already cover them; None otherwise (read through the block cache)."""
        target, regions = handle.readahead.stream_to, handle.regions
        if target is not None and regions is None:
            regions = handle.regions = self._regions(handle)
        if regions is None:
            return None
        gap = handle.readahead.stream_gap
        if gap is not None and not self._cached(handle, *gap):
            regions.reach(*gap, 0)
        if target is not None and not self._cached(handle, offset, target):
            regions.reach(offset, target, (target - end) // 2)
        elif not regions.covers(offset):
            return None
        data = await regions.take(offset, end, partial(self._read_blocks, handle))
        if data is not None:
            self.cache.stats.store_bytes_served += len(data)
        return data

    def _regions(self, handle: ReadHandle) -> RegionStreams | None:
        source = handle.source
        if not isinstance(source, StoreBlocks) or not source.streams_ranges:
            return None  # a tier before the store (pffs.group), or a store without ranges
        # A memory-only source's bytes never go to disk: its dropped spans are let go.
        parked = None
        if handle.blocks.source not in self.cache.memory_only:
            parked = ParkedSpans(self.parking, self.cache.background)
        regions = RegionStreams(source, self.cache.background, self.cache.ahead, parked)
        # From now on the file's block loads take what its spans hold (fetched once).
        handle.source = SpansFirst(source, regions)
        return regions

    def _cached(self, handle: ReadHandle, offset: int, end: int) -> bool:
        """Whether a block of [offset, end) is held or coming: the block cache serves them."""
        blocks = handle.blocks
        first, last = offset // self.block_size, (end - 1) // self.block_size
        return any(self.cache.may_hold(key) for key in blocks.keys(range(first, last + 1)))

    async def _read_blocks(self, handle: ReadHandle, offset: int, end: int) -> bytes | memoryview:
        # The cache asks the handle's source itself on a miss: nothing is built per block.
        blocks, source, cache = handle.blocks, handle.source, self.cache
        # A read outside a run that ends the file past its start is a footer's (Parquet's, ORC's,
        # a ZIP's directory): its reader goes on to the offsets the footer names, not to the
        # bytes before it, so it is read alone too, no block loaded behind it.
        footer = end == blocks.size and offset > 0
        alone = (end - offset >= LARGE_READ or footer) and not handle.readahead.sequential
        small = (end - offset) * COLD_START_SHARE <= self.block_size
        across = offset // self.block_size != (end - 1) // self.block_size
        across = across and isinstance(source, StoreBlocks | SpansFirst)
        if alone and small and across and not self._cached(handle, offset, end):
            # A read alone across a block's end: one request, not one per block in series (each
            # part small: loaded alone, no block behind either).
            data = await source.part(offset, end - offset)
            cache.stats.memory_misses += 1
            cache.stats.store_bytes_served += len(data)
            return data
        pieces: list[bytes | memoryview] = []
        for index, start, stop in blocks.spans(offset, end):
            key, block_length = blocks.key(index), blocks.length(index)
            small = (stop - start) * COLD_START_SHARE <= block_length
            if small and not cache.is_cached_or_coming(key):  # a first or random read
                part = await cache.read_part(
                    key, start, stop - start, source, block_length, cold_start=True, alone=alone
                )
                pieces.append(part)
            elif handle.readahead.sequential:
                block = await cache.read(key, source, block_length, served=stop - start)
                pieces.append(memoryview(block)[start:stop])
                for behind in handle.readahead.passes(index * self.block_size + start):
                    cache.passed(blocks.key(behind))
            else:  # random access: only what is asked of the disk tier
                pieces.append(await cache.read_part(key, start, stop - start, source, block_length))
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)
