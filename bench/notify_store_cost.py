"""`python -m bench.notify_store_cost`: what FUSE notify_store costs per size (issue 18).

pffs pushes cached bytes into the kernel's page cache around random reads (pffs.fs.pagecache);
this measures the kernel primitive alone, to choose the size of those pushes. A minimal pyfuse3
file system (not pffs) shows one file of `--file-mib` MiB; a thread stores windows of each size
into its page cache, one after the other without overlap over `--span-mib` MiB, pages absent
(dropped first, as root), and reports the thread's CPU (thread_time) and wall time per push.

    .venv/bin/python -m bench.notify_store_cost
"""

from __future__ import annotations

import argparse
import errno
import os
import stat
import subprocess
import sys
import tempfile
import threading
import time

import pyfuse3
import trio

from bench.scenarios import drop_caches

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30
FILE_INODE = 2
SIZES = (4 * KIB, 64 * KIB, 256 * KIB, MIB, 4 * MIB)


class OneFile(pyfuse3.Operations):
    """A read-only root with one file of zeros, `f`."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    async def getattr(
        self, inode: int, ctx: pyfuse3.RequestContext | None = None
    ) -> pyfuse3.EntryAttributes:
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = pyfuse3.InodeT(inode)
        entry.entry_timeout = entry.attr_timeout = 300
        if inode == pyfuse3.ROOT_INODE:
            entry.st_mode = pyfuse3.ModeT(stat.S_IFDIR | 0o755)
            entry.st_nlink = 2
        else:
            entry.st_mode = pyfuse3.ModeT(stat.S_IFREG | 0o444)
            entry.st_size = self.size
        return entry

    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        if name != b"f":
            raise pyfuse3.FUSEError(errno.ENOENT)
        return await self.getattr(FILE_INODE)

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        return pyfuse3.FileInfo(fh=pyfuse3.FileHandleT(1), keep_cache=True)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        return bytes(max(0, min(size, self.size - off)))


def _drop_page_cache() -> None:
    if not drop_caches("1"):  # the page cache only: the kernel must keep the inode
        print("notify_store_cost: not root, pages may be present", file=sys.stderr)


def _measure(mountpoint: str, span: int) -> None:
    os.stat(os.path.join(mountpoint, "f"))  # the kernel must know the inode to store into it
    payload = memoryview(os.urandom(max(SIZES)))
    for size in SIZES:
        _drop_page_cache()
        count = span // size
        cpu, wall = time.thread_time(), time.perf_counter()
        for index in range(count):
            pyfuse3.notify_store(FILE_INODE, index * size, payload[:size])  # type: ignore[arg-type]
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
        print(
            f"{size // KIB:>5} KiB: {cpu / count * 1e6:8.1f} us CPU, {wall / count * 1e6:8.1f} us"
            f" wall per push, {cpu / span * GIB:.2f} CPU-s/GiB",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--file-mib", type=int, default=1024)
    parser.add_argument("--span-mib", type=int, default=256)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="notify-store-") as mountpoint:
        pyfuse3.init(OneFile(args.file_mib * MIB), mountpoint, set(pyfuse3.default_options))

        def measure_then_unmount() -> None:
            try:
                time.sleep(0.3)  # let the main loop answer INIT
                _measure(mountpoint, min(args.span_mib, args.file_mib) * MIB)
            finally:
                subprocess.run(["fusermount3", "-u", mountpoint], check=False)

        threading.Thread(target=measure_then_unmount, daemon=True).start()
        try:
            trio.run(pyfuse3.main)
        finally:
            pyfuse3.close(unmount=False)


if __name__ == "__main__":
    main()
