"""Metadata memory at scale: bytes per inode of a mount walked once (issue 18, point 3).

Not part of the bench suite. Two measurements of one `file://` tree of DIRS directories of
FILES empty files each (built once, with os.mknod, and kept where it was built):

- mount: `pffs mount file://TREE MNT` (real FUSE, a fresh memory-only cache), then
  `ls -lR MNT >/dev/null`; the mount process's VmRSS before and after, its VmHWM after, the
  walk's time, and the growth per entry. During the walk the kernel holds every dentry, so
  every inode is live, and the listing of each walked directory is kept for the directory TTL.
- trace: the same walk without a kernel (the VFS driven directly: readdir of every directory,
  each entry counted as the kernel's readdirplus counts it, then getattr of each), under
  tracemalloc: bytes per entry and the allocation sites holding them.

    python -m bench.probes.metadata_memory mount --dirs 200 --files 1000
    python -m bench.probes.metadata_memory trace --dirs 200 --files 1000
    python -m bench.probes.metadata_memory trace --s3 s3rver --dirs 20 --files 1000
    python -m bench.probes.metadata_memory cpu --dirs 100 --files 1000

`cpu` is the trace's walk without tracemalloc, its CPU time per entry, then a lookup of every
file through the walked listings (Namespace.resolve): the Python cost of each, no kernel.

With `--s3 s3rver` (or moto) the trace walks an S3 tree instead: DIRS x FILES objects of one
byte named as the bench's tree (`dNNN/oNNNNNN`), put into a fresh server started for the run.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import trio

from bench.metadata import put_tiny_objects
from bench.servers import Launcher, Server
from pffs.backends import open_backend
from pffs.backends.base import Backend
from pffs.config import FuseConfig, MetaConfig, SourceConfig
from pffs.fs.inodes import ROOT_INODE, Inode
from pffs.fs.vfs import Vfs
from pffs.routing.table import MountTable

MIB = 1024 * 1024


def build_tree(root: Path, dirs: int, files: int) -> int:
    """DIRS x FILES empty files under `root`, built once (a marker file says it is whole)."""
    marker = root / ".complete"
    entries = dirs * (files + 1)
    if marker.exists():
        return entries
    root.mkdir(parents=True, exist_ok=True)
    for d in range(dirs):
        directory = root / f"d{d:05d}"
        directory.mkdir(exist_ok=True)
        for f in range(files):
            path = directory / f"f{f:07d}.bin"
            if not path.exists():
                os.mknod(path)
    marker.touch()
    return entries


def process_memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of `pid` in bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024
    return fields


def process_cpu(pid: int) -> float:
    """CPU seconds `pid` has used (user and system): the walk's cost on a busy machine."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_mount(tree: Path, entries: int, pffs: str) -> None:
    with tempfile.TemporaryDirectory(prefix="pffs-meta-mnt-") as mountpoint:
        started = subprocess.run(
            [pffs, "mount", f"file://{tree}", mountpoint, "--cache-dir", "none"],
            check=True,
            capture_output=True,
            text=True,
        )
        match = re.search(r"\(pid (\d+)", started.stdout)
        if match is None:
            sys.exit(f"metadata_memory: no pid in pffs mount's output: {started.stdout!r}")
        pid = int(match.group(1))
        try:
            before, cpu_before = process_memory(pid), process_cpu(pid)
            began = time.perf_counter()
            subprocess.run(["ls", "-lR", mountpoint], check=True, stdout=subprocess.DEVNULL)
            walk = time.perf_counter() - began
            after, cpu = process_memory(pid), process_cpu(pid) - cpu_before
        finally:
            subprocess.run([pffs, "umount", mountpoint], check=False)
    rss_growth = after["VmRSS"] - before["VmRSS"]
    peak_growth = after["VmHWM"] - before["VmRSS"]
    print(f"entries            {entries:,}")
    print(f"walk (ls -lR)      {walk:.1f} s, {entries / walk:,.0f} entries/s")
    print(f"mount's CPU        {cpu:.1f} s, {cpu / entries * 1e6:.1f} us/entry")
    print(f"VmRSS before/after {before['VmRSS'] / MIB:.1f} / {after['VmRSS'] / MIB:.1f} MiB")
    print(f"VmHWM after        {after['VmHWM'] / MIB:.1f} MiB")
    print(f"RSS growth         {rss_growth / entries:.0f} B/entry")
    print(f"peak RSS growth    {peak_growth / entries:.0f} B/entry")


def _collector(found: list[Inode]) -> Callable[[str, Inode, int], bool]:
    """A readdir callback taking every entry into `found`."""

    def emit(name: str, inode: Inode, next_id: int) -> bool:
        found.append(inode)
        return True

    return emit


async def walk_without_kernel(vfs: Vfs) -> int:
    """readdir every directory, counting references as the kernel's readdirplus does."""
    seen = 0
    pending = [ROOT_INODE]
    while pending:
        fh = await vfs.opendir(pending.pop())
        found: list[Inode] = []
        await vfs.readdir(fh, 0, _collector(found))
        vfs.releasedir(fh)
        for inode in found:
            await vfs.getattr(inode.ino)
            if inode.is_dir:
                pending.append(inode.ino)
        seen += len(found)
    return seen


