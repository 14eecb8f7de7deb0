"""`python -m bench.probes.peer_cpu`: the CPU of one peer hit, the owner's side and the asker's.

The peer server (pffs.group.server, with a handler that answers every request with one block
held in memory, as an owner's cache hit does) runs in a process of its own; this process asks
it with the group's own path (pffs.group.peers.Group: the client, signing, the reply's checks,
under the group's limiter) from `--concurrency` trio tasks at once, as a
mount's readers and loads ahead do. It prints each side's CPU milliseconds per request, from
/proc, and the requests per second: the peer path alone, no FUSE, no store, no disk.

    python -m bench.probes.peer_cpu --block 256K --requests 3000 --concurrency 8
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time

import trio

from pffs.cache.keys import ObjectBlocks
from pffs.group.client import PeerClient
from pffs.group.members import Member
from pffs.group.peers import Group
from pffs.group.protocol import BlockRequest
from pffs.group.server import PeerServer
from pffs.group.signing import Signed, Verifier
from pffs.sizes import parse_size

SECRET = b"peer-cpu-probe-secret-0123456789"
SOURCE = "s3://probe@http://127.0.0.1:1"


def _blocks(path: str, size: int) -> ObjectBlocks:
    return ObjectBlocks(SOURCE, "principal", path, '"v1"', size, 4 << 20)


async def _serve(size: int) -> None:
    block = os.urandom(size)

    async def handler(request: BlockRequest, signed: Signed) -> bytes:
        return block

    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    print(listener.socket.getsockname()[1], flush=True)
    await PeerServer(handler, Verifier(SECRET, "owner")).serve(listener)


async def _ask(port: int, size: int, requests: int, concurrency: int) -> float:
    # The handler checks no principal's proof; the asker sends one, as a member does.
    client = PeerClient(SECRET, "asker", proof_key=lambda blocks: SECRET)
    group = Group("asker", client, [Member("asker", "http://127.0.0.1:1")])
    owner = Member("owner", f"http://127.0.0.1:{port}")
    group.update([owner, Member("asker", "http://127.0.0.1:1")])
    left = list(range(requests))
    failed = 0

    async def worker() -> None:
        nonlocal failed
        while left:
            n = left.pop()
            data = await group._ask(owner, BlockRequest(_blocks(f"f{n}", size), 0), "reader")
            if data is None or len(data) != size:
                failed += 1

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    group.close()
    if failed:
        raise SystemExit(f"{failed} requests failed")
    return time.perf_counter() - started


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block", default="256K", help="the block's size (256K, 4M)")
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    size = parse_size(args.block)
    logging.getLogger("pffs.group").setLevel(logging.ERROR)  # not each Group's member list
    if args.serve:
        trio.run(_serve, size)
        return
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.probes.peer_cpu", "--serve", "--block", args.block],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        trio.run(_ask, port, size, 50, args.concurrency)  # connections opened, code warm
        owner0, asker0 = _cpu(server.pid), time.process_time()
        seconds = trio.run(_ask, port, size, args.requests, args.concurrency)
        owner, asker = _cpu(server.pid) - owner0, time.process_time() - asker0
    finally:
        server.terminate()
        server.wait()
    n = args.requests
    print(
        f"{n} requests of {args.block} at {args.concurrency} at once: {n / seconds:.0f}/s; "
        f"CPU ms per request: owner {1e3 * owner / n:.3f}, asker {1e3 * asker / n:.3f} "
        f"[load {os.getloadavg()[0]:.1f}]"
    )


if __name__ == "__main__":
    main()
