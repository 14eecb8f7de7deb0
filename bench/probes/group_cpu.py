"""`python -m bench.probes.group_cpu`: where the CPU goes in the cache group scenario.

The group scenario of `python -m bench` (bench.group: 4 mounts on 127.0.0.2-5 read one training
set at once, each in its own order, the store 20 ms away behind a counting proxy), group on and
group off in alternate rounds over fresh caches, on s3rver. For each run: the wall time, and the
CPU seconds over the read of every process in the path, from /proc: the four mounts, the store
(s3rver), the delay proxy, the counting proxy and this process (the 32 readers, hashing every
file). With the group on, each mount's peer hits and the bytes it served are counted too, so
the CPU a peer hit costs (asker and owner together) can be set against what a store GET costs
s3rver and the two proxies. `--profile DIR` records py-spy's stacks (every thread, 200 a second)
of the first member in each grouped run into DIR/group-N.txt (collapsed form), and
`--top N` prints the N leaf functions with most samples of each.

    flock /tmp/pffs-bench.lock .venv/bin/python -m bench.probes.group_cpu --rounds 2
    flock /tmp/pffs-bench.lock .venv/bin/python -m bench.probes.group_cpu --profile /tmp/gp
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

from bench.counting import CountingProxy
from bench.group import BUCKET, RTT_MS, GroupSizes, put_dataset
from bench.groupmounts import Group, mounts, read_everything, stats_of
from bench.servers import Launcher, Server, far
from bench.systems import cpu_seconds


def _cpu(pids: dict[str, int | None]) -> dict[str, float]:
    out = {}
    for name, pid in pids.items():
        used = cpu_seconds(pid)
        if used is not None:
            out[name] = used
    return out


def _spy(pid: int, output: str) -> subprocess.Popen[bytes]:
    """py-spy's stacks of the thread holding the GIL (Python's own CPU; a thread waiting in a
    system call is not sampled) of `pid`, 200 a second, until SIGINT."""
    binary = os.path.join(os.path.dirname(sys.executable), "py-spy")
    argv = [binary, "record", "-p", str(pid), "-o", output, "-f", "raw", "--rate", "200", "--gil"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def one_run(
    far_store: Server, store_pid: int | None, data_digests: dict[str, str], root: Path,
    grouped: bool, profile: str | None, file_size: int,
) -> str:  # fmt: skip
    proxy = CountingProxy(far_store)
    group = Group(root)
    spy = None
    try:
        with mounts(group, BUCKET, proxy.server, grouped) as mounted:
            mount_pids = {name: int(stats_of(mnt)["pid"]) for name, mnt in mounted.items()}
            if profile is not None:
                spy = _spy(mount_pids["node0"], profile)
                time.sleep(1)  # py-spy attaches before the read starts
            pids: dict[str, int | None] = {
                **mount_pids,
                "s3rver": store_pid,
                "delay": far_store.pid,
                "counting": proxy.pid,
            }
            mains = {f"{name} main": cpu_seconds(pid, pid) for name, pid in mount_pids.items()}
            before, readers = _cpu(pids), time.process_time()
            proxy.restart_count()
            _, seconds = read_everything(mounted, data_digests)
            counts = proxy.restart_count()
            after = _cpu(pids)
            used = {name: after[name] - before[name] for name in after if name in before}
            used["readers"] = time.process_time() - readers
            main_used = {
                name: (cpu_seconds(mount_pids[name.split()[0]], mount_pids[name.split()[0]]) or 0)
                - (start or 0)
                for name, start in mains.items()
            }
            stats = {name: stats_of(mnt) for name, mnt in mounted.items()}
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait()
        proxy.stop()
    mounts_cpu = sum(used[name] for name in mount_pids)
    store_side = sum(used.get(name, 0.0) for name in ("s3rver", "delay", "counting"))
    gets = counts.get("GET", 0)
    received = sum(s.get("pffs_group_peer_bytes_total{way=received}", 0.0) for s in stats.values())
    served = sum(s.get("pffs_group_peer_bytes_total{way=served}", 0.0) for s in stats.values())
    hits = received / file_size
    lines = [
        f"{'group' if grouped else 'off':5} wall {seconds:5.2f} s  store GETs {gets}  "
        f"peer hits {hits:.0f} (served {served / file_size:.0f})  "
        f"CPU s: mounts {mounts_cpu:5.2f} ("
        + " ".join(f"{used[n]:.2f}" for n in mount_pids)
        + f")  s3rver {used.get('s3rver', 0):.2f}  delay {used.get('delay', 0):.2f}"
        f"  counting {used.get('counting', 0):.2f}  readers {used['readers']:.2f}"
        f"  total {sum(used.values()):.2f}",
        f"      store side per GET {1e3 * store_side / max(gets, 1):.2f} ms;"
        f" mounts' trio threads {sum(main_used.values()):.2f} s",
    ]
    return "\n".join(lines)


def top(raw: str, count: int) -> str:
    """The `count` leaf functions with most samples in a py-spy raw (collapsed) file, and the
    share of samples under each of a few callers of interest."""
    leaves: Counter[str] = Counter()
    under: Counter[str] = Counter()
    total = 0
    marks = (
        "client.py", "server.py", "signing.py", "protocol.py", "peers.py",
        "h11", "urllib3", "http/client", "fetching.py", "fuse_ops.py", "diskio.py",
        "run_blocking", "crc32c", "hmac",
    )  # fmt: skip
    for line in Path(raw).read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        samples = int(n)
        total += samples
        frames = stack.split(";")
        leaves[frames[-1]] += samples
        for mark in marks:
            if any(mark in frame for frame in frames):
                under[mark] += samples
    out = [f"  {total} samples; under: " + ", ".join(
        f"{m} {100 * c / total:.1f}%" for m, c in under.most_common()
    )]  # fmt: skip
    out += [f"  {100 * c / total:5.1f}% {leaf}" for leaf, c in leaves.most_common(count)]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="group on and off, each round")
    parser.add_argument("--profile", help="a directory for py-spy's stacks of node0")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    sizes = GroupSizes.full()
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="pffs-group-cpu-") as work:
        launcher = Launcher(work)
        near = launcher.s3rver()
        stack.callback(near.stop)
        data = put_dataset(near, sizes)
        far_store = far(near, RTT_MS, os.path.join(work, "delay.log"))
        stack.callback(far_store.stop)
        if args.profile:
            os.makedirs(args.profile, exist_ok=True)
        for n in range(args.rounds):
            for grouped in (True, False):
                root = Path(tempfile.mkdtemp(prefix="run-", dir=work))
                raw = None
                if args.profile and grouped:
                    raw = os.path.join(args.profile, f"group-{n}.txt")
                print(f"[load {os.getloadavg()[0]:.1f}]", flush=True)
                row = one_run(far_store, near.pid, data.digests, root, grouped, raw, data.size)
                print(row, flush=True)
                if raw is not None and os.path.exists(raw):
                    print(top(raw, args.top), flush=True)
                shutil.rmtree(root, ignore_errors=True)
        print(f"[load {os.getloadavg()[0]:.1f}]", flush=True)


if __name__ == "__main__":
    main()
