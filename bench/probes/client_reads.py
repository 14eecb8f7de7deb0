"""Each library's reads as a system sees them: the kernel's READs at pffs and the store's GETs.

Not part of the bench suite: the patterns of the clients scenario (bench.clients), one at a
time on one mount with empty caches, the page cache dropped before each, traced on both sides:

- the kernel's READs at pffs (pffs only): pffs is run in the foreground in a process of this
  module's (`--serve`), its FUSE `open` and `read` handlers wrapped to write one line per call:
  start, seconds, file handle, offset, size (then the run's window in blocks and its reader
  window's rate in MB/s and request time in ms, `w=8 rate=166 rt=130`), and at open the thread
  that opened it (pyfuse3's `read` is told no caller: a read's thread is its file handle's
  opener's; the kernel's own readahead and a mapping's faults carry the faulting thread's in
  FUSE, but pyfuse3 drops it); and the bytes of each READ a region's spans answered
  (pffs.fs.regions: `RegionStreams.take` wrapped too);
- what the system fetched: every request through a counting proxy (bench.counting, its `--log`),
  the Range of each GET, for any system (`--system s3fs`, `--system rclone` too; `--system
  floor`: the least a pyfuse3 file system does, each file fetched whole from its open and
  served from memory, bench/probes/_storefloor.py, what bounds a pattern besides pffs's
  choices; `--system kept-floor`: the same, each piece also written to disk as it lands, the
  least a caching file system does).

Per pattern it prints the kernel's reads (count, bytes, sizes, how each file handle moved: in
order, forward gap, backward), the store's GETs (count, sizes, bytes, bytes asked twice) and
the bytes fetched over the kernel's and over what the client needed, and the CPU the mount's
process used over the pattern beside this process's (the client's), the store's, the delay
proxy's and the counting proxy's, and the cores the whole machine kept busy;
the raw traces stay in `--out`. With `--perf PREFIX` (pffs), perf samples every thread of the
mount over each pattern and what follows it, and the probe prints that CPU per GiB the kernel
read split by stage (bench/probes/_perfstages.py, as bench.probes.epoch_cpu's `--perf`);
`--no-trace` leaves pffs's handlers unwrapped, to see what the trace costs the mount.

    python -m bench.probes.client_reads --latency 20                 # quick sizes, pffs
    python -m bench.probes.client_reads --sizes full --patterns parquet_columns,safetensors_lazy
    python -m bench.probes.client_reads --system rclone --latency 20
    python -m bench.probes.client_reads --sizes full --latency 20 --baseline /tmp/base --rounds 2
    python -m bench.probes.client_reads --sizes full --patterns parquet_scan --perf /tmp/scan
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from bench import clients
from bench.counting import CountingProxy
from bench.data import client, prime
from bench.leftovers import stopped_cleanly, track_mount, track_process, unmount
from bench.probes import _perfstages as perfstages
from bench.probes import lean_store
from bench.scenarios import drop_caches
from bench.servers import Launcher, Server, far
from bench.systems import Rclone, S3fs, cpu_seconds, machine_cpu_seconds, mount_system
from pffs.cli.stats_view import read_snapshot, series, total
from pffs.config import FuseConfig
from pffs.mounting.kernel import set_kernel_readahead

BUCKET = "clients"
KIB = 1024
GIB = 1 << 30
# pffs's own counters of where a pattern's bytes came from and went (its .pffs/stats), in MiB.
PFFS_BYTES = {
    "served from memory": ("pffs_cache_served_bytes_total", {"tier": "memory"}),
    "from disk": ("pffs_cache_served_bytes_total", {"tier": "disk"}),
    "from the store": ("pffs_cache_served_bytes_total", {"tier": "store"}),
    "blocks fetched": ("pffs_cache_store_fetched_bytes_total", {}),
    "preloaded": ("pffs_preload_files_fetched_bytes_total", {}),
    "pushed to the page cache": ("pffs_page_cache_pushed_bytes_total", {}),
}
UNTRACED = "none"  # --serve's trace path for a pffs whose handlers are not wrapped
# The kernel's READ sizes in classes: (upper bound, name); the last class takes the rest.
SIZE_CLASSES = [(128 * KIB, "under 128 KiB"), (1024 * KIB, "128 KiB to 1 MiB"), (0, "1 MiB")]


# --- the traced mount (the --serve process) ----------------------------------------------


def serve(trace_path: str, pffs_argv: list[str]) -> int:
    """pffs in this process, its open and read handlers writing each call to `trace_path`."""
    from pffs.cli.main import main
    from pffs.fuse_ops import PffsOperations

    if trace_path == UNTRACED:
        return main(pffs_argv)
    trace = open(trace_path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (the process's)
    lock = threading.Lock()

    def write(line: str) -> None:
        with lock:
            trace.write(line + "\n")

    original_open, original_read = PffsOperations.open, PffsOperations.read

    @functools.wraps(original_open)
    async def traced_open(self: Any, inode: int, flags: int, ctx: Any) -> Any:
        info = await original_open(self, inode, flags, ctx)
        write(f"open {time.monotonic():.6f} {info.fh} {inode} {ctx.pid}")
        return info

    @functools.wraps(original_read)
    async def traced_read(self: Any, fh: int, off: int, size: int) -> Any:
        started = time.monotonic()
        data = await original_read(self, fh, off, size)
        seconds = time.monotonic() - started
        write(f"read {started:.6f} {seconds:.6f} {fh} {off} {size}" + _window(self, fh))
        return data

    from pffs.fs.regions import RegionStreams

    original_take = RegionStreams.take

    @functools.wraps(original_take)
    async def traced_take(self: Any, offset: int, end: int, rest: Any) -> bytes | memoryview | None:
        data = await original_take(self, offset, end, rest)
        if data is not None:  # the READ was answered by its region's spans (pffs.fs.regions)
            write(f"span {time.monotonic():.6f} {len(data)}")
        return data

    PffsOperations.open = traced_open  # type: ignore[method-assign]
    PffsOperations.read = traced_read  # type: ignore[method-assign]
    RegionStreams.take = traced_take  # type: ignore[method-assign]
    return main(pffs_argv)


def _window(ops: Any, fh: int) -> str:
    """After a READ: its run's window (blocks), and its reader window's size (MiB), rate (MB/s)
    and request time (ms), or nothing when this pffs has none of them."""
    handle = ops.vfs.handles.get(fh)
    readahead = getattr(handle, "readahead", None)
    if readahead is None:
        return ""
    text = f" w={readahead.window}"
    reader = readahead.reader_window
    if reader is not None and reader.rate is not None and reader.request_time is not None:
        text += f" rate={reader.rate / 1e6:.0f} rt={reader.request_time * 1e3:.0f}"
    return text


def _mount_traced(
    server: Server,
    mountpoint: str,
    cache: str,
    trace: str,
    options: list[str],
    tree: str | None = None,
) -> subprocess.Popen[bytes]:
    """The traced pffs; with `tree`, that source tree's pffs (its package found first: `python
    -m` puts the working directory first on the path), this tree's bench."""
    argv = [sys.executable, "-m", "bench.probes.client_reads", "--serve", trace, "--"]
    argv += ["mount", f"s3://{BUCKET}", mountpoint, "--endpoint-url", server.endpoint_url]
    argv += ["--cache-dir", cache, "--foreground", *options]
    track_mount(mountpoint)
    env = server.env()
    if tree is not None:
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join([tree, here])
    proc = subprocess.Popen(argv, env=env, cwd=tree, stderr=subprocess.DEVNULL)
    return _mounted(proc, mountpoint, "the traced pffs")


def _mount_floor(
    server: Server, mountpoint: str, objects: dict[str, int], workdir: str, keep_dir: str | None
) -> subprocess.Popen[bytes]:
    """The store floor (bench/probes/_storefloor.py) over the bucket's `objects`, with the
    kernel's readahead pffs sets; writing what it fetches into `keep_dir` if one is given."""
    listing = os.path.join(workdir, "objects.json")
    with open(listing, "w", encoding="utf-8") as f:
        json.dump(objects, f)
    argv = [sys.executable, "-m", "bench.probes._storefloor", mountpoint, "--bucket", BUCKET]
    argv += ["--endpoint-url", server.endpoint_url, "--objects", listing]
    argv += ["--keep", keep_dir] if keep_dir is not None else []
    track_mount(mountpoint)
    proc = _mounted(subprocess.Popen(argv, env=server.env()), mountpoint, "the store floor")
    set_kernel_readahead(mountpoint, FuseConfig.kernel_readahead)  # as pffs does at its INIT
    return proc


def _mounted(proc: subprocess.Popen[bytes], mountpoint: str, what: str) -> subprocess.Popen[bytes]:
    """`proc` once its file system is mounted at `mountpoint` (30 s at most)."""
    track_process(proc)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if os.path.ismount(mountpoint):
            return proc
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{what} did not mount at {mountpoint}")


# --- reading the traces -------------------------------------------------------------------


def _kernel_reads(trace: str, since: float, until: float) -> list[tuple[float, int, int, int]]:
    """(start, fh, offset, size) of each READ in [since, until)."""
    reads = []
    with open(trace, encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if parts[0] == "read" and since <= float(parts[1]) < until:
                reads.append((float(parts[1]), int(parts[3]), int(parts[4]), int(parts[5])))
    return reads


def _span_bytes(trace: str, since: float, until: float) -> int:
    """The bytes of the READs in [since, until) that a region's spans answered."""
    total = 0
    with open(trace, encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if parts[0] == "span" and since <= float(parts[1]) < until:
                total += int(parts[2])
    return total


def _gets(log: str, since: float, until: float) -> list[tuple[str, int, int]]:
    """(key, first byte, length) of each object GET in [since, until); a GET of a whole object
    has length -1."""
    gets = []
    with open(log, encoding="utf-8") as f:
        for line in f:
            stamp, _, method, target, byte_range = line.split(" ", 4)
            if method != "GET" or not since <= float(stamp) < until or "?" in target:
                continue
            key = target.split("/", 2)[-1]
            spec = byte_range.strip()
            if spec.startswith("bytes="):
                first, _, last = spec[6:].partition("-")
                start = int(first)
                gets.append((key, start, int(last) - start + 1 if last else -1))
            else:
                gets.append((key, 0, -1))
    return gets


def pffs_bytes(mountpoint: str) -> dict[str, float]:
    """PFFS_BYTES now (bytes), from a pffs mount's metrics."""
    values = series(read_snapshot(mountpoint))
    return {name: total(values, metric, **labels) for name, (metric, labels) in PFFS_BYTES.items()}


def _sizes_text(values: list[int]) -> str:
    common = collections.Counter(values).most_common(4)
    return ", ".join(f"{size // KIB} KiB x{n}" for size, n in common)


def describe_reads(reads: list[tuple[float, int, int, int]]) -> dict[str, Any]:
    """The kernel's READs: how many, their sizes, how each file handle moved."""
    if not reads:
        return {"reads": 0}
    ends: dict[int, int] = {}
    moves = collections.Counter[str]()
    gaps = []
    for _, fh, off, size in sorted(reads):
        if fh in ends:
            gap = off - ends[fh]
            moves["in order" if gap == 0 else "forward" if gap > 0 else "backward"] += 1
            if gap:
                gaps.append(gap)
        ends[fh] = off + size
    span = max(start for start, *_ in reads) - min(start for start, *_ in reads)
    return {
        "reads": len(reads),
        "bytes": sum(size for *_, size in reads),
        "sizes": _sizes_text([size for *_, size in reads]),
        "classes": size_classes([size for *_, size in reads]),
        "handles": len(ends),
        "moves": dict(moves),
        "median gap KiB": round(statistics.median(gaps) / KIB) if gaps else 0,
        "seconds": round(span, 3),
    }


def size_classes(sizes: list[int]) -> dict[str, str]:
    """READs per class of SIZE_CLASSES: their count and their share of the bytes, as
    `{"1 MiB": "278 (97%)"}`; a class with none is left out."""
    counts, sums = collections.Counter[str](), collections.Counter[str]()
    for size in sizes:
        name = next(name for bound, name in SIZE_CLASSES if size < bound or bound == 0)
        counts[name] += 1
        sums[name] += size
    whole = max(sum(sums.values()), 1)
    return {
        name: f"{counts[name]} ({100 * sums[name] / whole:.0f}%)"
        for _, name in SIZE_CLASSES
        if counts[name]
    }


def describe_gets(gets: list[tuple[str, int, int]], sizes: dict[str, int]) -> dict[str, Any]:
    """The store's GETs: how many, their sizes, bytes, and bytes asked more than once."""
    seen: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    total = again = 0
    lengths = []
    for key, start, length in gets:
        length = sizes.get(key, 0) - start if length < 0 else length
        lengths.append(length)
        total += length
        for a, b in seen[key]:
            again += max(0, min(b, start + length) - max(a, start))
        seen[key].append((start, start + length))
    return {
        "gets": len(gets),
        "bytes": total,
        "sizes": _sizes_text(lengths) if lengths else "",
        "objects": len(seen),
        "bytes asked again": again,
    }


# --- the probe ----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.probes.client_reads", description=__doc__)
    p.add_argument("--serve", help=argparse.SUPPRESS)  # the traced pffs process
    p.add_argument("--latency", type=float, default=0.0, help="ms of round trip (0)")
    p.add_argument("--sizes", choices=("quick", "full"), default="quick")
    p.add_argument("--patterns", default=",".join(clients.PATTERNS))
    p.add_argument(
        "--system",
        choices=("pffs", "s3fs", "rclone", "floor", "kept-floor"),
        default="pffs",
        help="floor: the least a pyfuse3 file system does, each file fetched whole at its open "
        "(bench/probes/_storefloor.py); kept-floor: the same writing each piece to disk as it "
        "lands, the least a caching one does",
    )
    p.add_argument("--pffs-options", default="", help="extra `pffs mount` options, quoted")
    p.add_argument("--out", help="where the raw traces stay (a new directory)")
    p.add_argument(
        "--no-trace",
        action="store_true",
        help="pffs's handlers not wrapped (no kernel READs traced): what the trace costs the mount",
    )
    p.add_argument(
        "--perf",
        metavar="PREFIX",
        help="pffs only: perf's samples of the mount (every thread) over each pattern into "
        "PREFIX-<arm>-<round>-<pattern>.data, and its CPU per GiB read split by stage "
        "(bench/probes/_perfstages.py; perf's sampling adds a little CPU)",
    )
    p.add_argument("--rounds", type=int, default=1, help="mounts per arm, arms alternated (1)")
    p.add_argument(
        "--lean-store",
        action="store_true",
        help="after the upload, serve s3rver's objects from bench.probes.lean_store (sendfile, "
        "almost no CPU): what the patterns take when the store costs this machine nothing",
    )
    p.add_argument(
        "--baseline",
        metavar="DIR",
        help="a source tree whose pffs is a second arm (git archive COMMIT pffs backends, its "
        "backends moved under pffs/, as for bench.probes.large_reads)",
    )
    args, rest = p.parse_known_args(argv)
    if args.serve:
        return serve(args.serve, [a for a in rest if a != "--"])
    patterns = args.patterns.split(",")
    if args.perf and args.system != "pffs":
        p.error("--perf samples pffs's mount: use it with --system pffs")
    if unknown := set(patterns) - set(clients.PATTERNS):
        p.error(f"unknown pattern {sorted(unknown)[0]!r}: one of {', '.join(clients.PATTERNS)}")
    out = args.out or tempfile.mkdtemp(prefix="client-reads-")
    os.makedirs(out, exist_ok=True)
    with stopped_cleanly():
        return _probe(args, patterns, out)


def _probe(args: argparse.Namespace, patterns: list[str], out: str) -> int:
    sizes = clients.ClientSizes.quick() if args.sizes == "quick" else clients.ClientSizes.full()
    workdir = tempfile.mkdtemp(prefix="client-reads-work-", dir="/var/tmp")
    near = Launcher(workdir).s3rver()
    target = near
    arms: list[tuple[str, str | None]] = [("this tree", None)]
    if args.baseline:
        arms.append(("baseline", os.path.abspath(args.baseline)))
    try:
        s3 = client(near)
        s3.create_bucket(Bucket=BUCKET)
        data = clients.generate(
            sizes, workdir, lambda local, key: s3.upload_file(local, BUCKET, key)
        )
        for top in clients.TOPS:  # s3rver 3 lists a prefix of sub-prefixes only with one
            s3.put_object(Bucket=BUCKET, Key=f"{top}/about", Body=b"bench.data says why")
        objects = {o["Key"]: o["Size"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]}
        prime(near, BUCKET, clients.keys(data))  # as the bench: no arm reads an object first
        if args.lean_store:
            near = target = lean_store.launch(workdir, near)
        if args.latency:
            target = far(near, args.latency, os.path.join(out, "delay.log"))
        clients.warm_libraries(sizes)
        print(f"{args.system}, {args.latency:g} ms, {args.sizes} sizes; traces in {out}")
        figures: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
        for round_number in range(1, args.rounds + 1):
            for name, tree in arms if round_number % 2 else arms[::-1]:  # ABBA...
                arm_out = os.path.join(out, f"{name.replace(' ', '-')}-{round_number}")
                os.makedirs(arm_out)
                print(f"\n=== {name}, round {round_number} (load {os.getloadavg()[0]:.1f})")
                session = _Session(args, target, data, objects, arm_out, workdir, tree)
                for pattern, seconds, ratio in session.run(patterns):
                    figures[(name, pattern)].append(f"{seconds:.2f} s, {ratio:.2f}x")
        if len(arms) > 1 or args.rounds > 1:
            print("\nseconds and bytes the store sent over the bytes needed, round by round:")
            for pattern in patterns:
                for name, _ in arms:
                    print(f"  {pattern:17s} {name:9s} " + " | ".join(figures[(name, pattern)]))
    finally:
        if target is not near:
            target.stop()
        near.stop()
        # The store's objects and the generated files: GiBs a run at full size leaves otherwise.
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


class _Session:
    """One mount (one arm, one round) over fresh caches, through a logging counting proxy."""

    def __init__(
        self,
        args: argparse.Namespace,
        target: Server,
        data: clients.ClientData,
        objects: dict[str, int],
        out: str,
        workdir: str,
        tree: str | None,
    ) -> None:
        self.args, self.target, self.data, self.objects = args, target, data, objects
        self.out, self.tree = out, tree
        self.base = tempfile.mkdtemp(prefix="session-", dir=workdir)

    def run(self, patterns: list[str]) -> list[tuple[str, float, float]]:
        """Each pattern's seconds and the store's bytes over the bytes needed."""
        store_log, trace = os.path.join(self.out, "store.log"), os.path.join(self.out, "kernel.log")
        proxy = CountingProxy(self.target, log=store_log)
        mountpoint, cache = os.path.join(self.base, "mnt"), os.path.join(self.base, "cache")
        os.makedirs(mountpoint)
        os.makedirs(cache)
        proc = None
        results = []
        try:
            if self.args.system == "pffs":
                options = self.args.pffs_options.split()
                traced = UNTRACED if self.args.no_trace else trace
                proc = _mount_traced(proxy.server, mountpoint, cache, traced, options, self.tree)
                pid: int | None = proc.pid
            elif self.args.system in ("floor", "kept-floor"):
                keep_dir = cache if self.args.system == "kept-floor" else None
                proc = _mount_floor(proxy.server, mountpoint, self.objects, self.base, keep_dir)
                pid = proc.pid
            else:
                system = S3fs() if self.args.system == "s3fs" else Rclone()
                pid = mount_system(system, proxy.server, BUCKET, mountpoint, cache)
            for pattern in patterns:
                seconds, ratio = self._pattern(pattern, mountpoint, pid, proxy, store_log, trace)
                results.append((pattern, seconds, ratio))
        finally:
            unmount(mountpoint)
            if proc is not None:
                proc.wait(timeout=30)
            proxy.stop()
            shutil.rmtree(self.base, ignore_errors=True)
        return results

    def _sides_cpu(self, proxy: CountingProxy) -> dict[str, float]:
        """CPU so far of the store's processes, of the delay proxy (when there is one) and of
        the counting proxy."""
        sides = {"the store": sum(cpu_seconds(pid) or 0.0 for pid in self.target.store_pids)}
        sides["the counting proxy"] = cpu_seconds(proxy.pid) or 0.0
        if self.target.pid is not None and self.target.pid not in self.target.store_pids:
            sides["the delay proxy"] = cpu_seconds(self.target.pid) or 0.0
        return sides

    def _pattern(
        self,
        pattern: str,
        mountpoint: str,
        pid: int | None,
        proxy: CountingProxy,
        store_log: str,
        trace: str,
    ) -> tuple[float, float]:
        drop_caches()
        time.sleep(0.5)
        sampled_from, perf_data, sampler = cpu_seconds(pid), None, None
        if self.args.perf and pid is not None:
            perf_data = f"{self.args.perf}-{os.path.basename(self.out)}-{pattern}.data"
            sampler = perfstages.record(pid, perf_data)
        counters = pffs_bytes(mountpoint) if self.args.system == "pffs" else {}
        proxy.restart_count()
        since = time.monotonic()
        sides = self._sides_cpu(proxy)
        machine = machine_cpu_seconds()
        mount_cpu, own_cpu = cpu_seconds(pid), time.process_time()
        started = time.perf_counter()
        check = clients.RUNNERS[pattern](mountpoint, self.data)
        seconds = time.perf_counter() - started
        own_cpu = time.process_time() - own_cpu
        mount_after = cpu_seconds(pid)
        machine_after = machine_cpu_seconds()
        sides_after = self._sides_cpu(proxy)
        time.sleep(clients.QUIET_S * 2)  # what is fetched after the client is done
        until = time.monotonic()
        mount_quiet = cpu_seconds(pid)
        check()  # the bench's check of what was read, after every clock (bench.clients.Runner)
        if counters:
            after = pffs_bytes(mountpoint)
            moved = {name: f"{(after[name] - counters[name]) / 2**20:.0f}" for name in counters}
            counted = f"  pffs's counters (MiB): {moved}"
        else:
            counted = ""
        perfstages.stop(sampler)
        mount_used = (
            "unknown"
            if mount_cpu is None or mount_after is None or mount_quiet is None
            else f"{mount_after - mount_cpu:.2f} s ({mount_quiet - mount_cpu:.2f} s with what"
            f" followed in {clients.QUIET_S * 2:g} s)"
        )
        proxy.restart_count()
        sent = proxy.store_bytes  # what the store sent: a GET cut short counts what came
        needed = clients.read_bytes(self.data, pattern)
        gets = describe_gets(_gets(store_log, since, until), self.objects)
        print(f"\n{pattern}: {seconds:.3f} s, the client needed {needed / KIB:,.0f} KiB")
        read_bytes = needed
        if os.path.exists(trace):
            reads = describe_reads(_kernel_reads(trace, since, until))
            print(f"  kernel READs: {reads}")
            if reads.get("bytes"):
                print(f"  sent / read by the kernel: {sent / reads['bytes']:.2f}")
                spans = _span_bytes(trace, since, until)
                print(f"  READ bytes its region's spans answered: {spans / reads['bytes']:.2f}")
                read_bytes = reads["bytes"]
                if mount_cpu is not None and mount_after is not None:
                    per_read = (mount_after - mount_cpu) / reads["reads"] * 1e6
                    per_gib = (mount_after - mount_cpu) / (read_bytes / GIB)
                    print(
                        f"  the mount's CPU: {per_gib:.2f} CPU-s/GiB read, {per_read:.0f} us/READ"
                    )
        print(f"  store GETs (ranges asked): {gets}")
        if counted:
            print(counted)
        print(f"  CPU: the mount {mount_used}, the client {own_cpu:.2f} s")
        used = {side: sides_after[side] - cpu for side, cpu in sides.items()}
        busy, steal = (after - before for after, before in zip(machine_after, machine, strict=True))
        print(
            "  the machine: "
            + ", ".join(f"{side} {cpu:.2f} s" for side, cpu in used.items())
            + f"; {busy / seconds:.2f} of {os.cpu_count()} cores busy over the pattern"
            f" ({busy:.2f} CPU-s, steal {steal:.2f})"
        )
        print(f"  sent by the store: {sent / KIB:,.0f} KiB, over needed: {sent / needed:.2f}")
        if perf_data is not None and sampled_from is not None and mount_quiet is not None:
            sampled = (mount_quiet - sampled_from) / (read_bytes / GIB)
            print(f"  by stage, from perf attached to what followed ({perf_data}):")
            print(perfstages.table(perf_data, sampled))
        with open(os.path.join(self.out, "spans.txt"), "a", encoding="utf-8") as f:
            f.write(f"{pattern} {since:.6f} {until:.6f}\n")
        return seconds, sent / needed


if __name__ == "__main__":
    sys.exit(main())
