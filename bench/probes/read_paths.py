"""`python -m bench.probes.read_paths`: the modules of pffs each of docs/ARCHITECTURE.md's three
traces runs, from the code itself.

Every Python call in every thread is seen (a profile hook set before any thread starts); the
modules of pffs and of its backends whose code ran between a trace's start and end are its
modules. The traces run without a kernel, through the VFS (`pffs.fuse_ops`, the kernel edge,
adds one), against a moto server on 127.0.0.1, with a disk tier:

- `cold`: a 100 KiB file whose name was looked up, opened and read whole; until its block is
  written behind;
- `peer`: member A reads a whole block member B owns, nobody holding it: A's read (its VFS with
  the group joined) and B's side (its peer server, the owner's side, its cache and store), both
  in this process; until both caches have it;
- `preload`: three files of a directory of 20 opened and read; until the preload of the rest
  is done.

It prints each trace's modules, pffs's and the S3 helpers' apart (`pffs.metrics`, `logs` and
the like count: they run).

    python -m bench.probes.read_paths
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import FrameType
from typing import Any

import boto3
import trio

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve()
_recording: set[str] | None = None
_calls: set[tuple[str, str]] = set()  # (caller, callee) modules, while recording


def _module(filename: str) -> str | None:
    path = Path(filename)
    for top, name in (("pffs", "pffs"), ("backends", "backends")):
        base = ROOT / top
        if path.is_relative_to(base) and path != HERE:
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            return ".".join([name, *parts])
    return None


def _profile(frame: FrameType, event: str, arg: Any) -> None:
    if event == "call" and _recording is not None:
        module = _module(frame.f_code.co_filename)
        if module is not None:
            _recording.add(module)
            caller = None if frame.f_back is None else _module(frame.f_back.f_code.co_filename)
            if caller is not None and caller != module:
                _calls.add((caller, module))


async def _traced(body: Callable[[], Awaitable[None]]) -> set[str]:
    global _recording
    seen: set[str] = set()
    _recording = seen
    _calls.clear()
    try:
        await body()
    finally:
        _recording = None
    return seen


def _report(name: str, seen: set[str], edge: bool) -> None:
    pffs = sorted(m for m in seen if m.startswith("pffs."))
    stores = sorted(m for m in seen if m.startswith("backends."))
    kernel = " (with pffs.fuse_ops, the kernel edge)" if edge else ""
    print(f"{name}: {len(pffs) + edge} of pffs{kernel}, {len(stores)} of backends/")
    print("  pffs:", " ".join(m.removeprefix("pffs.") for m in pffs))
    print("  backends:", " ".join(m.removeprefix("backends.") for m in stores))
    print("  calls up:", " ".join(f"{a}->{b}" for a, b in _calls_up()) or "none")


def _calls_up() -> list[tuple[str, str]]:
    """The calls into a layer the caller may not import (tests/unit/test_layers.py's rules): a
    function handed down (a block source, a handler) called from below."""
    from tests.unit.test_layers import BELOW, layer

    def named(module: str) -> str:
        return module.replace("backends", "pffs.backends", 1) if module[0] == "b" else module

    up = []
    for caller, callee in sorted(_calls):
        below, above = layer(named(caller)), layer(named(callee))
        if above != below and above not in BELOW[below]:
            up.append((caller.removeprefix("pffs."), callee.removeprefix("pffs.")))
    return up


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.probes.read_paths",
        description="The modules of pffs each of ARCHITECTURE.md's three traces runs.",
    )
    parser.add_argument("--trace", choices=("cold", "peer", "preload", "all"), default="all")
    args = parser.parse_args()
    # Before pffs starts any thread: every thread gets the hook.
    sys.setprofile(_profile)
    threading.setprofile(_profile)
    from pffs.testing.servers import DUMMY_CREDENTIALS, MotoServer

    os.environ.update(DUMMY_CREDENTIALS)
    with MotoServer() as moto:
        s3 = boto3.client("s3", endpoint_url=moto.endpoint_url)
        for name in ("cold", "peer", "preload"):
            if args.trace in (name, "all"):
                bucket = f"trace-{name}"
                s3.create_bucket(Bucket=bucket)
                seen, edge = trio.run(TRACES[name], s3, bucket, moto.endpoint_url)
                _report(name, seen, edge)
    sys.setprofile(None)
    threading.setprofile(None)


def _vfs(endpoint: str, bucket: str, **parts: Any) -> Any:
    from pffs.backends import open_backend
    from pffs.config import FuseConfig, MetaConfig, SourceConfig
    from pffs.fs.vfs import Vfs
    from pffs.routing.table import MountTable

    table = parts.pop("table", None) or MountTable.single(
        open_backend(SourceConfig(url=f"s3://{bucket}", endpoint_url=endpoint))
    )
    cache = parts.pop("cache", None) or _cache()
    return Vfs(
        table,
        MetaConfig(),
        FuseConfig(mountpoint="/unused", read_only=True),
        cache,
        staging_dir=tempfile.mkdtemp(prefix="pffs-trace-staging-"),
        **parts,
    )


def _cache() -> Any:
    from pffs.cache.blocks import BlockCache
    from pffs.config import CacheConfig

    return BlockCache(CacheConfig(disk_dir=tempfile.mkdtemp(prefix="pffs-trace-")))


async def _read(vfs: Any, path: str) -> bytes:
    from pffs.fs.inodes import ROOT_INODE

    ino = ROOT_INODE
    names = path.split("/")
    for name in names[:-1]:
        ino = (await vfs.lookup(ino, name)).ino
    inode = await vfs.lookup(ino, names[-1])
    return await _open_read(vfs, inode.ino)


async def _open_read(vfs: Any, ino: int) -> bytes:
    fh, _ = await vfs.open(ino, os.O_RDONLY)
    try:
        return bytes(await vfs.read(fh, 0, 1 << 30))
    finally:
        await vfs.release(fh)


async def cold(s3: Any, bucket: str, endpoint: str) -> tuple[set[str], bool]:
    from pffs.fs.inodes import ROOT_INODE

    data = random.randbytes(100 * 1024)
    s3.put_object(Bucket=bucket, Key="f.bin", Body=data)
    vfs = _vfs(endpoint, bucket)
    async with trio.open_nursery() as nursery:
        vfs.attach(nursery)
        inode = await vfs.lookup(ROOT_INODE, "f.bin")  # its name looked up, before the trace

        async def body() -> None:
            assert await _open_read(vfs, inode.ino) == data
            await vfs.drain()  # written behind

        seen = await _traced(body)
        nursery.cancel_scope.cancel()
    vfs.cache.close()
    return seen, True


async def peer(s3: Any, bucket: str, endpoint: str) -> tuple[set[str], bool]:
    from pffs.backends import open_backend
    from pffs.cache.keys import ObjectBlocks
    from pffs.config import SourceConfig
    from pffs.group.client import PeerClient
    from pffs.group.members import Member
    from pffs.group.owner import PeerBlocks
    from pffs.group.peers import Group
    from pffs.group.principals import PrincipalKeys
    from pffs.group.server import PeerServer
    from pffs.group.signing import Verifier
    from pffs.group.sources import Joined
    from pffs.routing.table import MountTable

    secret = b"the-trace-probe's-group-secret"
    keys = PrincipalKeys(b"the-trace-probe's-principal-secret")
    tables = [
        MountTable.single(open_backend(SourceConfig(url=f"s3://{bucket}", endpoint_url=endpoint)))
        for _ in "AB"
    ]
    backend = tables[0].mounted[0].backend
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    members = [Member("a", "http://127.0.0.1:1"), Member("b", f"http://127.0.0.1:{port}")]

    def member(name: str, table: MountTable) -> Group:
        proof = keys.key(backend.principal, backend.principal_key)
        group = Group(name, PeerClient(secret, name, proof_key=lambda _: proof), handover=0.0)
        group.update(members)
        return group

    group_a, group_b = member("a", tables[0]), member("b", tables[1])
    cache_a = _cache()
    vfs_a = _vfs(
        endpoint, bucket, table=tables[0], cache=cache_a, tier=Joined(group_a, cache_a.flights)
    )
    vfs_b = _vfs(endpoint, bucket, table=tables[1])
    block = vfs_a.cache.block_size
    data = random.randbytes(block)
    for i in range(100):  # a one-block file B owns
        path = f"p{i}.bin"
        s3.put_object(Bucket=bucket, Key=path, Body=data)
        version = backend.stat(path).version
        blocks = ObjectBlocks(backend.source_id, backend.principal, path, version, block, block)
        if group_a.peer_owner(blocks, 0) is not None:
            break
    owner = PeerBlocks(group_b, tables[1], vfs_b.cache, keys)
    server = PeerServer(owner.serve, Verifier(secret, "b"))
    async with trio.open_nursery() as nursery:
        vfs_a.attach(nursery)
        vfs_b.attach(nursery)
        await nursery.start(server.serve, listeners[0])
        from pffs.fs.inodes import ROOT_INODE

        inode = await vfs_a.lookup(ROOT_INODE, path)

        async def body() -> None:
            assert await _open_read(vfs_a, inode.ino) == data
            await vfs_a.drain()
            await vfs_b.drain()

        seen = await _traced(body)
        assert vfs_b.cache.stats.store_bytes_served == block  # B fetched it for A
        nursery.cancel_scope.cancel()
    for vfs in (vfs_a, vfs_b):
        vfs.cache.close()
    group_a.close()
    group_b.close()
    return seen, True


async def preload(s3: Any, bucket: str, endpoint: str) -> tuple[set[str], bool]:
    files = {f"train/{i:03}.bin": random.randbytes(100 * 1024) for i in range(20)}
    for key, data in files.items():
        s3.put_object(Bucket=bucket, Key=key, Body=data)
    vfs = _vfs(endpoint, bucket)
    async with trio.open_nursery() as nursery:
        vfs.attach(nursery)

        async def body() -> None:
            for path in list(files)[:3]:
                assert await _read(vfs, path) == files[path]
            await vfs.datasets.engine.wait_idle()
            await vfs.drain()
            assert vfs.datasets.engine.stats.files_fetched == 17

        seen = await _traced(body)
        nursery.cancel_scope.cancel()
    vfs.cache.close()
    return seen, True


TRACES: dict[str, Callable[..., Awaitable[tuple[set[str], bool]]]] = {
    "cold": cold,
    "peer": peer,
    "preload": preload,
}

if __name__ == "__main__":
    main()
