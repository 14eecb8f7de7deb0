"""The store floor: the least a pyfuse3 file system does to serve a bucket's files, run in a
child process of bench.probes.client_reads (`--system floor`) to show what bounds a pattern
besides pffs's own choices.

Every file is fetched whole from its open, in 16 MiB GETs (pffs's largest readahead request)
of pffs's own S3 GET engine, GETS of them at once over all the open files (the file with the
fewest on their way asks next: four readers get two each), its 4 MiB pieces held in memory
until the mount ends; a READ waits for the pieces it covers and is answered with a slice of
them, as pffs answers from its memory tier. No cache tiers, no disk, no readahead policy, no
metadata beyond the listing it is given: what is left is the store's bytes, pyfuse3's session
loop on trio and the kernel's FUSE work, on the same cores as the client. A file's bytes are
all fetched even when its reader wants a few: the floor of the sequential patterns (and of the
Arrow batches, whose whole file every system fetches), not of the ranged ones.

With `--keep DIR` it is the floor of a caching file system: each piece is also written to a file
of its own in DIR as it lands, by two writer threads with O_DIRECT from an aligned copy, as
pffs's disk tier writes its blocks (pffs.cache.entries); READs never wait for it.

    python -m bench.probes._storefloor MOUNTPOINT --bucket B --endpoint-url URL --objects JSON \
        [--keep DIR]
"""

from __future__ import annotations

import argparse
import errno
import json
import math
import mmap
import os
import stat
import sys
from collections.abc import Sequence

import pyfuse3
import trio

from pffs.backends.s3 import S3Backend
from pffs.config import FuseConfig, SourceConfig

MIB = 1 << 20
PIECE = 4 * MIB  # pffs's block
RUN_PIECES = 4  # pieces per GET: 16 MiB
GETS = 8  # GETs in flight, all files together (the bench's ceiling is curl's 8 at once)
WRITERS = 2  # as pffs's disk tier
ALIGN = 4096  # O_DIRECT's alignment of buffer, offset and length


