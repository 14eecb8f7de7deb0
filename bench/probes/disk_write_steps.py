"""The disk tier's write-behind, step by step: wall and thread CPU per block of each step.

Not part of the bench suite: no store, no mount. A DiskTier over a fresh directory (on the
same file system as the probes' mounts' caches, /var/tmp by default) takes `--blocks` random
(incompressible) blocks of `--size` bytes in batches of 16, as the write-behind hands them:

- `whole`: `DiskTier.put_batch` per batch, the calling thread's wall and CPU per block (what a
  writer's worker thread pays), and `--writers` threads writing batches at once (the
  write-behind runs two);
- `steps`: the same blocks through the steps `put_batch` takes, each timed alone: the entry's
  name, the lz4 probe, the aligned buffer, the copy with its CRCs, the header, the file's
  create, the O_DIRECT write, the close, the free-space check and the index transaction (per
  batch, shared by its blocks), then the unlink an eviction pays later. The steps are this
  tree's (pffs.cache.entries' own functions), so they follow the code as it changes.

`--tree DIR` measures `whole` with another source tree's pffs (a clone of another commit), for
an A/B of the same blocks; `--rounds` alternates nothing, it repeats (run the trees in turns).

    python -m bench.probes.disk_write_steps                      # 128 blocks of 4 MiB
    python -m bench.probes.disk_write_steps --tree /tmp/base --only whole
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

MIB = 1024 * 1024
_BATCH = 16


class _Clock:
    """Wall and thread-CPU nanoseconds per named step, summed over the calls."""

    def __init__(self) -> None:
        self.wall: dict[str, int] = defaultdict(int)
        self.cpu: dict[str, int] = defaultdict(int)

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
        try:
            yield
        finally:
            self.cpu[name] += time.thread_time_ns() - cpu
            self.wall[name] += time.perf_counter_ns() - wall

    def report(self, blocks: int, title: str) -> None:
        print(f"\n{title}: per block, wall / thread CPU in microseconds")
        for name in self.wall:
            wall, cpu = self.wall[name] / blocks / 1e3, self.cpu[name] / blocks / 1e3
            print(f"  {name:34s} {wall:9.0f} {cpu:9.0f}")
        total_wall = sum(self.wall.values()) / blocks / 1e3
        total_cpu = sum(self.cpu.values()) / blocks / 1e3
        print(f"  {'total':34s} {total_wall:9.0f} {total_cpu:9.0f}")


class _Source:
    """Random (incompressible) blocks, each made fresh just before its batch is written, as a
    block received from the store is: its bytes in the CPU's caches as the mount's are, not
    all of them cold (a run's blocks made ahead, 512 MiB, would all be read from memory)."""

    def __init__(self, count: int, size: int) -> None:
        self.count, self.size = count, size
        self._random = os.urandom(size + 1024)

    def batches(self, tag: str) -> Iterator[list[tuple[str, bytes, str]]]:
        for first in range(0, self.count, _BATCH):
            numbers = range(first, min(first + _BATCH, self.count))
            # Each block differs (a shifted slice), so no two entries are alike.
            yield [
                (f"{tag}-{n}:{n}", self._random[n % 1024 : n % 1024 + self.size], "probe")
                for n in numbers
            ]


class _Neighbour:
    """A thread shaped like the mount's trio thread: Python work for 2 ms, then 1 ms away
    from the GIL (as in epoll), over and over; how much work it got done per second."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._work = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._started = 0.0

    def _run(self) -> None:
        while not self._stop.is_set():
            end = time.perf_counter() + 0.002
            while time.perf_counter() < end:
                self._work += 1
            time.sleep(0.001)

    def __enter__(self) -> _Neighbour:
        self._thread.start()
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        rate = self._work / (time.perf_counter() - self._started) / 1e6
        print(f"  the neighbour thread: {rate:.2f} M loops/s")


def _tier(directory: str) -> Any:
    from pffs.cache.disk import DiskTier

    return DiskTier(directory, capacity=1 << 40, free_ratio=0.0, compress=True)


def whole(source: _Source, workdir: str, writers: int) -> None:
    """put_batch per batch, in `writers` threads at once; its wall and CPU per block."""
    directory = tempfile.mkdtemp(prefix="whole-", dir=workdir)
    tier = _tier(directory)
    batches = source.batches("whole")
    lock = threading.Lock()
    spent = {"wall": 0, "cpu": 0}

    def writer() -> None:
        while True:
            with lock:  # a batch made just before it is written, as one received
                batch = next(batches, None)
            if batch is None:
                return
            wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
            stored = tier.put_batch(batch)
            cpu, wall = time.thread_time_ns() - cpu, time.perf_counter_ns() - wall
            assert all(stored), "the probe's directory refused a block"
            with lock:
                spent["wall"] += wall
                spent["cpu"] += cpu

    threads = [threading.Thread(target=writer) for _ in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    tier.close()
    count = source.count
    print(
        f"\nwhole put_batch, {writers} writer(s): {spent['wall'] / count / 1e3:.0f} us wall"
        f" and {spent['cpu'] / count / 1e3:.0f} us CPU per block (each thread's put_batch)"
    )
    shutil.rmtree(directory)


def steps(source: _Source, workdir: str) -> None:
    """The steps of put_batch, each timed alone, in one thread."""
    from pffs.cache import entries
    from pffs.cache.diskindex import IndexRow

    directory = tempfile.mkdtemp(prefix="steps-", dir=workdir)
    tier = _tier(directory)
    clock = _Clock()
    paths = []
    for batch in source.batches("steps"):
        rows = []
        with clock.step("free-space check (statvfs, per batch)"):
            tier._room()
        for key, data, tag in batch:
            with clock.step("entry name (urandom)"):
                filename = tier._cache.disk.filename()[0]
            path = os.path.join(directory, filename)
            size = _write_steps(entries, clock, path, key, data)
            rows.append(IndexRow(key, filename, size, tag))
            paths.append(path)
        with clock.step("index transaction (per batch)"):
            tier.index.add(rows)
    clock.report(source.count, f"steps of put_batch, {source.size // 1024} KiB blocks")
    evict = _Clock()
    for path in paths:
        with evict.step("unlink (an eviction, later)"):
            os.unlink(path)
    evict.report(source.count, "evicting them")
    tier.close()
    shutil.rmtree(directory)


def _write_steps(entries: Any, clock: _Clock, path: str, key: str, data: bytes) -> int:
    """entries.write_entry, its steps timed one by one (kept in step with it)."""
    with clock.step("lz4 probe"):
        packed = entries._packed(data, True)
    assert packed is None, "the probe's blocks are random: never compressed"
    region = entries._region_size(len(data))
    end = region + len(data)
    total = entries._aligned(end)
    with clock.step("aligned buffer"):
        buffer = entries._take_buffer(total)
    view = memoryview(buffer)
    with clock.step("copy with CRCs"):
        crcs = entries._copy_with_crcs(view[region:end], data)
    with clock.step("header and padding"):
        view[:region] = entries._header_region(key, 0, len(data), len(data), crcs)
        view[end:total] = bytes(total - end)
    _file_steps(entries, clock, path, view[:total])
    view.release()
    entries._give_back(buffer)
    return int(total)


def _file_steps(entries: Any, clock: _Clock, path: str, content: memoryview) -> None:
    """The entry file's create, write and close, as entries writes it."""
    take: Callable[[str], int] | None = getattr(entries, "_created_file", None)
    with clock.step("create (open O_CREAT|O_EXCL|O_DIRECT)"):
        fd = take(path) if take is not None else entries._open_for_write(path)
    with clock.step("O_DIRECT write"):
        written = 0
        while written < len(content):
            written += os.pwrite(fd, content[written:], written)
    with clock.step("close"):
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.probes.disk_write_steps", description=__doc__)
    p.add_argument("--blocks", type=int, default=128)
    p.add_argument("--size", type=int, default=4 * MIB)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--writers", type=int, default=2, help="threads writing at once in `whole`")
    p.add_argument("--only", choices=("whole", "steps"))
    p.add_argument(
        "--neighbour", action="store_true", help="a thread busy with Python beside the writes"
    )
    p.add_argument("--dir", default="/var/tmp", help="where the tier's directories go")
    p.add_argument("--tree", help="a source tree whose pffs `whole` measures")
    args = p.parse_args(argv)
    if args.tree:
        sys.path.insert(0, os.path.abspath(args.tree))
    import pffs

    print(f"pffs from {os.path.dirname(pffs.__file__)}, load {os.getloadavg()[0]:.1f}")
    source = _Source(args.blocks, args.size)
    workdir = tempfile.mkdtemp(prefix="disk-write-steps-", dir=args.dir)
    beside = _Neighbour if args.neighbour else contextlib.nullcontext
    try:
        for _round in range(args.rounds):
            if args.only != "steps":
                with beside():
                    whole(source, workdir, 1)
                with beside():
                    whole(source, workdir, args.writers)
            if args.only != "whole":
                with beside():
                    steps(source, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
