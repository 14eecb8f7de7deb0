"""Warmup through a mount: read files inside a pffs mount whose settings this process cannot see.

`pffs warmup PATH` fills the disk cache directly when PATH's mount left its record here (the
same machine and mount namespace). A pod that has the mount only as a bind mount, such as
Fluid's DataProcess with the Dataset's volume or a pod of pffs's CSI driver, sees no record and
no cache directory. There warmup reads every file through the mount, `jobs` files at a time;
the process serving the mount fetches the blocks and keeps them in its own cache, as it does
for any reader.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import trio

from pffs.fs.special import HIDDEN_DIR
from pffs.workers import run_blocking

CHUNK = 1 << 20  # FUSE's largest read request


def files_under(paths: list[str]) -> Iterator[tuple[str, int]]:
    """(path, size) of every regular file at or under `paths`, depth first."""
    for top in paths:
        if os.path.isfile(top):
            yield top, os.path.getsize(top)
            continue
        for folder, subdirs, names in os.walk(top):
            # The mount's hidden `.pffs` directory (stats, the preload file) is not data.
            subdirs[:] = sorted(d for d in subdirs if d != HIDDEN_DIR)
            for name in sorted(names):
                path = os.path.join(folder, name)
                if os.path.isfile(path):
                    yield path, os.path.getsize(path)


def read_all(path: str) -> int:
    """Read `path` to its end, keeping nothing; the bytes read."""
    buffer = bytearray(CHUNK)
    total = 0
    with open(path, "rb", buffering=0) as f:
        while count := f.readinto(buffer):
            total += count
    return total


async def warm_through(
    paths: list[str], jobs: int, on_file: Callable[[str, int, OSError | None], None]
) -> None:
    """Read the files under `paths` through their mount, `jobs` at a time; `on_file(path,
    bytes read, error)` after each."""
    limiter = trio.CapacityLimiter(jobs)
    files = await run_blocking(limiter, lambda: list(files_under(paths)))
    send, receive = trio.open_memory_channel[tuple[str, int]](0)

    async def reader() -> None:
        async for path, _size in receive:
            try:
                count = await run_blocking(limiter, read_all, path)
            except OSError as exc:
                on_file(path, 0, exc)
            else:
                on_file(path, count, None)

    async with trio.open_nursery() as nursery:
        for _ in range(jobs):
            nursery.start_soon(reader)
        async with send:  # closing it ends the readers
            for item in files:
                await send.send(item)
