"""The minimal FUSE file systems bench.probes.fuse_floor measures pffs against: pyfuse3 and trio
answering from memory, nothing else. `serve`: a directory of many names (a lookup's floor);
`serve_file`: one file and its quarters (a read's floor). Each runs in the probe's child process
(`python -m bench.probes.fuse_floor --serve MOUNTPOINT`)."""

from __future__ import annotations

import collections
import errno
import json
import os
import signal
import stat

from pffs.config import FuseConfig

WIDE_INODE = 2
MIB = 1 << 20
SCAN_READERS = 4  # the Parquet scan's readers (bench.clients.READERS)
# The --read-mib file system's files: the whole, and its quarters as files of their own in a
# directory of their own (pffs preloads a directory's other files once a few are read: the
# whole would be preloaded beside the quarters).
FILE_NAME = "data"
PART_DIR = "parts"
PART_NAMES = [f"{PART_DIR}/part{i}" for i in range(SCAN_READERS)]


def serve(mountpoint: str, files: int) -> None:
    """The minimal file system, in this process until unmounted."""
    import pyfuse3  # only the child serving the mount needs it
    import trio

    def entry(ino: int, is_dir: bool) -> pyfuse3.EntryAttributes:
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = pyfuse3.InodeT(ino)
        attr.entry_timeout = attr.attr_timeout = 60
        attr.st_mode = pyfuse3.ModeT((stat.S_IFDIR | 0o755) if is_dir else (stat.S_IFREG | 0o644))
        attr.st_nlink = 2 if is_dir else 1
        return attr

    class Names(pyfuse3.Operations):
        def __init__(self) -> None:
            super().__init__()
            self.inos = {f"f{i:07d}".encode(): WIDE_INODE + 1 + i for i in range(files)}

        async def lookup(
            self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
        ) -> pyfuse3.EntryAttributes:
            if parent_inode == pyfuse3.ROOT_INODE and name == b"wide":
                return entry(WIDE_INODE, True)
            if parent_inode == WIDE_INODE and name in self.inos:
                return entry(self.inos[name], False)
            raise pyfuse3.FUSEError(errno.ENOENT)

        async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
            return entry(inode, inode <= WIDE_INODE)

    pyfuse3.init(Names(), mountpoint, {"fsname=fuse-floor"})
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close()


def file_spans(size: int) -> dict[str, tuple[int, int]]:
    """The --read-mib files over `size` bytes: name -> (offset, length) in them."""
    quarter = size // SCAN_READERS
    spans = {FILE_NAME: (0, size)}
    spans.update({name: (i * quarter, quarter) for i, name in enumerate(PART_NAMES)})
    return spans


def serve_file(mountpoint: str, mib: int, counts_path: str) -> None:
    """The minimal file system of one file of `mib` MiB and its quarters (file_spans), from one
    bytes object, in this process until unmounted.

    Mounted as pffs mounts (pffs.fuse_ops.serve): pyfuse3's default options, its session loop
    with the same task bounds. Each READ's size is counted; SIGUSR1 writes the counts to
    `counts_path` (JSON, size -> READs) and starts them again.
    """
    import pyfuse3
    import trio

    content = bytes(range(256)) * (MIB // 256) * mib
    view = memoryview(content)
    sizes: collections.Counter[int] = collections.Counter()
    spans = file_spans(len(content))
    part_dir = pyfuse3.ROOT_INODE + 1
    inodes = {name: part_dir + 1 + i for i, name in enumerate(spans)}
    by_inode = {ino: spans[name] for name, ino in inodes.items()}

    def attributes(ino: int) -> pyfuse3.EntryAttributes:
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = pyfuse3.InodeT(ino)
        attr.entry_timeout = attr.attr_timeout = 60
        if ino in (pyfuse3.ROOT_INODE, part_dir):
            attr.st_mode = pyfuse3.ModeT(stat.S_IFDIR | 0o755)
            attr.st_nlink = 2
        else:
            attr.st_mode = pyfuse3.ModeT(stat.S_IFREG | 0o644)
            attr.st_nlink = 1
            attr.st_size = by_inode[ino][1]
            attr.st_blksize = MIB  # as pffs's
        return attr

    class OneFile(pyfuse3.Operations):
        async def lookup(
            self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
        ) -> pyfuse3.EntryAttributes:
            if parent_inode == pyfuse3.ROOT_INODE and name == PART_DIR.encode():
                return attributes(part_dir)
            path = os.fsdecode(name)
            if parent_inode == part_dir:
                path = f"{PART_DIR}/{path}"
            elif parent_inode != pyfuse3.ROOT_INODE:
                raise pyfuse3.FUSEError(errno.ENOENT)
            if path in inodes:
                return attributes(inodes[path])
            raise pyfuse3.FUSEError(errno.ENOENT)

        async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
            return attributes(inode)

        async def open(
            self, inode: int, flags: int, ctx: pyfuse3.RequestContext
        ) -> pyfuse3.FileInfo:
            return pyfuse3.FileInfo(fh=pyfuse3.FileHandleT(inode))

        async def read(self, fh: int, off: int, size: int) -> bytes:
            sizes[size] += 1
            start, length = by_inode[fh]
            end = start + min(off + size, length)
            return view[start + off : end]  # type: ignore[return-value]  # as pffs's read

    def write_counts(_signum: int, _frame: object) -> None:
        with open(counts_path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(dict(sizes), f)
        os.replace(counts_path + ".tmp", counts_path)
        sizes.clear()

    signal.signal(signal.SIGUSR1, write_counts)
    pyfuse3.init(OneFile(), mountpoint, {*pyfuse3.default_options, "fsname=fuse-floor"})
    try:
        trio.run(lambda: pyfuse3.main(min_tasks=4, max_tasks=FuseConfig.max_tasks))
    finally:
        pyfuse3.close()
