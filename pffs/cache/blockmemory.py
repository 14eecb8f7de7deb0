"""Block memory: page-aligned buffers a streamed block is received into, reused once nothing
holds the block any more.

A block fetched from the store used to land in a fresh `bytes` and then be copied, with its
CRCs, into an aligned buffer for the disk tier's O_DIRECT write. On this project's machines
fresh memory is dear: a copy into pages touched for the first time ran at 1.1 GB/s against
7.6 GB/s into pages used before (a virtual machine whose host backs a guest page only when it
is first touched; docs/notes/block-memory.md). Here a block is received straight into an
anonymous mapping (page-aligned, its length rounded up to `entries.ALIGN`), so the disk tier
writes the block itself (`entries.write_entry`), and the mapping serves the next block once the
cache, the disk tier's queue and every FUSE reply or peer that took a view of it let go.

Whether anything still holds a block is CPython's reference count of its mapping: every
memoryview of a mapping, and every slice of one, keeps one reference to it through its shared
buffer, so a mapping only the pool refers to is free. A mapping lives as long as its
block would have as `bytes`; the pool keeps at most `SPARE_BYTES` of free ones beyond that.

Thread-safe: worker threads take buffers while the cache's thread drops blocks.
"""

from __future__ import annotations

import mmap
import sys
import threading
import weakref

from pffs.cache.entries import ALIGN

# Free mappings the pool keeps for the next blocks; more are let go. Held ones are the blocks'
# own memory, bounded where the blocks are (the memory tier's bound, the disk tier's queue).
SPARE_BYTES = 64 << 20

# References to a free mapping while the pool looks at it: its list, the loop's name and
# getrefcount's own argument. Each view of it (and its slices) adds one.
_FREE_REFERENCES = 3


def _mapping_size(length: int) -> int:
    return max(-(-length // ALIGN) * ALIGN, ALIGN)


class BlockMemory:
    """A bounded pool of mappings to receive blocks into (see the module's docstring)."""

    def __init__(self, spare_bytes: int = SPARE_BYTES) -> None:
        """`spare_bytes`: free mappings kept for the next blocks."""
        self.spare_bytes = spare_bytes
        self._mappings: list[mmap.mmap] = []
        self._largest = 0  # new mappings take the largest size asked yet: any block fits one
        self._lock = threading.Lock()
        # The read-only view of each block handed out, by id: a block is recognised as one
        # starting its mapping only when it is that very object (`mapping_of`).
        self._blocks: weakref.WeakValueDictionary[int, memoryview] = weakref.WeakValueDictionary()

    def take(self, length: int) -> tuple[memoryview, memoryview] | None:
        """(a writable buffer of `length` bytes to receive a block into, the read-only block
        it becomes), both starting a free mapping, or a new one when none is free. The caller
        drops the writable buffer once the block is in. None for a block under half the
        mappings' size (an object's short last block): its mapping would hold more memory than
        the cache counts for it."""
        size = _mapping_size(length)
        if 2 * size < self._largest:
            return None
        with self._lock:
            mapping = self._free(size)
            if mapping is None:
                self._largest = max(self._largest, size)
                mapping = mmap.mmap(-1, self._largest)
                self._mappings.append(mapping)
            target = memoryview(mapping)[:length]
            block = target.toreadonly()
            self._blocks[id(block)] = block
        return target, block

    def mapping_of(self, block: object) -> mmap.mmap | None:
        """The mapping `block` starts when it is a block `take` handed out (its length rounded
        up to ALIGN fits in it), else None."""
        with self._lock:
            if not isinstance(block, memoryview) or self._blocks.get(id(block)) is not block:
                return None
        mapping = block.obj
        assert isinstance(mapping, mmap.mmap)
        return mapping

    def _free(self, size: int) -> mmap.mmap | None:
        """A free mapping of at least `size` bytes, if any; free ones beyond the spare bound
        are let go (unmapped once the pool drops them)."""
        found: mmap.mmap | None = None
        kept: list[mmap.mmap] = []
        spare = 0
        for mapping in self._mappings:
            if sys.getrefcount(mapping) > _FREE_REFERENCES:
                kept.append(mapping)  # a block holds it
            elif found is None and len(mapping) >= size:
                found = mapping
                kept.append(mapping)
            elif spare + len(mapping) <= self.spare_bytes:
                spare += len(mapping)
                kept.append(mapping)
        self._mappings = kept
        return found

    def held(self) -> int:
        with self._lock:
            taken = 0
            for mapping in self._mappings:
                if sys.getrefcount(mapping) > _FREE_REFERENCES:
                    taken += len(mapping)
            return taken

    def kept(self) -> int:
        """Bytes of every mapping the pool keeps, held or free (for tests)."""
        with self._lock:
            return sum(len(mapping) for mapping in self._mappings)


# One pool per process: blocks of every mount and source in it share the bound.
BLOCK_MEMORY = BlockMemory()
