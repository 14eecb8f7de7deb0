"""The memory tier: an LRU of blocks, bounded in bytes.

Touched only from trio tasks (never from worker threads), so it needs no lock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable

from pffs.cache.stats import CacheStats


class MemoryTier:
    def __init__(
        self,
        capacity: int,
        stats: CacheStats,
        on_evict: Callable[[Hashable], None] | None = None,
    ) -> None:
        """`on_evict` is told of each block evicted to make room (the cache counts those
        loaded ahead, never read)."""
        self.capacity = max(0, capacity)
        self.used = 0
        self.stats = stats
        self._blocks: OrderedDict[Hashable, bytes] = OrderedDict()
        self.on_evict = on_evict

    def get(self, key: Hashable) -> bytes | None:
        data = self._blocks.get(key)
        if data is not None:
            self._blocks.move_to_end(key)
        return data

    def __contains__(self, key: Hashable) -> bool:
        return key in self._blocks

    def put(self, key: Hashable, data: bytes) -> None:
        if len(data) > self.capacity:
            return  # larger than the whole tier: caching it would only evict everything else
        old = self._blocks.pop(key, None)
        if old is not None:
            self.used -= len(old)
        self._blocks[key] = data
        self.used += len(data)
        while self.used > self.capacity:
            evicted_key, evicted = self._blocks.popitem(last=False)
            self.used -= len(evicted)
            self.stats.memory_evictions += 1
            if self.on_evict is not None:
                self.on_evict(evicted_key)

    def discard(self, key: Hashable) -> None:
        old = self._blocks.pop(key, None)
        if old is not None:
            self.used -= len(old)

    def __len__(self) -> int:
        return len(self._blocks)
