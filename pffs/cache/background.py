"""The cache's background work: tasks started in the nursery it is given, and waiting for them.

Disk writes behind a reader and readahead run here, so a read never waits for them; `idle`
waits until none is left (before an unmount, so blocks fetched reach the disk). Without a
nursery there is no background work: the cache then neither reads ahead nor writes behind.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVarTuple

import trio

Ts = TypeVarTuple("Ts")


class Background:
    def __init__(self) -> None:
        self._nursery: trio.Nursery | None = None
        self._running = 0  # tasks started and not finished yet
        self._idle = trio.Event()
        self._idle.set()

    def attach(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    @property
    def attached(self) -> bool:
        return self._nursery is not None

    def spawn(self, fn: Callable[[*Ts], Awaitable[object]], *args: *Ts) -> None:
        """Start `fn(*args)` in the nursery (one must be attached)."""
        assert self._nursery is not None

        async def tracked() -> None:
            try:
                await fn(*args)
            finally:
                self._running -= 1
                if self._running == 0:
                    self._idle.set()

        if self._running == 0:
            self._idle = trio.Event()
        self._running += 1
        self._nursery.start_soon(tracked)

    async def idle(self) -> None:
        """Wait until no task started here is left."""
        await self._idle.wait()
