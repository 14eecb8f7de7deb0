"""A micro-benchmark of the disk tier's write path: CPU per block written, split by part.

Not part of the bench suite (no mount, no peers, no store). For blocks of 100 KiB (a training
file) and 4 MiB (a block of a large file), random bytes (lz4 is tried and does not pay, as with
images and tensors), it prints the CPU each part of a write costs, measured alone in one thread:

- crc: the CRC32C table of the block (one CRC per 64 KiB);
- lz4 probe: the compression attempt on samples of the block (`worth_trying`);
- create: creating and closing an empty entry file (O_DIRECT), no data;
- write: `write_entry` (create, copy into the aligned buffer, O_DIRECT write, close);
- write buffered: the same through the page cache (no O_DIRECT, no fsync), for comparison;
- index: the diskcache index alone: `Cache.set`, one transaction per block (the tier before
  batches); the same inside one transaction per batch; BatchIndex.add per batch (the tier's
  batch path, diskindex.py);
- hop: one worker-thread hop of a no-op, as the tier makes them (`pffs.workers.run_blocking`),
  and one through `trio.to_thread.run_sync` for comparison;

A run against the code before the batches (a checkout of pffs/cache from main) skips what it
lacks. Then the whole path: `DiskTier.put` one block at a time, `DiskTier.put_batch` in batches, and
`DiskIO.write_behind` awaited by trio tasks (process CPU, every thread, until the blocks are
on disk). CPU is getrusage (user + system) of this process; the kernel's own writeback of a
buffered write runs in its flusher threads and is not in these figures.

    .venv/bin/python -m bench.disk_writes --blocks 400
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import resource
import tempfile
import time
from collections.abc import Callable

import trio

from pffs.cache import entries
from pffs.cache.background import Background
from pffs.cache.disk import DiskTier, entry_key
from pffs.cache.diskio import DiskIO
from pffs.cache.entries import _crc_table, encode, write_entry
from pffs.cache.keys import BlockKey
from pffs.cache.stats import CacheStats
from pffs.workers import run_blocking

KIB = 1024
MIB = 1024 * KIB
BATCH = 32


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _per_block(count: int, run: Callable[[], object]) -> float:
    """CPU microseconds per block of `run` (which handles `count` blocks)."""
    cpu = _cpu_seconds()
    run()
    return (_cpu_seconds() - cpu) / count * 1e6


def _blocks(size: int, count: int) -> list[bytes]:
    rng = random.Random(size)
    base = rng.randbytes(size)
    # Distinct blocks (a CRC of the same bytes would measure the same thing, but a compression
    # probe of one buffer stays in the CPU cache); a few bytes differ in each.
    return [n.to_bytes(8, "little") + base[8:] for n in range(count)]


def _parts(root: str, blocks: list[bytes]) -> dict[str, float]:
    count = len(blocks)
    keys = [entry_key("bench", f"p{len(blocks[0])}", "v", len(blocks[0]), n) for n in range(count)]
    figures: dict[str, float] = {}
    figures["crc"] = _per_block(count, lambda: [_crc_table(block) for block in blocks] and None)
    worth_trying = getattr(entries, "worth_trying", None)  # absent before the batch work
    if worth_trying is not None:
        figures["lz4 probe"] = _per_block(count, lambda: [worth_trying(b) for b in blocks])
    encoded = [encode(key, block, compress=False) for key, block in zip(keys, blocks, strict=True)]

    def paths(label: str) -> list[str]:
        os.makedirs(os.path.join(root, label), exist_ok=True)
        return [os.path.join(root, label, f"{n}.val") for n in range(count)]

    def create(targets: list[str]) -> None:
        for path in targets:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o600))

    def write(targets: list[str]) -> None:
        for path, (header, payload) in zip(targets, encoded, strict=True):
            write_entry(path, header, payload)

    def write_buffered(targets: list[str]) -> None:
        for path, (header, payload) in zip(targets, encoded, strict=True):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.pwritev(fd, [header, payload], 0)
            os.close(fd)

    figures["create"] = _per_block(count, lambda: create(paths("create")))
    figures["write"] = _per_block(count, lambda: write(paths("write")))
    figures["write buffered"] = _per_block(count, lambda: write_buffered(paths("buffered")))
    (
        figures["index: Cache.set"],
        figures["index: Cache.set batched"],
        figures["index: BatchIndex"],
    ) = _index_only(root, count)

    async def hops() -> None:
        limiter = trio.CapacityLimiter(1)
        for _ in range(count):
            await run_blocking(limiter, lambda: None)

    async def trio_hops() -> None:
        limiter = trio.CapacityLimiter(1)
        for _ in range(count):
            await trio.to_thread.run_sync(lambda: None, limiter=limiter)

    figures["hop"] = _per_block(count, lambda: trio.run(hops))
    figures["hop: trio.to_thread"] = _per_block(count, lambda: trio.run(trio_hops))
    return figures


def _index_only(root: str, count: int) -> tuple[float, float, float]:
    """CPU per block of the index rows alone: diskcache's `set`, one transaction each, then
    in one transaction per batch; then BatchIndex (the tier's batch path) per batch."""
    import diskcache

    cache = diskcache.Cache(
        os.path.join(root, "index"),
        size_limit=1 << 40,
        eviction_policy="least-recently-stored",
        tag_index=True,
        cull_limit=16,
    )
    # A file value (mode binary, a filename): what the tier's rows hold. `store` is bypassed
    # with a value diskcache keeps in the row instead; the row's columns cost the same.
    single = _per_block(
        count, lambda: [cache.set(f"a{n}", n, tag="bench") for n in range(count)] and None
    )

    def batched() -> None:
        for first in range(0, count, BATCH):
            with cache.transact():
                for n in range(first, min(count, first + BATCH)):
                    cache.set(f"b{n}", n, tag="bench")

    batch = _per_block(count, batched)
    try:  # absent before the batch work: a run against the earlier code skips it
        from pffs.cache.diskindex import BatchIndex, IndexRow
    except ImportError:
        cache.close()
        return single, batch, float("nan")
    index = BatchIndex(os.path.join(root, "index"), 1 << 40, 60.0)

    def rows() -> None:
        for first in range(0, count, BATCH):
            last = min(count, first + BATCH)
            index.add([IndexRow(f"c{n}", f"c{n}.val", 1, "bench") for n in range(first, last)])

    ours = _per_block(count, rows)
    index.close()
    cache.close()
    return single, batch, ours


def _whole(root: str, blocks: list[bytes], compress: bool) -> dict[str, float]:
    size = len(blocks[0])
    count = len(blocks)
    figures: dict[str, float] = {}
    tier = DiskTier(os.path.join(root, "tier"), 1 << 40, 0.0, compress)
    keys = [entry_key("bench", f"one{size}", "v", size, n) for n in range(count)]

    def one_by_one() -> None:
        for key, block in zip(keys, blocks, strict=True):
            if not tier.put(key, block, "bench"):
                raise SystemExit(f"disk_writes: put of {key} skipped")

    figures["DiskTier.put"] = _per_block(count, one_by_one)
    put_batch = getattr(tier, "put_batch", None)
    if put_batch is not None:
        keys = [entry_key("bench", f"batch{size}", "v", size, n) for n in range(count)]

        def batched() -> None:
            for first in range(0, count, BATCH):
                items = [
                    (key, block, "bench")
                    for key, block in zip(
                        keys[first : first + BATCH], blocks[first : first + BATCH], strict=True
                    )
                ]
                if not all(put_batch(items)):
                    raise SystemExit("disk_writes: a batched put was skipped")

        figures["DiskTier.put_batch"] = _per_block(count, batched)

    stats = CacheStats()
    for tasks in (1, 8):
        keys_io = [BlockKey("bench", f"io{size}-{tasks}", "v", n) for n in range(count)]

        async def writers(keys_io: list[BlockKey] = keys_io, tasks: int = tasks) -> None:
            background = Background()
            disk = DiskIO(tier, size, threads=8, stats=stats, background=background)
            async with trio.open_nursery() as nursery:
                background.attach(nursery)

                async def writer(first: int) -> None:
                    for n in range(first, count, tasks):
                        await disk.wait_for_room()
                        disk.write_behind(keys_io[n], blocks[n])

                async with trio.open_nursery() as inner:
                    for first in range(tasks):
                        inner.start_soon(writer, first)
                await background.idle()
                nursery.cancel_scope.cancel()

        figures[f"DiskIO.write_behind, {tasks} task(s)"] = _per_block(
            count, functools.partial(trio.run, writers)
        )
    if stats.disk_write_skips:
        raise SystemExit(f"disk_writes: {stats.disk_write_skips} writes skipped")
    tier.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=400, help="blocks of 100 KiB per run")
    parser.add_argument("--large-blocks", type=int, default=48, help="blocks of 4 MiB per run")
    parser.add_argument("--dir", default="/var/tmp", help="where to make the tier")
    parser.add_argument("--no-compress", action="store_true", help="the tier never tries lz4")
    args = parser.parse_args()
    for size, count in ((100 * KIB, args.blocks), (4 * MIB, args.large_blocks)):
        if count <= 0:
            continue
        blocks = _blocks(size, count)
        with tempfile.TemporaryDirectory(dir=args.dir, prefix="pffs-writes-") as root:
            started = time.monotonic()
            figures = _parts(root, blocks) | _whole(root, blocks, not args.no_compress)
            print(f"{size // KIB} KiB blocks x {count} ({time.monotonic() - started:.1f} s):")
            for label, micros in figures.items():
                print(f"  {label:32} {micros:8.0f} us CPU/block")


if __name__ == "__main__":
    main()
