"""Cold reads of one large file through pffs against RGW: two source trees interleaved.

Not part of the bench suite (no peers): an A/B of pffs's own read path in one run window. One
one-node Ceph with its gateway (memstore, pffs.testing.rgw) holds one object of `--size`
bytes; for each latency (`--latency 0,20`: 0 is the gateway itself, more goes through the
bench's delay proxy), each round and each read, every arm (this tree; `--baseline`'s; this
tree with `--variant`'s options) mounts pffs over a fresh cache directory, the page cache
dropped, and reads the file whole:

- `seq`: 1 MiB reads (the bench's `seqread.fio` does psync reads of 1 MiB);
- `checkpoint`: 8 MiB reads with a sha256 of every byte (bench/largeobjects.py).

Per read: MB/s, the CPU per GiB of the mount, the store (gateway + OSD, from /proc), the
reader (this process: the read calls and the checkpoint's sha256) and the delay proxy, and
their total, which against the two cores of this machine shows how near a read is to being
bound by CPU; then, for pffs, the GETs the mount made and the bytes it received over the
file's (its own counters, `.pffs/stats`) and the mount's peak RSS (VmHWM, from its mount to the
end of the read). `--s3fs` adds s3fs-fuse (its disk cache on, as the bench mounts it) as one
more arm, so pffs's budget is set beside a peer's in the same run window.

    python -m bench.probes.large_reads --baseline /tmp/base --rounds 2
    python -m bench.probes.large_reads --reads checkpoint --variant "--readahead-max 64M"
    python -m bench.probes.large_reads --latency 0 --reads seq --rounds 1 --profile /tmp/spy
    python -m bench.probes.large_reads --s3fs --rounds 3

(`--profile PREFIX`: py-spy's raw stacks of every busy thread of this tree's mount, one file per
read, PREFIX-0ms-seq-1.txt. /tmp/base: `git archive COMMIT pffs backends | tar -x -C
/tmp/base`, then its backends moved to /tmp/base/pffs/backends, as for epoch_cpu.py.)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from bench.data import client
from bench.largeobjects import read_whole
from bench.leftovers import unmount
from bench.probes.epoch_cpu import _drop_page_cache
from bench.servers import Launcher, Server, far
from bench.systems import S3fs, cpu_seconds, mount_system, peak_rss_mib
from pffs.sizes import parse_size

MIB = 1 << 20
READS = {"seq": 1 * MIB, "checkpoint": 8 * MIB}
KEY = "large.bin"


def _upload(server: Server, size: int) -> None:
    """The object in 64 MiB parts of random bytes, as bench/data.py uploads the large file."""
    s3 = client(server)
    s3.create_bucket(Bucket="large")
    part = 64 * MIB
    with tempfile.NamedTemporaryFile(dir="/var/tmp") as f:
        for at in range(0, size, part):
            f.write(os.urandom(min(part, size - at)))
        f.flush()
        s3.upload_file(f.name, "large", KEY)


def _counters(mountpoint: str) -> tuple[float, float]:
    """GETs made and object bytes received so far (pffs's own counters)."""
    with open(os.path.join(mountpoint, ".pffs", "stats"), "rb") as f:
        metrics = json.load(f)["metrics"]

    def total(name: str, request: str | None = None) -> float:
        samples = metrics.get(name, {}).get("samples", [])
        return sum(
            float(s["value"])
            for s in samples
            if request is None or s.get("labels", {}).get("request") == request
        )

    return total("pffs_backend_requests_total", "GET"), total("pffs_backend_received_bytes_total")


def _cpu(pid: int | None) -> float:
    """A process's CPU seconds so far; 0 for none."""
    return (cpu_seconds(pid) or 0.0) if pid is not None else 0.0


def _store_cpu(server: Server) -> float:
    return sum(_cpu(pid) for pid in server.store_pids)


def _reader_cpu() -> float:
    """This process's CPU seconds: the reader's (the probe reads in its main thread only)."""
    return time.process_time()


def _s3fs_round(server: Server, size: int, read: str, root: str) -> str:
    """One cold read through s3fs-fuse: MB/s and each side's CPU per GiB."""
    mountpoint = tempfile.mkdtemp(dir=root, prefix="mnt-")
    cache = tempfile.mkdtemp(dir=root, prefix="cache-")
    pid = mount_system(S3fs(), server, "large", mountpoint, cache)
    try:
        if pid is None:
            sys.exit(f"large_reads: no s3fs process serves {mountpoint}")
        return _timed_read(server, size, read, mountpoint, pid)
    finally:
        unmount(mountpoint)


def _timed_read(server: Server, size: int, read: str, mountpoint: str, pid: int) -> str:
    """Read the file whole, the page cache dropped first: MB/s and each side's CPU."""
    _drop_page_cache()
    # A far server's own process is its delay proxy; RGW's is among the store's.
    proxy = server.pid if server.pid not in server.store_pids else None
    before = (_cpu(pid), _store_cpu(server), _reader_cpu(), _cpu(proxy))
    started = time.perf_counter()
    total, _ = read_whole(os.path.join(mountpoint, KEY), READS[read])
    elapsed = time.perf_counter() - started
    after = (_cpu(pid), _store_cpu(server), _reader_cpu(), _cpu(proxy))
    if total != size:
        sys.exit(f"large_reads: read {total} bytes of {size}")
    gib = size / (1 << 30)
    mount_cpu, store_cpu, reader_cpu, proxy_cpu = (
        b - a for a, b in zip(before, after, strict=True)
    )
    all_cpu = mount_cpu + store_cpu + reader_cpu + proxy_cpu
    return (
        f"{size / elapsed / 1e6:6.0f} MB/s  mount {mount_cpu / gib:4.2f}  store"
        f" {store_cpu / gib:4.2f}  reader {reader_cpu / gib:4.2f}  proxy {proxy_cpu / gib:4.2f}"
        f"  total {all_cpu / gib:4.2f} CPU-s/GiB ({all_cpu / elapsed:4.2f} cores)"
    )


def _round(
    server: Server,
    size: int,
    read: str,
    root: str,
    tree: str | None,
    options: list[str],
    profile: str | None = None,
) -> str:
    mountpoint = tempfile.mkdtemp(dir=root, prefix="mnt-")
    cache = tempfile.mkdtemp(dir=root, prefix="cache-")
    argv = [sys.executable, "-m", "pffs", "mount", "s3://large", mountpoint]
    argv += ["--endpoint-url", server.endpoint_url, "--cache-dir", cache]
    argv += ["--log-file", os.path.join(root, "pffs.log"), *options]
    env = server.env()
    if tree is not None:  # its pffs found first: `python -m` puts the working directory first
        env["PYTHONPATH"] = tree
    mounted = subprocess.run(argv, env=env, cwd=tree, capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        sys.exit(f"large_reads: pffs mount failed: {mounted.stderr.strip()}")
    pid = int(mounted.stdout.split("(pid ")[1].split(",")[0])
    try:
        spy = None
        if profile is not None:  # every busy thread's Python stacks, named by thread
            py_spy = os.path.join(os.path.dirname(sys.executable), "py-spy")  # the venv's
            spy_argv = [py_spy, "record", "-p", str(pid), "-o", profile, "-f", "raw"]
            spy = subprocess.Popen(
                [*spy_argv, "--threads", "--nonblocking", "--rate", "250"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1)
        gets, received = _counters(mountpoint)
        figures = _timed_read(server, size, read, mountpoint, pid)
        gets_after, received_after = _counters(mountpoint)
        peak = peak_rss_mib(pid) or 0.0
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait()
    finally:
        subprocess.run([sys.executable, "-m", "pffs", "umount", mountpoint], check=False)
    return (
        f"{figures}  {gets_after - gets:4.0f} GETs"
        f"  {(received_after - received) / size:5.3f} x the file received"
        f"  peak RSS {peak:4.0f} MiB  (mount pid {pid})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1G", help="the object's size (1G)")
    parser.add_argument("--latency", default="0,20", help="round trips to add, ms (0,20)")
    parser.add_argument("--reads", default="seq,checkpoint", help="seq,checkpoint")
    parser.add_argument("--rounds", type=int, default=2, help="of each tree, alternated")
    parser.add_argument("--baseline", metavar="DIR", help="a source tree (see above) to compare")
    parser.add_argument("--options", default="", help="more `pffs mount` options, one string")
    parser.add_argument("--variant", help="one more arm: this tree with these options added")
    parser.add_argument("--profile", metavar="PREFIX", help="py-spy's stacks of this tree's reads")
    parser.add_argument("--s3fs", action="store_true", help="one more arm: s3fs-fuse")
    args = parser.parse_args()
    size = parse_size(args.size)
    reads = args.reads.split(",")
    if not set(reads) <= set(READS):
        sys.exit(f"large_reads: --reads: {args.reads!r}: each one of {', '.join(READS)}")
    options = args.options.split()
    arms: list[tuple[str, str | None, list[str]]] = [("this tree", None, options)]
    if args.baseline is not None:
        if not os.path.isdir(os.path.join(args.baseline, "pffs")):
            sys.exit(f"large_reads: --baseline {args.baseline}: no pffs package in it")
        arms.append(("baseline", os.path.abspath(args.baseline), options))
    if args.variant is not None:
        arms.append(("variant", None, [*options, *args.variant.split()]))
    if args.s3fs:
        S3fs().check()
        arms.append(("s3fs", None, []))
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="pffs-large-reads-") as root:
        server = Launcher(root).rgw()
        try:
            _upload(server, size)
            for latency in (float(ms) for ms in args.latency.split(",")):
                target = server if latency == 0 else far(server, latency, f"{root}/delay.log")
                for round_ in range(args.rounds):
                    order = arms if round_ % 2 == 0 else arms[::-1]
                    for read in reads:
                        for label, tree, arm_options in order:
                            profile = None
                            if args.profile is not None and label == "this tree":
                                profile = f"{args.profile}-{latency:g}ms-{read}-{round_ + 1}.txt"
                            figures = (
                                _s3fs_round(target, size, read, root)
                                if label == "s3fs"
                                else _round(target, size, read, root, tree, arm_options, profile)
                            )
                            print(f"{latency:3g} ms {read:10} {label:9} round {round_ + 1}:"
                                  f" {figures}", flush=True)  # fmt: skip
                if target is not server:
                    target.stop()
        finally:
            server.stop()


if __name__ == "__main__":
    main()
