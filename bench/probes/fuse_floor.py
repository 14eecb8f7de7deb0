"""`python -m bench.probes.fuse_floor`: the CPU of one FUSE lookup through pyfuse3 and trio alone.

Every request the kernel sends pffs goes through pyfuse3's session loop on trio before pffs's
own code runs. This measures that floor with a minimal pyfuse3 file system (not pffs): a
directory of `--files` names whose lookup is one dict lookup, mounted in a child process. The
kernel's dentries are dropped (as root), then every name is stat'ed in turn, so that each stat
is one FUSE LOOKUP; the child's CPU (utime + stime from /proc/PID/stat: its Python, pyfuse3
and the kernel work done on its behalf) is divided by the stats. Then the same on `pffs mount`
of a `file://` tree of the same names (defaults but `--cache-dir none`), listed once first so
that its lookups are answered from its listing, as after `ls -l`.

    python -m bench.probes.fuse_floor --files 10000 --reps 3
"""

from __future__ import annotations

import argparse
import errno
import os
import stat
import subprocess
import sys
import tempfile
import time

from bench.systems import cpu_seconds

WIDE_INODE = 2


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


def lookups(mountpoint: str, pid: int, files: int, reps: int) -> list[float]:
    """CPU microseconds of the serving process per stat that became a LOOKUP, per repetition."""
    paths = [os.path.join(mountpoint, "wide", f"f{i:07d}") for i in range(files)]
    figures = []
    for _ in range(reps):
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("2")  # dentries and inodes: every stat below asks the file system
        before = cpu_seconds(pid)
        for path in paths:
            os.stat(path)
        after = cpu_seconds(pid)
        if before is None or after is None:
            raise SystemExit(f"fuse_floor: process {pid} is gone")
        figures.append((after - before) / files * 1e6)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--serve", metavar="MOUNTPOINT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.files)
        return
    with tempfile.TemporaryDirectory(prefix="pffs-fuse-floor-") as work:
        mountpoint = os.path.join(work, "mnt")
        os.mkdir(mountpoint)
        argv = [sys.executable, "-m", "bench.probes.fuse_floor", "--serve", mountpoint]
        child = subprocess.Popen([*argv, "--files", str(args.files)])
        try:
            deadline = time.monotonic() + 10
            while not os.path.ismount(mountpoint):
                if time.monotonic() > deadline or child.poll() is not None:
                    raise SystemExit("fuse_floor: the minimal file system did not mount")
                time.sleep(0.05)
            floor = lookups(mountpoint, child.pid, args.files, args.reps)
        finally:
            subprocess.run(["fusermount3", "-u", mountpoint], check=False)
            child.wait(timeout=10)
        print(f"pyfuse3 + trio alone: {_figures(floor)} us CPU a lookup")
        tree = os.path.join(work, "tree", "wide")
        os.makedirs(tree)
        for i in range(args.files):
            os.mknod(os.path.join(tree, f"f{i:07d}"))
        mounted = subprocess.run(
            [
                sys.executable,
                "-m",
                "pffs",
                "mount",
                f"file://{os.path.dirname(tree)}",
                mountpoint,
                "--cache-dir",
                "none",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        pid = int(mounted.stdout.split("(pid ", 1)[1].split(",", 1)[0])
        try:
            os.listdir(os.path.join(mountpoint, "wide"))  # pffs lists it once
            ours = lookups(mountpoint, pid, args.files, args.reps)
        finally:
            subprocess.run([sys.executable, "-m", "pffs", "umount", mountpoint], check=False)
        print(f"pffs:                 {_figures(ours)} us CPU a lookup")


def _figures(values: list[float]) -> str:
    return " ".join(f"{value:.0f}" for value in values)


if __name__ == "__main__":
    main()