def measure_trace(backend: Backend, top: int) -> None:
    meta = MetaConfig(attr_ttl=3600.0, entry_ttl=3600.0, dir_ttl=3600.0, negative_ttl=3600.0)
    fuse = FuseConfig(mountpoint="/unused")
    with tempfile.TemporaryDirectory(prefix="pffs-meta-staging-") as staging:
        vfs = Vfs(MountTable.single(backend), meta, fuse, staging_dir=staging)
        tracemalloc.start()
        began = time.process_time()
        entries = trio.run(walk_without_kernel, vfs)
        walk = time.process_time() - began
        snapshot = tracemalloc.take_snapshot()
        tracemalloc.stop()
    total = sum(stat.size for stat in snapshot.statistics("filename"))
    print(f"entries            {entries:,} (walked in {walk:.1f} CPU s under tracemalloc)")
    print(f"traced memory      {total / MIB:.1f} MiB, {total / entries:.0f} B/entry")
    for stat in snapshot.statistics("lineno")[:top]:
        frame = stat.traceback[0]
        where = f"{Path(frame.filename).name}:{frame.lineno}"
        print(f"  {stat.size / entries:7.1f} B/entry  {stat.count:>9,} blocks  {where}")


async def walk_then_resolve(vfs: Vfs) -> tuple[int, float, int, float]:
    """CPU seconds of the walk, then of resolving every entry again by name."""
    began = time.process_time()
    entries = await walk_without_kernel(vfs)
    walk = time.process_time() - began
    namespace, resolved = vfs.namespace, 0
    pending = [ROOT_INODE]
    began = time.process_time()
    while pending:
        directory = pending.pop()
        listing = namespace.listings.fresh(namespace.inodes.get(directory).path)
        assert listing is not None, "the walk keeps every listing for the directory TTL"
        for name in list(listing.names):
            inode = await namespace.resolve(directory, name)
            resolved += 1
            if inode.is_dir:
                pending.append(inode.ino)
    return entries, walk, resolved, time.process_time() - began


def measure_cpu(tree: Path) -> None:
    backend = open_backend(SourceConfig(url=f"file://{tree}"))
    meta = MetaConfig(attr_ttl=3600.0, entry_ttl=3600.0, dir_ttl=3600.0, negative_ttl=3600.0)
    with tempfile.TemporaryDirectory(prefix="pffs-meta-staging-") as staging:
        fuse = FuseConfig(mountpoint="/unused")
        vfs = Vfs(MountTable.single(backend), meta, fuse, staging_dir=staging)
        entries, walk, resolved, resolving = trio.run(walk_then_resolve, vfs)
    print(f"walk               {walk / entries * 1e6:.1f} CPU us/entry ({entries:,} entries)")
    print(f"resolve            {resolving / resolved * 1e6:.2f} CPU us/lookup ({resolved:,})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["mount", "trace", "cpu"])
    parser.add_argument("--dirs", type=int, default=200)
    parser.add_argument("--files", type=int, default=1000, help="files per directory")
    parser.add_argument("--tree", help="where the tree is built (default: /tmp/pffs-meta-DxF)")
    parser.add_argument("--top", type=int, default=12, help="allocation sites shown (trace)")
    parser.add_argument("--s3", choices=["s3rver", "moto"], help="trace: an S3 tree instead")
    args = parser.parse_args()
    if args.dirs < 1 or args.files < 0:
        parser.error("--dirs must be at least 1 and --files at least 0")
    if args.s3:
        if args.mode != "trace":
            parser.error("--s3 goes with trace only")
        trace_s3(args.s3, args.dirs, args.files, args.top)
        return
    tree = Path(args.tree or f"/tmp/pffs-meta-{args.dirs}x{args.files}")
    entries = build_tree(tree, args.dirs, args.files)
    if args.mode == "mount":
        pffs = str(Path(sys.executable).with_name("pffs"))
        measure_mount(tree, entries, pffs)
    elif args.mode == "cpu":
        measure_cpu(tree)
    else:
        measure_trace(open_backend(SourceConfig(url=f"file://{tree}")), args.top)


def trace_s3(server_kind: str, dirs: int, files: int, top: int) -> None:
    """The trace over an S3 tree of `dirs` x `files` objects in a fresh server."""
    bucket = "meta"
    keys = [f"d{index % dirs:03d}/o{index:06d}" for index in range(dirs * files)]
    with tempfile.TemporaryDirectory(prefix="pffs-meta-s3-", dir="/var/tmp") as workdir:
        launcher = Launcher(workdir)
        server: Server = launcher.s3rver() if server_kind == "s3rver" else launcher.moto()
        try:
            for key, value in server.env().items():
                os.environ[key] = value
            import boto3  # only this mode needs it

            boto3.client("s3", endpoint_url=server.endpoint_url).create_bucket(Bucket=bucket)
            put_tiny_objects(server, bucket, keys)
            source = SourceConfig(url=f"s3://{bucket}", endpoint_url=server.endpoint_url)
            measure_trace(open_backend(source), top)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
