"""`python -m bench.probes.epoch_budget`: where the CPU goes in a cold epoch via a far store.

On this machine the store (s3rver, or RGW's gateway and OSD), the delay proxy that stands for
the distance, the readers and the file system share the same cores. For the store's own files/s
(the bench's ceiling, bench.epoch.store_files_per_s: presigned GETs on 64 connections) and for
pffs's cold epoch (bench.epoch.read_epoch at the mount's defaults, or `--pffs-options`, page
cache dropped), each row gives files/s and the CPU milliseconds per file of every process in the
path: the store's, the proxy, this process (the ceiling's GETs or the epoch's 8 readers) and the
mount. Their sum bounds the files/s the machine can give: cores / sum. Rows alternate,
`--rounds` of each; `--peers s3fs` adds a peer's cold epoch to each round, for the ratio in one
run; `--profile` records py-spy's stacks of the mount's GIL holder over each pffs epoch.

    python -m bench.probes.epoch_budget --files 2000 --rtt-ms 20 --rounds 3
    python -m bench.probes.epoch_budget --server rgw --peers s3fs --profile /tmp/rgw-epoch
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from bench.data import Dataset, Sizes, upload
from bench.epoch import read_epoch, store_files_per_s
from bench.scenarios import drop_caches
from bench.servers import Launcher, Server, far
from bench.systems import Pffs, Rclone, S3fs, System, cpu_seconds, unmount

PEERS: dict[str, type[System]] = {"s3fs": S3fs, "rclone": Rclone}


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


def _store_pids(store: Server) -> dict[str, int | None]:
    """The store's processes by name: RGW's gateway and OSD, or the one server process."""
    if store.name == "rgw" and len(store.store_pids) == 2:
        return {"radosgw": store.store_pids[0], "osd": store.store_pids[1]}
    return {store.name: store.pid}


def _epoch(
    system: System,
    store: Server,
    far_store: Server,
    data: Dataset,
    root: str,
    profile: str | None = None,
) -> str:
    """One cold epoch of `system` (page cache dropped), its row; py-spy's stacks of the mount's
    GIL holder into `profile` when given (250 samples a second)."""
    mountpoint = tempfile.mkdtemp(dir=root, prefix="mnt-")
    cache = tempfile.mkdtemp(dir=root, prefix="cache-")
    pid = system.mount(far_store, data.bucket, mountpoint, cache)
    spy = None
    try:
        drop_caches()
        if profile is not None and pid is not None:
            spy_binary = os.path.join(os.path.dirname(sys.executable), "py-spy")
            argv = [spy_binary, "record", "-p", str(pid), "-o", profile, "-f", "raw", "--gil"]
            spy = subprocess.Popen(
                [*argv, "--rate", "250"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            time.sleep(1)  # py-spy attaches before the epoch starts
        keys, size = data.epoch_keys, data.sizes.epoch_size
        pids = {**_store_pids(store), "proxy": far_store.pid, system.name: pid}
        rate, used = _measured(pids, lambda: read_epoch(mountpoint, keys, size, seed=1))
        used["readers"] = used.pop("client")
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait()
        unmount(mountpoint)
        deadline = time.monotonic() + 60  # the mount writes what it fetched, then exits
        while pid is not None and os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.05)
        shutil.rmtree(cache, ignore_errors=True)
    return _row(system.name, len(keys), rate, used)


def _store(store: Server, far_store: Server, data: Dataset) -> str:
    pids = {**_store_pids(store), "proxy": far_store.pid}
    rate, used = _measured(pids, lambda: store_files_per_s(far_store, data))
    return _row("store", len(data.epoch_keys), rate, used)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", choices=("s3rver", "rgw"), default="s3rver")
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--size", type=int, default=100 * 1024)
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--peers", default="", help="peers' epochs too, in each round (s3fs,rclone)"
    )
    parser.add_argument("--pffs-options", default="", help="options of pffs mount, one string")
    parser.add_argument("--profile", help="py-spy's raw stacks of each pffs epoch: PROFILE.N")
    args = parser.parse_args()
    peers = [name for name in args.peers.split(",") if name]
    unknown = [name for name in peers if name not in PEERS]
    if unknown:
        parser.error(f"--peers: unknown {', '.join(unknown)} (s3fs, rclone)")
    if not drop_caches():
        print("epoch_budget: not root, the page cache is not dropped before an epoch")
    systems: list[System] = [Pffs(shlex.split(args.pffs_options))]
    systems += [PEERS[name]() for name in peers]
    sizes = dataclasses.replace(Sizes.quick(), epoch_files=args.files, epoch_size=args.size)
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="pffs-epoch-budget-") as root:
        launcher = Launcher(root)
        store = launcher.rgw() if args.server == "rgw" else launcher.s3rver()
        try:
            data = upload(store, sizes, root)
            far_store = far(store, args.rtt_ms, os.path.join(root, "proxy.log"))
            try:
                print(
                    f"{args.server}, {args.rtt_ms:g} ms, {os.cpu_count()} cores, {args.files} files"
                )
                for round_number in range(args.rounds):
                    print(_store(store, far_store, data), flush=True)
                    for system in systems:
                        profile = None
                        if args.profile and isinstance(system, Pffs):
                            profile = f"{args.profile}.{round_number}"
                        print(_epoch(system, store, far_store, data, root, profile), flush=True)
                    print(f"load average: {os.getloadavg()[0]:.2f}", flush=True)
            finally:
                far_store.stop()
        finally:
            store.stop()


if __name__ == "__main__":
    main()
