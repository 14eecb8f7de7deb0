"""The read path: open for reading, and reads through the block cache.

Each open file is pinned to the version (ETag, or mtime and size) it opened, so one open never
mixes old and new bytes. A read first asks the cache for the blocks its readahead window wants
next (without waiting), then for its own blocks; sequential reads take whole blocks from the
memory tier, random reads only the bytes asked of the disk tier.
"""

from __future__ import annotations

import functools

from pffs import retry
from pffs.backends.base import block_runs
from pffs.cache.blocks import BlockCache
from pffs.cache.keys import BlockKey, ColdStart, Deliver
from pffs.cache.readahead import Readahead
from pffs.errors import Changed, IsADirectory
from pffs.fs.fetching import fetch_blocks, fetch_range
from pffs.fs.handles import FileHandle, Handles
from pffs.fs.namespace import Namespace
from pffs.fs.pagecache import PagePusher

# A file this small is fetched whole from its open on: the kernel's first read (up to the
# mount's max_read) will want all of it, and the GET then overlaps the open's reply.
FETCH_AT_OPEN = 1 << 20
# A read wanting at most this share of a block nobody holds gets its bytes with a request of
# its own while the block loads behind it (the first byte of a file, a random 4 KiB read).
COLD_START_SHARE = 4
# The largest window of cached bytes pushed into the kernel's page cache around a random read
# (pffs.fs.pagecache): chosen by the cost of notify_store per size, docs/BENCHMARKS.md.
PUSH_MAX = 1 << 20


class Reader:
    """Opens files for reading and serves their bytes from the cache or the store."""

    def __init__(self, namespace: Namespace, handles: Handles, cache: BlockCache) -> None:
        self.namespace = namespace
        self.handles = handles
        self.cache = cache
        self.block_size = cache.block_size
        self.pages = PagePusher(PUSH_MAX, cache.stats)

    async def open(self, ino: int) -> tuple[int, bool]:
        """Open for reading. Returns (handle, keep_cache).

        keep_cache tells the kernel it may keep pages from an earlier open: true only when the
        object's version is the one those pages came from.
        """
        inode = await self.namespace.getattr(ino, ask_store=True)
        if inode.is_dir:
            raise IsADirectory(f"{inode.path} is a directory")
        version = inode.info.version
        keep_cache = inode.kernel_version == version
        inode.kernel_version = version
        if not keep_cache:  # the kernel drops its pages at the reply: no old push may follow
            await self.pages.settle()
        size = inode.info.size
        readahead = Readahead(self.block_size, self.cache.readahead_limit, size)
        mounted, inside = self.namespace.route(inode.path)
        handle = FileHandle(inode, version, size, readahead, mounted, inside)
        if 0 < size <= min(FETCH_AT_OPEN, self.block_size):
            self.cache.prefetch(
                [self._block_key(handle, 0)], [size], functools.partial(self._fetch_run, handle, 0)
            )
        return self.handles.add(handle), keep_cache

    async def read(self, handle: FileHandle, offset: int, size: int) -> bytes | memoryview:
        """Bytes [offset, offset+size) of the version opened, through the block cache."""
        if offset >= handle.size or size <= 0:
            return b""
        end = min(offset + size, handle.size)
        # Ask for blocks ahead before waiting on this one, so both travel at once.
        ahead = handle.readahead.on_read(offset, end)
        if ahead:
            self.cache.prefetch(
                [self._block_key(handle, index) for index in ahead],
                [self._block_length(handle, index) for index in ahead],
                functools.partial(self._fetch_run, handle, ahead.start),
                coalesce=block_runs(handle.mounted.backend) is not None,
                at_end=ahead.stop > handle.readahead.last_block,
            )
        try:
            with retry.asking():  # the bound on this read counts from now (pffs.retry)
                data = await self._read_blocks(handle, offset, end)
        except Changed:
            # The store holds a newer version: this open keeps failing (never mixing versions),
            # the next open must not trust the listing or attributes that named the old one.
            self.namespace.outdated(handle.inode.path)
            raise
        if self.pages.enabled:
            self._push_around(handle, offset)
        return data

    def _push_around(self, handle: FileHandle, offset: int) -> None:
        """After a random read reached pffs, hand the kernel the cached bytes around it, so the
        next reads nearby are answered by its page cache (pffs.fs.pagecache)."""
        window = self.pages.window(handle, offset, self.block_size)
        if window is None:
            return
        start, stop = window
        index = start // self.block_size
        key = self._block_key(handle, index)
        read = self.cache.part_reader(key, start - index * self.block_size, stop - start)
        if read is not None:
            self.pages.push(handle, start, read)

    async def _read_blocks(self, handle: FileHandle, offset: int, end: int) -> bytes | memoryview:
        first, last = offset // self.block_size, (end - 1) // self.block_size
        pieces: list[bytes | memoryview] = []
        for index in range(first, last + 1):
            key = self._block_key(handle, index)
            fetch = functools.partial(self._fetch_block, handle, index)
            block_length = self._block_length(handle, index)
            start = max(offset - index * self.block_size, 0)
            stop = min(end - index * self.block_size, block_length)
            small = (stop - start) * COLD_START_SHARE <= block_length
            if small and not self.cache.is_cached_or_coming(key):  # a first or random read
                cold_start = ColdStart(
                    block_length,
                    functools.partial(self._fetch_run, handle, index),
                    functools.partial(
                        self._fetch_bytes, handle, index * self.block_size + start, stop - start
                    ),
                )
                part = await self.cache.read_part(key, start, stop - start, fetch, cold_start)
                pieces.append(part)
            elif handle.readahead.sequential:
                block = await self.cache.read(key, fetch, served=stop - start)
                pieces.append(memoryview(block)[start:stop])
            else:  # random access: only what is asked of the disk tier
                pieces.append(await self.cache.read_part(key, start, stop - start, fetch))
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def _block_key(self, handle: FileHandle, index: int) -> BlockKey:
        source_id = handle.mounted.backend.source_id
        return BlockKey(source_id, handle.path_in_source, handle.version, index)

    def _block_length(self, handle: FileHandle, index: int) -> int:
        return min(self.block_size, handle.size - index * self.block_size)

    async def _fetch_block(self, handle: FileHandle, index: int) -> bytes:
        return await self._fetch_bytes(
            handle, index * self.block_size, self._block_length(handle, index)
        )

    async def _fetch_bytes(self, handle: FileHandle, offset: int, length: int) -> bytes:
        mounted = handle.mounted
        return await fetch_range(
            mounted.limiter, mounted.backend, handle.path_in_source, handle.version, offset, length
        )

    async def _fetch_run(
        self, handle: FileHandle, base: int, first: int, count: int, deliver: Deliver
    ) -> None:
        """Blocks base+first .. base+first+count-1 for a prefetch, each delivered as it lands."""
        indices = range(base + first, base + first + count)
        await fetch_blocks(
            handle.mounted.ahead,
            handle.mounted.backend,
            handle.path_in_source,
            handle.version,
            self.block_size,
            indices.start,
            [self._block_length(handle, index) for index in indices],
            deliver,
            first,
        )
