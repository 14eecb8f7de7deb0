"""`python -m bench.probes.epoch_budget`: where the CPU goes in a cold epoch via a far store.

On this machine the store (s3rver), the delay proxy that stands for the distance, the readers
and the file system share the same cores. For the store's own files/s (the bench's ceiling,
bench.epoch.store_files_per_s: presigned GETs on 64 connections) and for pffs's cold epoch
(bench.epoch.read_epoch at the mount's defaults, page cache dropped), each row gives files/s and
the CPU milliseconds per file of every process in the path: s3rver, the proxy, this process
(the ceiling's GETs or the epoch's 8 readers) and the mount. Their sum bounds the files/s the
machine can give: cores / sum. Rows alternate, `--rounds` of each.

    python -m bench.probes.epoch_budget --files 2000 --rtt-ms 20 --rounds 3
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import tempfile
import time
from collections.abc import Callable

from bench.data import Dataset, Sizes, upload
from bench.epoch import read_epoch, store_files_per_s
from bench.scenarios import drop_caches
from bench.servers import Launcher, Server, far
from bench.systems import Pffs, cpu_seconds, unmount


def _measured(
    pids: dict[str, int | None], work: Callable[[], float]
) -> tuple[float, dict[str, float]]:
    """Run `work` (it returns files/s); the CPU seconds each process used meanwhile."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    client = time.process_time()
    rate = work()
    used = {"client": time.process_time() - client}
    for name, pid in pids.items():
        start, end = before[name], cpu_seconds(pid)
        if start is not None and end is not None:
            used[name] = end - start
    return rate, used


def _row(label: str, files: int, rate: float, used: dict[str, float]) -> str:
    per_file = {name: seconds / files * 1e3 for name, seconds in used.items()}
    total = sum(per_file.values())
    parts = "  ".join(f"{name} {ms:4.2f}" for name, ms in per_file.items())
    bound = (os.cpu_count() or 1) / (total / 1e3) if total else float("inf")
    return (
        f"{label:6} {rate:6.0f} files/s  CPU ms/file: {parts}  total {total:4.2f}"
        f"  (the cores allow {bound:5.0f} files/s)"
    )


def _pffs_epoch(store: Server, far_store: Server, data: Dataset, root: str) -> str:
    mountpoint = tempfile.mkdtemp(dir=root, prefix="mnt-")
    cache = tempfile.mkdtemp(dir=root, prefix="cache-")
    pid = Pffs([]).mount(far_store, data.bucket, mountpoint, cache)
    try:
        drop_caches()
        keys, size = data.epoch_keys, data.sizes.epoch_size
        pids = {"s3rver": store.pid, "proxy": far_store.pid, "pffs": pid}
        rate, used = _measured(pids, lambda: read_epoch(mountpoint, keys, size, seed=1))
        used["readers"] = used.pop("client")
    finally:
        unmount(mountpoint)
        deadline = time.monotonic() + 60  # the mount writes what it fetched, then exits
        while pid is not None and os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.05)
        shutil.rmtree(cache, ignore_errors=True)
    return _row("pffs", len(keys), rate, used)


def _store(store: Server, far_store: Server, data: Dataset) -> str:
    pids = {"s3rver": store.pid, "proxy": far_store.pid}
    rate, used = _measured(pids, lambda: store_files_per_s(far_store, data))
    return _row("store", len(data.epoch_keys), rate, used)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--size", type=int, default=100 * 1024)
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not drop_caches():
        print("epoch_budget: not root, the page cache is not dropped before an epoch")
    sizes = dataclasses.replace(Sizes.quick(), epoch_files=args.files, epoch_size=args.size)
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="pffs-epoch-budget-") as root:
        store = Launcher(root).s3rver()
        try:
            data = upload(store, sizes, root)
            far_store = far(store, args.rtt_ms, os.path.join(root, "proxy.log"))
            try:
                print(f"s3rver, {args.rtt_ms:g} ms, {os.cpu_count()} cores, {args.files} files")
                for _ in range(args.rounds):
                    print(_store(store, far_store, data), flush=True)
                    print(_pffs_epoch(store, far_store, data, root), flush=True)
            finally:
                far_store.stop()
        finally:
            store.stop()


if __name__ == "__main__":
    main()
