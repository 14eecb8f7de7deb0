"""What receiving blocks into aligned or reused memory would save a cold read, per GiB.

Not part of the bench suite: no store, no mount; glibc's malloc tuned as the mount's. One
thread receives `--size` bytes in 4 MiB blocks from a local socket (a sender thread feeds it;
only the receiver's CPU is counted, from `time.thread_time`) and writes each to a disk entry,
as the mount's GET loop and disk tier do:

- `fresh`: each block received into new memory (`bytes` from the socket, as http.client
  reads a body) while the last `--held` blocks are still held (the memory tier), then written
  by `pffs.cache.entries.write_entry` (a copy into an aligned buffer with its CRCs, O_DIRECT);
- `reused`: the same, received into one buffer used again (no first touch);
- `aligned`: received into page-aligned memory (a fresh mmap per block, held as `fresh`'s),
  its CRCs taken in place and written with O_DIRECT from it (no copy);
- `aligned-heap`: the same, the block a fresh heap allocation (bytearray) 4 KiB larger, used
  from its first page boundary (as the heap serves the mount's blocks, pffs.mounting.process);
- `aligned-reused`: the same, received into one aligned buffer used again;
- `receive-only`, `receive-reused`: the receive alone, fresh or reused memory.

    python -m bench.probes.block_memory --rounds 3 --dir /var/tmp
"""

from __future__ import annotations

import argparse
import array
import collections
import ctypes
import io
import mmap
import os
import socket
import tempfile
import threading
import time
import typing

import crc32c

from pffs.cache import entries
from pffs.mounting.process import tune_malloc
from pffs.sizes import parse_size

BLOCK = 4 << 20


def _sender(sock: socket.socket, size: int) -> None:
    data = os.urandom(BLOCK)
    with sock:
        for _ in range(size // BLOCK):
            sock.sendall(data)


def _write_in_place(path: str, key: str, payload: memoryview) -> None:
    """The entry of a block already in aligned memory: CRCs over it, header and payload
    written with one O_DIRECT pwritev, no copy."""
    crcs = array.array("I")
    for start in range(0, len(payload), entries.CHUNK):
        crcs.append(crc32c.crc32c(payload[start : start + entries.CHUNK]))
    header = entries._header_region(key, 0, len(payload), len(payload), crcs)
    head = mmap.mmap(-1, len(header))
    head[:] = header
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o600)
    try:
        os.pwritev(fd, [head, payload], 0)
    finally:
        os.close(fd)
        head.close()


def _aligned_view(memory: bytearray) -> memoryview:
    """BLOCK bytes of `memory` (BLOCK + 4 KiB long) from its first 4 KiB boundary."""
    address = ctypes.addressof(ctypes.c_char.from_buffer(memory))
    start = -address % 4096
    return memoryview(memory)[start : start + BLOCK]


def _receive(
    name: str, reader: io.BufferedIOBase, spare: bytearray, spare_aligned: mmap.mmap
) -> bytes | bytearray | memoryview:
    """One block from `reader` into the memory `name` says (see the module's docstring)."""
    if name in ("fresh", "receive-only"):
        return reader.read(BLOCK)
    if name == "aligned":
        block: memoryview | bytearray = memoryview(mmap.mmap(-1, BLOCK))
    elif name == "aligned-heap":
        block = _aligned_view(bytearray(BLOCK + 4096))
    elif name == "aligned-reused":
        block = memoryview(spare_aligned)
    else:
        block = spare
    reader.readinto(block)
    return block


def _arm(name: str, size: int, held: int, directory: str) -> float:
    """CPU-s per GiB of the receiving thread for one arm."""
    ours, theirs = socket.socketpair()
    sender = threading.Thread(target=_sender, args=(theirs, size))
    sender.start()
    reader = typing.cast(io.BufferedIOBase, ours.makefile("rb", buffering=64 * 1024))
    kept: collections.deque[object] = collections.deque(maxlen=held)
    spare, spare_aligned = bytearray(BLOCK), mmap.mmap(-1, BLOCK)
    started = time.thread_time()
    for index in range(size // BLOCK):
        block = _receive(name, reader, spare, spare_aligned)
        path = os.path.join(directory, f"e{index}")
        if name in ("fresh", "reused"):
            entries.write_entry(path, "k", block, False)  # type: ignore[arg-type]
            os.unlink(path)
        elif name.startswith("aligned"):
            _write_in_place(path, "k", memoryview(block))
            os.unlink(path)
        if name not in ("reused", "receive-reused", "aligned-reused"):
            kept.append(block)
    cpu = time.thread_time() - started
    sender.join()
    ours.close()
    return cpu / (size / (1 << 30))


ARMS = (
    "fresh", "reused", "aligned", "aligned-heap", "aligned-reused", "receive-only",
    "receive-reused",
)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1G", help="bytes received per arm (1G)")
    parser.add_argument("--held", type=int, default=100, help="blocks held (the tier, 100)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default="/var/tmp", help="where the entries are written")
    args = parser.parse_args()
    size = parse_size(args.size)
    tune_malloc(BLOCK)  # the heap as the mount has it: freed blocks reused in place
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="pffs-block-memory-") as directory:
        for round_ in range(args.rounds):
            figures = [f"{arm} {_arm(arm, size, args.held, directory):.3f}" for arm in ARMS]
            load = os.getloadavg()[0]
            print(f"round {round_ + 1}: " + ", ".join(figures) + f" CPU-s/GiB  load {load:.1f}")


if __name__ == "__main__":
    main()
