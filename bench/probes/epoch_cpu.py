"""The mount's CPU over a training epoch: cold with the disk tier on and off, or remounted.

Not part of the bench suite (no peers): s3rver on loopback holds `--files` objects of
`--size` bytes; each round mounts pffs at its defaults over a fresh cache directory (or with
`--cache-dir none`), drops the page cache (as root), reads every file whole in a shuffled
order with 8 threads (bench/epoch.py, the suite's epoch 1), and reads the mount's CPU from
/proc/PID/stat before and after: files/s and CPU milliseconds per file. The disk tier's
writes behind the epoch are waited for (unmount waits for them) and counted in its CPU.

With `--remount`, the suite's "epoch 2 after a remount" instead: one mount fills a cache
directory with an epoch (untimed) and is unmounted; then each round mounts pffs again over
that directory, drops the page cache and reads the set in another order (bench/remount.py's
seed), so every block comes from the disk tier.

    python -m bench.probes.epoch_cpu --files 2000 --rounds 2
    python -m bench.probes.epoch_cpu --files 1 --size 268435456   # a cold sequential read
    python -m bench.probes.epoch_cpu --files 1 --size 1073741824 --tier-only --perf /tmp/p
        # the same at 1 GiB, its CPU split by stage from perf's samples (_perfstages.py)
    python -m bench.probes.epoch_cpu --remount --rounds 3         # from the disk tier
    python -m bench.probes.epoch_cpu --remount --baseline /tmp/base  # against a commit
    python -m bench.probes.epoch_cpu --baseline /tmp/base --rounds 3  # cold, against a commit

(/tmp/base: `git archive COMMIT pffs backends | tar -x -C /tmp/base`, then its backends moved
to /tmp/base/pffs/backends.)
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from bench.data import client
from bench.epoch import read_epoch
from bench.probes import _perfstages as perfstages
from bench.remount import FILL_SEED, REMOUNT_SEED
from bench.scenarios import drop_caches
from bench.servers import Launcher, Server
from bench.systems import cpu_seconds

KIB = 1024


def _cpu(pid: int, thread: int | None = None, system_only: bool = False) -> float:
    """The mount's CPU so far (bench.systems.cpu_seconds); it must still be running."""
    seconds = cpu_seconds(pid, thread, system_only)
    if seconds is None:
        raise ProcessLookupError(f"epoch_cpu: the mount (pid {pid}) is gone")
    return seconds


def _drop_page_cache() -> None:
    if not drop_caches():
        print("epoch_cpu: not root, the page cache was not dropped", file=sys.stderr)


def _upload(server: Server, bucket: str, files: int, size: int) -> list[str]:
    s3 = client(server)
    s3.create_bucket(Bucket=bucket)
    keys = [f"train/{n:06d}.bin" for n in range(files)]

    def put(n: int) -> None:
        s3.put_object(Bucket=bucket, Key=keys[n], Body=os.urandom(size))

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, range(files)))
    return keys


