"""`python -m bench.probes.read_paths`: the modules each of docs/ARCHITECTURE.md's three traces
crosses, and those it only consults, from the code itself.

Every Python call in every thread is seen (a profile hook set before any thread starts), and
every send on a socket. A module is CROSSED by a trace when it is on the call stack of a request
the trace makes: each send to the store's socket (the GETs, and a preload's LISTs) and, in the
peer trace, member A's ask on B's socket and B's server's answer. Each hand-off is stitched to
the stack that made it, so a request's stack reaches back to the read that wanted it:

- a task started in a trio nursery (`start_soon`, `nursery.start`, the cache's background
  tasks): the stack that started it, and that task's own;
- a call run in a worker thread (`pffs.workers`), or any thread started: the stack that
  submitted it;
- a request B's group server serves: its handler task, started by the server's listener.

`pffs.fuse_ops` (the kernel edge, which the traces run without) counts as crossed too. Every
other module whose code ran during the trace only CONSULTED (it was called and returned: metrics,
stats, keys, permits taken and given back, a disk check): listed apart, so nothing is hidden.
Writing a block behind to the disk sends nothing: it is no request.

The traces run without a kernel, through the VFS, against a moto server on 127.0.0.1, with a
disk tier:

- `cold`: a 100 KiB file whose name was looked up, opened and read whole; until its block is
  written behind;
- `peer`: member A reads a whole block member B owns, nobody holding it: A's read (its VFS with
  the group joined) and B's side (its peer server, the owner's side, its cache and store), both
  in this process; until both caches have it;
- `preload`: three files of a directory of 20 opened and read; until the preload of the rest
  is done.

It prints each trace's crossed modules, the consulted ones, the requests counted, and the calls
into a layer above the caller (tests/unit/test_layers.py's rules).

    python -m bench.probes.read_paths
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import random
import re
import socket
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType
from typing import Any
from urllib.parse import urlsplit

import boto3
import trio

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve()
KERNEL_EDGE = "pffs.fuse_ops"
# A request's socket calls: its sending, and the reading of its answer.
_SOCKET_CALLS = frozenset({"send", "sendall", "sendmsg", "recv", "recv_into", "recvmsg"})
_HEAD = re.compile(rb"(GET|HEAD|PUT|POST|DELETE) (\S{1,60})|HTTP/1\.1 (\d{3})")


@functools.cache
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


@dataclass
class _Trace:
    """One trace's record: the modules run, the calls between them, and each request's stack.
    The origins (the stack each task, worker job and thread was handed off from) are kept from
    the run's start, since a task started before the trace (a preload's dispatcher) may make its
    requests."""

    ports: dict[str, int]  # "store" -> the store's port; "peer" -> B's group server's port
    recording: bool = False
    run: set[str] = field(default_factory=set)
    calls: set[tuple[str, str]] = field(default_factory=set)  # (caller, callee) modules
    requests: list[tuple[str, str, frozenset[str]]] = field(default_factory=list)
    task_origins: dict[object, frozenset[str]] = field(default_factory=dict)
    handed_off: dict[object, frozenset[str]] = field(default_factory=dict)  # jobs, threads


_trace: _Trace | None = None
_code: dict[str, CodeType] = {}  # the hand-off points' code, filled in `main`


def _stack(frame: FrameType | None) -> frozenset[str]:
    """The modules on this stack, with those of the stack it was handed off from."""
    modules: set[str] = set()
    assert _trace is not None
    while frame is not None:
        module = _module(frame.f_code.co_filename)
        if module is not None:
            modules.add(module)
        if frame.f_code is _code["job"] or frame.f_code is _code["thread"]:
            # A worker's job, or a thread's own code: what handed it off holds the rest (a
            # worker thread's start belongs to the job that started it, not to this one).
            return frozenset(modules | _trace.handed_off.get(frame.f_locals["self"], set()))
        frame = frame.f_back
    # On trio's thread, in a task: the task's origin (none for the run loop itself, between
    # tasks, or a thread of its own).
    with contextlib.suppress(RuntimeError):
        modules |= _trace.task_origins.get(trio.lowlevel.current_task(), frozenset())
    return frozenset(modules)


class _Spawns(trio.abc.Instrument):
    """Each task's origin: the stack of the task that started it, with that task's origin."""

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        if _trace is not None:
            _trace.task_origins[task] = _stack(sys._getframe(1))


def _profile(frame: FrameType, event: str, arg: Any) -> None:
    trace = _trace
    if trace is None:
        return
    if event == "call":
        code = frame.f_code
        if code is _code["submit"]:  # a call handed to a worker thread
            trace.handed_off[frame.f_locals["job"]] = _stack(frame.f_back)
        elif code is _code["start"]:  # a thread started
            trace.handed_off[frame.f_locals["self"]] = _stack(frame.f_back)
        if trace.recording:
            module = _module(code.co_filename)
            if module is not None:
                trace.run.add(module)
                caller = None if frame.f_back is None else _module(frame.f_back.f_code.co_filename)
                if caller is not None and caller != module:
                    trace.calls.add((caller, module))
    elif event == "c_call" and trace.recording and getattr(arg, "__name__", "") in _SOCKET_CALLS:
        sock = getattr(arg, "__self__", None)
        if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
            kind = _request_kind(sock, trace.ports)
            if kind is not None:
                head = _head(frame) if arg.__name__.startswith("send") else ""
                trace.requests.append((kind, head, _stack(frame)))


def _request_kind(sock: socket.socket, ports: dict[str, int]) -> str | None:
    """Which request a send belongs to: to the store, A's ask of B, or B's answer."""
    try:
        here, there = sock.getsockname()[1], sock.getpeername()[1]
    except OSError:
        return None
    if there == ports["store"]:
        return "store"
    if there == ports.get("peer"):
        return "ask of B"
    if here == ports.get("peer"):
        return "B's answer"
    return None


def _head(frame: FrameType, depth: int = 2) -> str:
    """The request line or status line that begins what a send sends ("" for the rest of a
    message): the bytes among the locals of the send's caller (trio's passes them on in a
    tuple of arguments, a list of pieces)."""

    def first(value: object, depth: int) -> bytes | None:
        if isinstance(value, bytes | bytearray | memoryview):
            return bytes(value[:80])
        if depth > 0 and isinstance(value, tuple | list) and value:
            return first(value[0], depth - 1)
        return None

    for value in frame.f_locals.values():
        found = _HEAD.match(first(value, depth) or b"")
        if found:
            method, target, status = found.groups()
            if status:
                return status.decode()
            return "LIST" if b"list-type=" in target else method.decode()
    return ""


async def _traced(body: Callable[[], Awaitable[None]]) -> None:
    assert _trace is not None
    _trace.recording = True
    try:
        await body()
    finally:
        _trace.recording = False


def _report(name: str, trace: _Trace) -> None:
    crossed = {KERNEL_EDGE}.union(*(stack for _, _, stack in trace.requests))
    consulted = trace.run - crossed
    print(
        f"{name}: {len(crossed)} modules crossed (with {KERNEL_EDGE}, the kernel edge), "
        f"{len(trace.run | crossed)} run"
    )
    print("  crossed:", _names(crossed))
    print("  consulted:", _names(consulted))
    heads = Counter(f"{kind} {head}" for kind, head, _ in trace.requests if head)
    print("  requests:", ", ".join(f"{n} {request}" for request, n in sorted(heads.items())))
    print("  calls up:", " ".join(f"{a}->{b}" for a, b in _calls_up(trace.calls)) or "none")


def _names(modules: set[str]) -> str:
    return " ".join(m.removeprefix("pffs.") for m in sorted(modules))


def _calls_up(calls: set[tuple[str, str]]) -> list[tuple[str, str]]:
    """The calls into a layer the caller may not import (tests/unit/test_layers.py's rules): a
    function handed down (a block source, a handler) called from below."""
    from tests.unit.test_layers import BELOW, layer

    def named(module: str) -> str:
        return module.replace("backends", "pffs.backends", 1) if module[0] == "b" else module

    up = []
    for caller, callee in sorted(calls):
        below, above = layer(named(caller)), layer(named(callee))
        if above != below and above not in BELOW[below]:
            up.append((caller.removeprefix("pffs."), callee.removeprefix("pffs.")))
    return up


def main() -> None:
    global _trace
    parser = argparse.ArgumentParser(
        prog="python -m bench.probes.read_paths",
        description="The modules each of ARCHITECTURE.md's three traces crosses and consults.",
    )
    parser.add_argument("--trace", choices=("cold", "peer", "preload", "all"), default="all")
    args = parser.parse_args()
    from pffs import workers

    _code.update(
        submit=workers._Pool.submit.__code__,
        job=workers._Job.run.__code__,
        start=threading.Thread.start.__code__,
        thread=threading.Thread._bootstrap_inner.__code__,  # type: ignore[attr-defined]
    )
    # Before pffs starts any thread: every thread gets the hook. pffs's worker threads are not
    # threading.Threads (pffs.workers starts them bare), so each installs it itself.
    sys.setprofile(_profile)
    threading.setprofile(_profile)
    serve = workers._Pool._serve

    def serve_profiled(pool: workers._Pool, first: list[workers._Job]) -> None:
        sys.setprofile(_profile)
        serve(pool, first)

    workers._Pool._serve = serve_profiled  # type: ignore[method-assign,assignment]
    from pffs.testing.servers import DUMMY_CREDENTIALS, MotoServer

    os.environ.update(DUMMY_CREDENTIALS)
    with MotoServer() as moto:
        s3 = boto3.client("s3", endpoint_url=moto.endpoint_url)
        for name in ("cold", "peer", "preload"):
            if args.trace in (name, "all"):
                bucket = f"trace-{name}"
                s3.create_bucket(Bucket=bucket)
                port = urlsplit(moto.endpoint_url).port
                assert port is not None
                trace = _Trace(ports={"store": port})
                _trace = trace
                trio.run(TRACES[name], s3, bucket, moto.endpoint_url, instruments=[_Spawns()])
                _trace = None
                _report(name, trace)
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


async def cold(s3: Any, bucket: str, endpoint: str) -> None:
    from pffs.fs.inodes import ROOT_INODE

    data = random.randbytes(100 * 1024)
    s3.put_object(Bucket=bucket, Key="f.bin", Body=data)
    vfs = _vfs(endpoint, bucket)
    async with trio.open_nursery() as nursery:
        vfs.attach(nursery)
        inode = await vfs.lookup(ROOT_INODE, "f.bin")  # its name looked up, before the trace
        await vfs.namespace.wait_for_listings()  # and the listings the lookup started

        async def body() -> None:
            assert await _open_read(vfs, inode.ino) == data
            await vfs.drain()  # written behind

        await _traced(body)
        nursery.cancel_scope.cancel()
    vfs.cache.close()


async def peer(s3: Any, bucket: str, endpoint: str) -> None:
    from pffs.backends import open_backend
    from pffs.cache.keys import ObjectBlocks
    from pffs.config import SourceConfig
    from pffs.group.client import PeerClient
    from pffs.group.members import Member
    from pffs.group.peers import Group
    from pffs.group.principals import PrincipalKeys
    from pffs.group.server import PeerBlocks, PeerServer
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
    assert _trace is not None
    _trace.ports["peer"] = port

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
        await vfs_a.namespace.wait_for_listings()

        async def body() -> None:
            assert await _open_read(vfs_a, inode.ino) == data
            await vfs_a.drain()
            await vfs_b.drain()

        await _traced(body)
        assert vfs_b.cache.stats.store_bytes_served == block  # B fetched it for A
        nursery.cancel_scope.cancel()
    for vfs in (vfs_a, vfs_b):
        vfs.cache.close()
    group_a.close()
    group_b.close()


async def preload(s3: Any, bucket: str, endpoint: str) -> None:
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

        await _traced(body)
        nursery.cancel_scope.cancel()
    vfs.cache.close()


TRACES: dict[str, Callable[..., Awaitable[None]]] = {
    "cold": cold,
    "peer": peer,
    "preload": preload,
}

if __name__ == "__main__":
    main()
