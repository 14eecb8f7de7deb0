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
buffer, so a mapping only the pool refers to is free. The pool keeps at most `SPARE_BYTES` of
mappings; when all are held, `take` gives None and the caller receives into a fresh `bytes`
as before, so a burst of many readers costs no more memory than it did.

Thread-safe: worker threads take buffers while the cache's thread drops blocks.
"""

from __future__ import annotations

import mmap
import sys
import threading
import weakref

from pffs.cache.entries import ALIGN

# The pool's bound: about a lone sequential reader's blocks in flight and passed but not yet
# written (a 32 MiB window of 4 MiB blocks, and the disk tier's write slots).
SPARE_BYTES = 64 << 20

# References to a free mapping while the pool looks at it: its list, the loop's name and
# getrefcount's own argument. Each view of it (and its slices) adds one.
_FREE_REFERENCES = 3


def _mapping_size(length: int) -> int:
    return max(-(-length // ALIGN) * ALIGN, ALIGN)


class BlockMemory:
    """A bounded pool of mappings to receive blocks into (see the module's docstring)."""

    def __init__(self, spare_bytes: int = SPARE_BYTES) -> None:
        self.spare_bytes = spare_bytes
        self._mappings: list[mmap.mmap] = []
        self._largest = 0  # new mappings take the largest size asked yet: any block fits one
        self._lock = threading.Lock()
        # The read-only view of each block handed out, by id: a block is recognised as one
        # starting its mapping only when it is that very object (`mapping_of`).
        self._blocks: weakref.WeakValueDictionary[int, memoryview] = weakref.WeakValueDictionary()

    def take(self, length: int) -> tuple[memoryview, memoryview] | None:
        """(a writable buffer of `length` bytes to receive a block into, the read-only block
        it becomes), both starting a free mapping; None when the pool's mappings are all held.
        The caller drops the writable buffer once the block is in."""
        size = _mapping_size(length)
        with self._lock:
            mapping = self._free(size)
            if mapping is None:
                self._largest = max(self._largest, size)
                if self._allocated() + self._largest > self.spare_bytes:
                    return None
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
        for mapping in self._mappings:
            if len(mapping) >= size and sys.getrefcount(mapping) <= _FREE_REFERENCES:
                return mapping
        return None

    def _allocated(self) -> int:
        return sum(len(mapping) for mapping in self._mappings)

    def held(self) -> int:
        """Bytes of the pool's mappings some block still holds (for tests)."""
        with self._lock:
            taken = 0
            for mapping in self._mappings:
                if sys.getrefcount(mapping) > _FREE_REFERENCES:
                    taken += len(mapping)
            return taken


# One pool per process: blocks of every mount and source in it share the bound.
BLOCK_MEMORY = BlockMemory()