def _round(
    server: Server,
    bucket: str,
    keys: list[str],
    size: int,
    root: str,
    cache: str,
    profile: str | None = None,
    seed: int = 1,
    source_tree: str | None = None,
    again: bool = False,
    options: tuple[str, ...] = (),
    every_thread: bool = False,
    perf: str | None = None,
) -> str:
    mountpoint = tempfile.mkdtemp(dir=root, prefix="mnt-")
    argv = [sys.executable, "-m", "pffs", "mount", f"s3://{bucket}", mountpoint]
    argv += ["--endpoint-url", server.endpoint_url, "--cache-dir", cache]
    argv += ["--log-file", os.path.join(root, "pffs.log"), *options]
    env = server.env()
    if source_tree is not None:
        # Its pffs package found before the installed one: `python -m` puts the working
        # directory first on the path, then PYTHONPATH.
        env["PYTHONPATH"] = source_tree
    mounted = subprocess.run(
        argv, env=env, cwd=source_tree, capture_output=True, text=True, check=False
    )
    if mounted.returncode != 0:
        sys.exit(f"epoch_cpu: pffs mount failed: {mounted.stderr.strip()}")
    match = re.search(r"\(pid (\d+),", mounted.stdout)
    if match is None:
        sys.exit(f"epoch_cpu: no pid in {mounted.stdout!r}")
    pid = int(match.group(1))
    cpu_epoch = 0.0
    try:
        _drop_page_cache()
        spy = None
        if profile is not None:  # py-spy's collapsed stacks of the thread holding the GIL
            # 250 samples a second: enough for an epoch of a few seconds.
            spy_argv = ["py-spy", "record", "-p", str(pid), "-o", profile, "-f", "raw"]
            spy_argv += ["--threads"] if every_thread else ["--gil"]
            spy = subprocess.Popen(
                [*spy_argv, "--rate", "250"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1)
        sampler = None if perf is None else perfstages.record(pid, perf)
        cpu, system = _cpu(pid), _cpu(pid, system_only=True)
        main_thread = _cpu(pid, thread=pid)
        rate = read_epoch(mountpoint, keys, size, seed=seed)
        cpu_epoch = _cpu(pid) - cpu
        main_thread = _cpu(pid, thread=pid) - main_thread
        system = _cpu(pid, system_only=True) - system
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait()
        memory, again_cpu = "", 0.0
        if again:  # the same set once more, now from the memory tier: the floor to compare with
            _drop_page_cache()
            before = _cpu(pid)
            rate_again = read_epoch(mountpoint, keys, size, seed=seed + 1)
            again_cpu = _cpu(pid) - before
            per_file_again = again_cpu / len(keys) * 1e3
            memory = f"; again from memory {rate_again:5.0f} files/s {per_file_again:5.2f} ms"
    finally:
        # The unmount waits for the writes behind the epoch; their CPU is read just before the
        # process exits, so take it while it winds down.
        umount = subprocess.Popen([sys.executable, "-m", "pffs", "umount", mountpoint])
        cpu_total = cpu_epoch
        while umount.poll() is None:
            used = cpu_seconds(pid)
            if used is None:
                break  # exited
            cpu_total = used - cpu
            time.sleep(0.01)
    stages = ""
    # Sampled to the end: the writes left after the epoch are in.
    if sampler is not None and perf is not None:
        perfstages.stop(sampler)
        stages = "\n" + perfstages.table(perf, cpu_total / (len(keys) * size / (1 << 30)))
    per_file = cpu_epoch / len(keys) * 1e3
    with_writes = (cpu_total - again_cpu) / len(keys) * 1e3
    return (
        f"{rate:7.0f} files/s  {per_file:5.2f} ms CPU/file in the epoch"
        f" ({system / len(keys) * 1e3:4.2f} system,"
        f" {main_thread / len(keys) * 1e3:4.2f} in the main thread),"
        f" {cpu_epoch / (len(keys) * size / (1 << 30)):5.2f} CPU-s/GiB"
        f"  ({with_writes:5.2f} with the writes left at its end){memory}{stages}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--size", type=int, default=100 * KIB)
    parser.add_argument("--rounds", type=int, default=2, help="of each setting, alternated")
    parser.add_argument("--profile", help="py-spy's collapsed stacks of the disk tier's epoch")
    parser.add_argument(
        "--profile-threads",
        action="store_true",
        help="profile every busy thread (stacks named by thread), not only the GIL's holder",
    )
    parser.add_argument(
        "--perf",
        metavar="FILE",
        help="perf's samples of the disk tier's rounds (every thread) into FILE, and the mount's"
        " CPU per GiB split by stage (bench/probes/_perfstages.py)",
    )
    parser.add_argument("--tier-only", action="store_true", help="no round without the tier")
    parser.add_argument(
        "--remount", action="store_true", help="epochs remounted over one filled cache directory"
    )
    parser.add_argument(
        "--baseline",
        metavar="DIR",
        help="a source tree whose pffs (DIR/pffs, its backends in DIR/pffs/backends) runs"
        " every other round, to compare two commits interleaved (cold rounds: disk tier only)",
    )
    parser.add_argument(
        "--options",
        default="",
        help='more `pffs mount` options for every round, one string ("--preload off")',
    )
    args = parser.parse_args()
    if args.baseline is not None and not os.path.isdir(os.path.join(args.baseline, "pffs")):
        sys.exit(f"epoch_cpu: --baseline {args.baseline}: no pffs package in it")
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="pffs-epoch-cpu-") as root:
        server = Launcher(root).s3rver()
        try:
            keys = _upload(server, "epoch", args.files, args.size)
            if args.remount:
                _remounted(server, keys, args, root)
                return
            options = tuple(args.options.split())
            settings: list[tuple[str, str | None]] = [("disk tier", None)]
            if args.baseline is not None:
                settings.append(("baseline", os.path.abspath(args.baseline)))
            elif not args.tier_only:
                settings.append(("--cache-dir none", None))
            for round_ in range(args.rounds):
                for number, (label, tree) in enumerate(settings):
                    tier = label != "--cache-dir none"
                    cache = f"{root}/cache{round_}-{number}" if tier else "none"
                    profile = args.profile if label == "disk tier" else None
                    perf = args.perf if label == "disk tier" else None
                    figures = _round(
                        server,
                        "epoch",
                        keys,
                        args.size,
                        root,
                        cache,
                        profile,
                        source_tree=tree,
                        options=options,
                        every_thread=args.profile_threads,
                        perf=perf,
                    )
                    print(f"{label:17} round {round_ + 1}: {figures}", flush=True)
        finally:
            server.stop()


def _remounted(server: Server, keys: list[str], args: argparse.Namespace, root: str) -> None:
    """Fill one cache directory with an epoch, then time remounted epochs over it."""
    cache = f"{root}/cache"
    figures = _round(server, "epoch", keys, args.size, root, cache, seed=FILL_SEED)
    print(f"{'fill (cold)':17}        : {figures}", flush=True)
    trees: list[tuple[str, str | None]] = [("remounted", None)]
    if args.baseline is not None:
        trees.append(("baseline", os.path.abspath(args.baseline)))
    for round_ in range(args.rounds):
        for label, tree in trees:
            figures = _round(
                server,
                "epoch",
                keys,
                args.size,
                root,
                cache,
                args.profile if tree is None else None,
                seed=REMOUNT_SEED,
                source_tree=tree,
                again=True,
                options=tuple(args.options.split()),
            )
            print(f"{label:17} round {round_ + 1}: {figures}", flush=True)


if __name__ == "__main__":
    main()
