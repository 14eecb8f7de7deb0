"""A mount's CPU over a cold read split by stage, from `perf record --call-graph dwarf` samples.

Each sample's call chain (kernel and native frames: perf does not see Python functions) is put
in the first stage whose rule it matches, in the order of `STAGES`: the kernel frames say which
system call or fault a sample is in (a socket receive, a write to /dev/fuse, an O_DIRECT write),
the native ones which library (crc32c, lz4, SQLite) or which copy (an mmap or memoryview slice
assignment is the disk tier's copy into its aligned buffer). What is left is the interpreter:
the main thread's (trio, the FUSE handlers, the memory tier, readahead, the write-behind queue)
or the worker threads' (the GET loop, the hand-over to trio, the disk tier's batches).

Used by bench.probes.epoch_cpu (`--perf`); needs `perf` (linux-perf) and root or
kernel.perf_event_paranoid <= 1.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator

Rule = Callable[[str, bool], bool]  # (a sample's call chain as one string, in the main thread)


def _any(*names: str) -> Rule:
    return lambda chain, _main: any(name in chain for name in names)


_RECEIVE = ("tcp_recvmsg", "sock_recv")
STAGES: list[tuple[str, Rule]] = [
    (
        "receive: first touch of fresh block memory (page faults, zeroing)",
        lambda chain, _main: any(n in chain for n in _RECEIVE) and "page_fault" in chain,
    ),
    ("verify: CRC32C of each 64 KiB", _any("crc32c")),
    ("disk tier: copy into the aligned buffer", _any("mmap_ass_subscript", "memory_ass_sub")),
    ("disk tier: lz4 probe", _any("LZ4", "lz4")),
    ("disk tier: O_DIRECT write", _any("os_pwrite", "iomap_dio", "ext4_dio")),
    (
        "disk tier: entry file create, open, unlink",
        _any("do_sys_openat2", "os_open", "do_unlinkat", "os_unlink", "os_remove"),
    ),
    ("disk tier: index (SQLite), free space (statvfs)", _any("sqlite3", "statfs")),
    ("receive: socket -> block (kernel copy, recv, send)", _any(*_RECEIVE, "tcp_sendmsg")),
    (
        "FUSE: reply (writev to /dev/fuse) and request read",
        _any("fuse_dev_write", "fuse_reply", "fuse_send_msg", "fuse_dev_read"),
    ),
    (
        "thread wake-ups and waits (futex, GIL), epoll",
        _any("futex", "pthread_cond", "sem_post", "sem_wait", "take_gil", "drop_gil", "epoll"),
    ),
    ("Python, main thread (trio, FUSE handlers, memory tier, readahead)", lambda _c, main: main),
    ("Python, worker threads (GET loop, hand-over, disk batches)", lambda _c, main: not main),
]


def record(pid: int, output: str) -> subprocess.Popen[bytes]:
    """Start sampling the process `pid` (every thread) into `output`, once perf is attached to
    every thread (a second); `stop` ends it."""
    argv = ["perf", "record", "-F", "499", "--call-graph", "dwarf,8192", "-p", str(pid)]
    sampler = subprocess.Popen(
        [*argv, "-o", output], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    time.sleep(1)
    return sampler


def stop(sampler: subprocess.Popen[bytes] | None) -> None:
    """End a sampling `record` started (None: there was none); its file is written."""
    if sampler is not None:
        sampler.send_signal(signal.SIGINT)
        sampler.wait()


def _samples(data: str) -> Iterator[tuple[bool, str]]:
    """(in the main thread, the call chain) of each sample in a perf.data file."""
    script = subprocess.run(
        ["perf", "script", "-i", data, "-F", "pid,tid,ip,sym,dso"],
        capture_output=True,
        text=True,
        check=True,
    )
    main, frames = False, list[str]()
    for line in [*script.stdout.splitlines(), ""]:
        fields = line.split()
        if not fields:
            if frames:
                yield main, " ".join(frames)
            frames = []
        elif len(fields) == 1 and fields[0].count("/") == 1:  # "pid/tid": a sample begins
            pid, tid = fields[0].split("/")
            main = pid == tid
        elif len(fields) >= 2:
            frames.append(" ".join(fields[1:]))


def split(data: str) -> tuple[Counter[str], int]:
    """Samples per stage in a perf.data file, and the samples in all."""
    counts: Counter[str] = Counter()
    total = 0
    for main, chain in _samples(data):
        total += 1
        counts[next(name for name, rule in STAGES if rule(chain, main))] += 1
    return counts, total


def table(data: str, cpu_per_gib: float) -> str:
    """Each stage's share of the samples, and of `cpu_per_gib` (the run's measured CPU)."""
    counts, total = split(data)
    lines = [f"  {total} samples"]
    for name, _rule in STAGES:
        share = counts[name] / max(total, 1)
        lines.append(f"  {name:66} {cpu_per_gib * share:5.2f} CPU-s/GiB ({100 * share:4.1f}%)")
    return "\n".join(lines)