class _File:
    """One object: its pieces as they land, and how far its fetch has gone."""

    def __init__(self, key: str, size: int) -> None:
        self.key, self.size = key, size
        count = -(-size // PIECE)
        self.pieces: list[bytes] = [b""] * count
        self.landed = [trio.Event() for _ in range(count)]
        self.runs = -(-count // RUN_PIECES)
        self.next_run = 0
        self.in_flight = 0
        self.opened: int | None = None  # the order of its first open
        self.error: str | None = None

    def lengths(self, run: int) -> list[int]:
        first = run * RUN_PIECES
        last = min(first + RUN_PIECES, len(self.pieces))
        return [min(PIECE, self.size - p * PIECE) for p in range(first, last)]


class _Tree:
    """Inodes of the listed objects and of the directories their keys name."""

    def __init__(self, objects: dict[str, int]) -> None:
        self.children: dict[int, dict[bytes, int]] = {pyfuse3.ROOT_INODE: {}}
        self.files: dict[int, _File] = {}
        for key, size in sorted(objects.items()):
            parent = pyfuse3.ROOT_INODE
            *dirs, name = key.split("/")
            for part in dirs:
                entries = self.children[parent]
                if part.encode() not in entries:
                    entries[part.encode()] = self._new_inode()
                    self.children[entries[part.encode()]] = {}
                parent = entries[part.encode()]
            inode = self._new_inode()
            self.children[parent][name.encode()] = inode
            self.files[inode] = _File(key, size)

    def _new_inode(self) -> int:
        return pyfuse3.ROOT_INODE + 1 + len(self.children) + len(self.files)

    def attributes(self, inode: int) -> pyfuse3.EntryAttributes:
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = pyfuse3.InodeT(inode)
        attr.entry_timeout = attr.attr_timeout = 60
        if inode in self.children:
            attr.st_mode = pyfuse3.ModeT(stat.S_IFDIR | 0o755)
            attr.st_nlink = 2
        elif inode in self.files:
            attr.st_mode = pyfuse3.ModeT(stat.S_IFREG | 0o644)
            attr.st_nlink = 1
            attr.st_size = self.files[inode].size
            attr.st_blksize = MIB  # as pffs's
        else:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return attr


class StoreFloor(pyfuse3.Operations):
    """The file system, and its fetchers (run `fetch` GETS times beside pyfuse3's loop)."""

    def __init__(self, tree: _Tree, backend: S3Backend, keep_dir: str | None = None) -> None:
        super().__init__()
        self.tree, self.backend = tree, backend
        self._opens = 0
        self._work = trio.Event()
        self.keep_dir = keep_dir
        self._to_keep, self._kept = trio.open_memory_channel[tuple[_File, int]](math.inf)
        self._spare: list[mmap.mmap] = []  # the writers' aligned buffers (list ops are atomic)

    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        inode = self.tree.children.get(parent_inode, {}).get(name)
        if inode is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self.tree.attributes(inode)

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return self.tree.attributes(inode)

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileHandleT:
        if inode not in self.tree.children:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return pyfuse3.FileHandleT(inode)

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        entries = sorted(self.tree.children[fh].items())
        for index in range(start_id, len(entries)):
            name, inode = entries[index]
            if not pyfuse3.readdir_reply(token, name, self.tree.attributes(inode), index + 1):
                return

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        file = self.tree.files.get(inode)
        if file is None:
            raise pyfuse3.FUSEError(errno.EISDIR if inode in self.tree.children else errno.ENOENT)
        if file.opened is None:
            file.opened, self._opens = self._opens, self._opens + 1
            self._work.set()
        return pyfuse3.FileInfo(fh=pyfuse3.FileHandleT(inode))

    async def read(self, fh: int, off: int, size: int) -> bytes:
        file = self.tree.files[fh]
        end = min(off + size, file.size)
        if off >= end:
            return b""
        first, last = off // PIECE, (end - 1) // PIECE
        for piece in range(first, last + 1):
            await file.landed[piece].wait()
        if file.error is not None:
            print(f"store floor: {file.key}: {file.error}", file=sys.stderr)
            raise pyfuse3.FUSEError(errno.EIO)
        if first == last:  # the usual case: a 1 MiB READ within one piece, no copy
            base = first * PIECE
            return memoryview(file.pieces[first])[off - base : end - base]  # type: ignore[return-value]
        spans = [
            memoryview(file.pieces[p])[
                max(off, p * PIECE) - p * PIECE : min(end, (p + 1) * PIECE) - p * PIECE
            ]
            for p in range(first, last + 1)
        ]
        return b"".join(spans)

    def _next(self) -> tuple[_File, int] | None:
        """The run to ask for next: of the open files with runs left, the one with the fewest
        on their way, the first opened among those."""
        waiting = [
            f for f in self.tree.files.values() if f.opened is not None and f.next_run < f.runs
        ]
        if not waiting:
            return None
        file = min(waiting, key=lambda f: (f.in_flight, f.opened))
        file.next_run += 1
        return file, file.next_run - 1

    async def fetch(self) -> None:
        """One GET slot, for good."""
        while True:
            chosen = self._next()
            if chosen is None:
                if self._work.is_set():  # set for opens whose runs are all taken
                    self._work = trio.Event()
                await self._work.wait()
                continue
            file, run = chosen
            file.in_flight += 1
            try:
                await trio.to_thread.run_sync(self._get, file, run)
            finally:
                file.in_flight -= 1

    def _get(self, file: _File, run: int) -> None:
        """A worker thread's GET of one run; each piece handed to trio as it lands."""
        first = run * RUN_PIECES
        lengths: Sequence[int] = file.lengths(run)
        try:
            pieces = self.backend.read_blocks(file.key, first * PIECE, lengths, None)
            for index, data in enumerate(pieces):
                trio.from_thread.run_sync(self._land, file, first + index, data)
        except Exception as exc:  # a probe's mount: the READs that need it fail with EIO
            file.error = f"{type(exc).__name__}: {exc}"
            for index in range(first, first + len(lengths)):
                trio.from_thread.run_sync(file.landed[index].set)

    def _land(self, file: _File, piece: int, data: bytes) -> None:
        file.pieces[piece] = data
        file.landed[piece].set()
        if self.keep_dir is not None:
            self._to_keep.send_nowait((file, piece))

    async def keep(self) -> None:
        """One disk writer, for good (`--keep`)."""
        async for file, piece in self._kept:
            await trio.to_thread.run_sync(self._write, file, piece)

    def _write(self, file: _File, piece: int) -> None:
        """A piece to a file of its own with O_DIRECT, from an aligned copy of it in a buffer
        the writers reuse (a fresh one per piece costs its page faults, as pffs's would)."""
        data = file.pieces[piece]
        length = -(-len(data) // ALIGN) * ALIGN
        aligned = self._spare.pop() if self._spare else mmap.mmap(-1, PIECE)
        try:
            aligned[: len(data)] = data
            aligned[len(data) : length] = bytes(length - len(data))  # a reused buffer's padding
            name = os.path.join(str(self.keep_dir), f"{file.opened}-{piece}")
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o600)
            try:
                os.write(fd, memoryview(aligned)[:length])
            finally:
                os.close(fd)
        finally:
            self._spare.append(aligned)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.probes._storefloor", description=__doc__)
    parser.add_argument("mountpoint")
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--endpoint-url", required=True)
    parser.add_argument("--objects", required=True, help="a JSON file: key -> size")
    parser.add_argument("--keep", metavar="DIR", help="write each piece to DIR as it lands")
    args = parser.parse_args(argv)
    with open(args.objects, encoding="utf-8") as f:
        objects = {str(key): int(size) for key, size in json.load(f).items()}
    backend = S3Backend(SourceConfig(url=f"s3://{args.bucket}", endpoint_url=args.endpoint_url))
    floor = StoreFloor(_Tree(objects), backend, args.keep)

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(GETS):
                nursery.start_soon(floor.fetch)
            for _ in range(WRITERS if args.keep else 0):
                nursery.start_soon(floor.keep)
            await pyfuse3.main(min_tasks=4, max_tasks=FuseConfig.max_tasks)
            nursery.cancel_scope.cancel()

    pyfuse3.init(floor, args.mountpoint, {*pyfuse3.default_options, "fsname=store-floor"})
    try:
        trio.run(serve)
    finally:
        pyfuse3.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
