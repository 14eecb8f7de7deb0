"""`python -m bench`: servers, dataset, systems, scenarios, repetitions, report.

Repetitions are interleaved across systems and rotated (A B C, B C A, ...) so drift on a
shared machine hits every system alike; each repetition mounts with empty caches. Everything
started is stopped on the way out, failures, Ctrl-C and SIGTERM included (bench.leftovers).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from typing import Any, TypeVar

from bench import clients as client_patterns
from bench import data as ds
from bench import group, leftovers, report
from bench.charts import draw_charts
from bench.epoch import store_files_per_s
from bench.larger_than_cache import epoch2_cached_share
from bench.metadata import create_tree
from bench.progress import Progress, Run, expected_seconds
from bench.remount import remount_epoch
from bench.scenarios import (
    CLIENT_KEYS,
    CLIENTS,
    LARGER_THAN_CACHE,
    LONGEST_TTL_WAITED,
    LONGEST_TTL_WAITED_QUICK,
    METRICS,
    TAKEN_WITH,
    Scenarios,
    drop_caches,
    local_disk_ceiling,
    server_ceiling,
)
from bench.servers import Launcher, Server, Unavailable, external, far
from bench.systems import Pffs, Rclone, S3fs, System, mount_system, peak_rss_mib, unmount
from pffs.sizes import SizeError, parse_size
from pffs.testing.rgw import OBJECTSTORES

# The servers --servers may name, each started by the Launcher method of that name.
SERVERS = ("moto", "s3rver", "rgw", "minio")
GROUP = "group"  # --only's name of the cache group scenario (bench.group)
GROUP_SECONDS = {True: 90.0, False: 240.0}  # its rough length per server, by --quick
CLIENTS_SECONDS = {True: 8.0, False: 35.0}  # the clients scenario's per run, by quick sizes


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke test of every scenario: tiny sizes, one repetition, s3rver (< 5 min)",
    )
    p.add_argument("--servers", help="moto,s3rver,rgw[,minio] (moto,s3rver; s3rver with --quick)")
    p.add_argument(
        "--rgw-objectstore",
        choices=OBJECTSTORES,
        default="memstore",
        help="where RGW's OSD keeps data: memstore (RAM) or bluestore (a file on disk)",
    )
    p.add_argument("--endpoint-url", help="also benchmark this endpoint (credentials from env)")
    p.add_argument("--minio-bin", default=shutil.which("minio"), help="MinIO binary (from PATH)")
    p.add_argument("--systems", default="pffs,s3fs,rclone", help="pffs,s3fs,rclone")
    p.add_argument("--reps", type=int, help="repetitions (3; 1 with --quick)")
    p.add_argument("--large", help="large file size, e.g. 1G (1G; 32M with --quick)")
    p.add_argument("--small-files", type=int, help="number of 64 KiB files (1000; 40)")
    p.add_argument("--wide-files", type=int, help="objects in the wide directory (10000; 300)")
    p.add_argument(
        "--tree-files", type=int, help="objects of the ls -lR tree, in 100 dirs (100000; 1000)"
    )
    p.add_argument("--pffs-options", default="", help="extra `pffs mount` options, quoted")
    p.add_argument(
        "--latency",
        default="0,20ms",
        help="round trips to add in front of each server, each run in turn (0,20ms)",
    )
    p.add_argument("--epoch-files", type=int, help="files in the training set (2000; 200)")
    p.add_argument("--epoch-size", help="size of each training file (100K)")
    p.add_argument("--write", help="size of the sequential write, e.g. 256M (1G; 8M with --quick)")
    p.add_argument(
        "--lazy-tensors",
        type=int,
        help="8 MiB tensors of the lazily loaded safetensors checkpoint (64; 16)",
    )
    p.add_argument(
        "--client-sizes",
        choices=("quick", "full"),
        help="the clients scenario's files (bench.clients): full, or quick with --quick",
    )
    p.add_argument(
        "--only",
        help="comma-separated metrics to measure, e.g. write_mbs (all); "
        f"seq_warm_mbs needs seq_cold_mbs before it; {GROUP}: the cache group scenario; "
        f"{CLIENTS}: every figure of the clients scenario (bench.clients)",
    )
    p.add_argument("--out", default="results", help="results directory (results/)")
    args = p.parse_args(argv)
    if args.servers is None:
        # moto reads a whole object for each ranged GET: the quick run keeps to s3rver.
        args.servers = "s3rver" if args.quick else "moto,s3rver"
    unknown_servers = [n for n in args.servers.split(",") if n not in SERVERS]
    if unknown_servers:
        p.exit(2, f"bench: unknown server {unknown_servers[0]!r}: one of {', '.join(SERVERS)}\n")
    keys = [m.key for m in METRICS] + [GROUP, CLIENTS]
    unknown = set(args.only.split(",")) - set(keys) if args.only else set()
    if unknown:
        p.error(f"unknown metric {sorted(unknown)[0]!r}: one of {', '.join(keys)}")
    if args.only:
        named = args.only.split(",")
        args.only = ",".join(
            dict.fromkeys(k for name in named for k in (CLIENT_KEYS if name == CLIENTS else [name]))
        )
    try:
        args.latencies = parse_latencies(args.latency)
    except ValueError as exc:
        p.error(str(exc))
    if args.epoch_files is not None and args.epoch_files < 1:
        p.error(f"--epoch-files: {args.epoch_files} must be 1 or more")
    if args.tree_files is not None and args.tree_files < 100:
        p.error(f"--tree-files: {args.tree_files} must be 100 or more (one per directory)")
    try:
        if args.epoch_size is not None and parse_size(args.epoch_size) < 1:
            p.error(f"--epoch-size: {args.epoch_size!r} must be 1 byte or more")
    except SizeError as exc:
        p.error(f"--epoch-size: {exc}")
    return args


def parse_latencies(text: str) -> list[float]:
    """ "0,20ms" -> [0.0, 20.0]: round trips in milliseconds, each a bare number or "<n>ms"."""
    latencies = []
    for part in text.split(","):
        number = part.strip().removesuffix("ms")
        try:
            value = float(number)
        except ValueError:
            raise ValueError(f"--latency: {part.strip()!r} is not a round trip like 20ms") from None
        if value < 0 or value != value or value == float("inf"):
            raise ValueError(f"--latency: {part.strip()!r} must be 0 or more milliseconds")
        latencies.append(value)
    return latencies


def sizes_from(args: argparse.Namespace) -> ds.Sizes:
    base = ds.Sizes.quick() if args.quick else ds.Sizes.full()
    large = parse_size(args.large) if args.large else base.large
    return ds.Sizes(
        large=large,
        parallel=min(base.parallel, large) if args.large else base.parallel,
        small_files=args.small_files or base.small_files,
        wide_files=args.wide_files or base.wide_files,
        write=parse_size(args.write) if args.write else base.write,
        epoch_files=args.epoch_files or base.epoch_files,
        epoch_size=parse_size(args.epoch_size) if args.epoch_size else base.epoch_size,
        tree_files=args.tree_files or base.tree_files,
        checkpoint=base.checkpoint,
        shard_files=base.shard_files,
        shard_size=base.shard_size,
        lazy_tensors=args.lazy_tensors or base.lazy_tensors,
    )


def make_systems(names: list[str], pffs_options: list[str]) -> tuple[list[System], dict[str, str]]:
    known: dict[str, System] = {"pffs": Pffs(pffs_options), "s3fs": S3fs(), "rclone": Rclone()}
    systems, unavailable = [], {}
    for name in names:
        system = known.get(name)
        if system is None:
            unavailable[name] = "unknown system"
            continue
        try:
            system.check()
            systems.append(system)
        except Unavailable as exc:
            unavailable[name] = str(exc)
    return systems, unavailable


T = TypeVar("T")


def in_turn(systems: list[T], table: int, rep: int) -> list[T]:
    """The systems in the order repetition `rep` of table `table` runs them: rotated (A B C,
    then B C A, ...) each repetition and each server-and-latency table, so that no system is
    always the first to read the data after its upload, which costs RGW more
    (docs/notes/rgw-large-reads.md), nor the first after a proxy or server starts, even in a
    run of one repetition (--quick)."""
    turn = (table + rep) % len(systems) if systems else 0
    return systems[turn:] + systems[:turn]


def run_on_server(
    server: Server,
    data: ds.Dataset,
    args: argparse.Namespace,
    systems: list[System],
    workdir: str,
    progress: Progress,
    latency: float,
    table: int = 0,
) -> tuple[list[dict[str, Any]], list[dict[str, float]], dict[str, str]]:
    """Every repetition of every system against `server` (already far, when it should be);
    `table`: how many server-and-latency tables came before this one (the systems' order
    turns with it)."""
    reps = repetitions(args)
    runs: list[dict[str, Any]] = []
    ceilings: list[dict[str, float]] = []
    unavailable: dict[str, str] = {}
    for rep in range(reps):
        ceilings.append({
            "server_mbs": round(server_ceiling(server, data), 1),
            "store_files_per_s": round(store_files_per_s(server, data), 1),
            "local_disk_mbs": round(local_disk_ceiling(data), 1),
        })  # fmt: skip
        if data.clients is not None and data.clients.arrow_file_bytes > data.sizes.large:
            # The clients' floors (bench.clientfloor) divide by a ceiling over an object of
            # their own size when it is the larger: the large file of --quick (32 MiB) is a
            # few GETs' round trips more than its transfer at 20 ms, a floor too high.
            ceilings[-1]["clients_server_mbs"] = round(
                server_ceiling(
                    server, data, key=client_patterns.ARROW_KEY, size=data.clients.arrow_file_bytes
                ),
                1,
            )
        for system in in_turn(systems, table, rep):
            progress.run(Run(server.name.split(",")[0], latency, rep, system.name), reps)
            if system.name in unavailable:
                progress.run_done()
                continue
            base = tempfile.mkdtemp(prefix=f"{system.name}-", dir=workdir)
            mountpoint, cache = os.path.join(base, "mnt"), os.path.join(base, "cache")
            os.makedirs(mountpoint)
            os.makedirs(cache)
            try:
                pid = mount_system(system, server, data.bucket, mountpoint, cache)
            except Unavailable as exc:
                unavailable[system.name] = str(exc)
                progress.run_done()
                continue
            try:
                only = measured_steps(args.only)
                scenarios = Scenarios(
                    mountpoint, data, server, args.quick, only, pid, system.kernel_ttl(),
                    progress.scenario,
                )  # fmt: skip
                try:
                    results = scenarios.run_all(system.name)
                    rss = peak_rss_mib(pid)
                    results["peak_rss_mib"] = round(rss, 1) if rss else "error: pid not found"
                finally:
                    unmount(mountpoint)
                peaks = [scenarios.peak_rss_before_reset, rss]
                if only is None or "epoch2_remount_files_per_s" in only:
                    progress.step("epoch2_remount_files_per_s (its own two mounts)")
                    peaks += remount(system, server, data, workdir, results)
                if only is None or LARGER_THAN_CACHE in only:
                    progress.step(f"{LARGER_THAN_CACHE} (a mount of its own)")
                    larger_than_cache(system, server, data, args, workdir, results)
                patterns = client_patterns_of(only)
                if patterns and data.clients is not None:
                    clients_of(system, server, data, workdir, patterns, progress, results)
                known = [peak for peak in peaks if peak is not None]
                results["session_peak_rss_mib"] = (
                    round(max(known), 1) if known else "error: pid not found"
                )
            finally:
                unmount(mountpoint)
                shutil.rmtree(base, ignore_errors=True)
            runs.append(
                {"server": server.name, "system": system.name, "rep": rep, "results": results}
            )
            progress.run_done()
    return runs, ceilings, unavailable


def remount(
    system: System, server: Server, data: ds.Dataset, workdir: str, results: dict[str, float | str]
) -> list[float]:
    """The remounted epoch 2 into `results` (an error there is its figure); the peak RSS of
    each of its mount processes."""
    drop_caches()
    try:
        figures, peaks = remount_epoch(system, server, data, workdir)
    except Exception as exc:  # reported as the scenario's figure; the run goes on
        error = f"error: {str(exc).splitlines()[0][:160]}"
        results["epoch2_remount_files_per_s"] = results["epoch2_remount_requests"] = error
        return []
    results.update(figures)
    return peaks


def larger_than_cache(
    system: System,
    server: Server,
    data: ds.Dataset,
    args: argparse.Namespace,
    workdir: str,
    results: dict[str, float | str],
) -> None:
    """Epoch 2's share from the cache of a dataset twice it (pffs only: bench.larger_than_cache)."""
    if not isinstance(system, Pffs):
        results[LARGER_THAN_CACHE] = "n/a: pffs's counters only"
        return
    drop_caches()
    try:
        share = epoch2_cached_share(system, server, data, workdir, args.quick)
        results[LARGER_THAN_CACHE] = round(share, 1)
    except Exception as exc:  # reported as the scenario's figure; the run goes on
        results[LARGER_THAN_CACHE] = f"error: {str(exc).splitlines()[0][:160]}"


def client_patterns_of(only: set[str] | None) -> list[str]:
    """The clients scenario's patterns `--only` wants (all of them without it)."""
    wanted = client_patterns.PATTERNS
    return [p for p in wanted if only is None or client_patterns.seconds_key(p) in only]


def client_sizes(args: argparse.Namespace) -> client_patterns.ClientSizes | None:
    """The clients scenario's sizes when it runs (its files are generated only then)."""
    if not client_patterns_of(measured_steps(args.only)):
        return None
    quick = args.client_sizes == "quick" if args.client_sizes else args.quick
    return client_patterns.ClientSizes.quick() if quick else client_patterns.ClientSizes.full()


def clients_of(
    system: System,
    server: Server,
    data: ds.Dataset,
    workdir: str,
    patterns: list[str],
    progress: Progress,
    results: dict[str, float | str],
) -> None:
    """The clients scenario (bench.clients) into `results`, on a mount of its own."""
    progress.step("clients (a mount of its own, through a counting proxy)")
    assert data.clients is not None

    def mount(target: Server, mountpoint: str, cache: str) -> int | None:
        return mount_system(system, target, data.bucket, mountpoint, cache)

    try:
        results.update(
            client_patterns.run(
                mount,
                unmount,
                drop_caches,
                server,
                data.clients,
                workdir,
                patterns,
                lambda pattern: progress.step(f"clients: {pattern}"),
            )
        )
    except Exception as exc:  # reported as the scenario's figures; the run goes on
        error = f"error: {str(exc).splitlines()[0][:160]}"
        for pattern in patterns:
            results[client_patterns.seconds_key(pattern)] = error
            results[client_patterns.fetched_key(pattern)] = error


def repetitions(args: argparse.Namespace) -> int:
    return int(args.reps or (1 if args.quick else 3))


def at_latency(server: Server, latency_ms: float, workdir: str) -> Server:
    """`server` as the systems see it at this round trip: itself at 0, else behind a proxy.

    Stopping the result never stops `server` itself: it serves every latency in turn.
    """
    if latency_ms == 0:
        return replace(server, name=f"{server.name}, 0 ms", stop=lambda: None)
    return far(server, latency_ms, os.path.join(workdir, f"delay-{latency_ms:g}ms.log"))


def measured_steps(only: str | None) -> set[str] | None:
    """The scenarios to run for `--only`: a figure taken during another names that one."""
    if not only:
        return None
    return {TAKEN_WITH.get(key, key) for key in only.split(",")} - {GROUP}


def runs_systems(args: argparse.Namespace) -> bool:
    """Whether the systems' runs are wanted: not with `--only group` alone."""
    steps = measured_steps(args.only)
    return steps is None or bool(steps)


def runs_group(args: argparse.Namespace, systems: list[System]) -> bool:
    """The cache group scenario: pffs's, in a full session or when `--only` names it."""
    wanted = not args.only or GROUP in args.only.split(",")
    return wanted and any(isinstance(system, Pffs) for system in systems)


def group_of(server: Server, args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    """The cache group scenario against `server` (near; bench.group puts it 20 ms away)."""
    sizes = group.GroupSizes.quick() if args.quick else group.GroupSizes.full()
    try:
        return group.scenario(server, sizes, workdir)
    except Exception as exc:  # reported as the scenario's figure; the session goes on
        name = server.name.split(",")[0]
        return {"server": name, "error": str(exc).splitlines()[0][:200]}


def plan(args: argparse.Namespace, systems: list[System]) -> Progress:
    """The session's progress, which starts by saying how many runs and about how long."""
    servers = len(args.servers.split(",")) + bool(args.endpoint_url)
    reps = repetitions(args)
    # A run's fixed part: the random reads' timed runs and the wait past the kernel's TTL.
    longest_wait = LONGEST_TTL_WAITED_QUICK if args.quick else LONGEST_TTL_WAITED
    fixed = [
        2 * (1 if args.quick else 10)
        + (system.kernel_ttl() + 1 if system.kernel_ttl() <= longest_wait else 0)
        for system in systems
    ]
    per_run = sum(fixed) / len(fixed) if fixed else 0.0
    expected = 0.0
    if runs_systems(args):
        expected = expected_seconds(
            sizes_from(args), servers, args.latencies, len(systems), reps, per_run
        )
    if runs_group(args, systems):
        expected += servers * GROUP_SECONDS[bool(args.quick)]
    runs = servers * len(args.latencies) * reps * len(systems) if runs_systems(args) else 0
    sizes = client_sizes(args)
    if sizes is not None:  # the clients scenario's mount and patterns, per run
        expected += runs * CLIENTS_SECONDS[sizes == client_patterns.ClientSizes.quick()]
    return Progress(runs, expected)


def run_session(
    args: argparse.Namespace, workdir: str, systems: list[System], unavailable: dict[str, str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Every server, latency, repetition and system: the runs, each server's entry, and each
    server's cache group scenario."""
    progress = plan(args, systems)
    all_runs: list[dict[str, Any]] = []
    servers: list[dict[str, Any]] = []
    groups: list[dict[str, Any]] = []
    tables = 0  # server-and-latency tables begun: the systems' order turns with each
    with contextlib.ExitStack() as stack:
        launcher = Launcher(workdir)
        starters = {
            "moto": launcher.moto,
            "s3rver": launcher.s3rver,
            "rgw": lambda: launcher.rgw(args.rgw_objectstore),
        }
        wanted: list[tuple[str, Any]] = [
            (n, starters[n]) for n in args.servers.split(",") if n in starters
        ]
        if "minio" in args.servers.split(",") or args.minio_bin:
            wanted.append(("minio", lambda: launcher.minio(args.minio_bin or "minio")))
        if args.endpoint_url:
            wanted.append((args.endpoint_url, lambda: external(args.endpoint_url)))
        for name, start in wanted:
            entry: dict[str, Any] = {"name": name, "systems": [s.name for s in systems]}
            try:
                server = start()
            except Unavailable as exc:
                entry["error"] = str(exc)
                servers.append(entry)
                print(f"bench: server {name} not run: {exc}", file=sys.stderr)
                continue
            stack.callback(server.stop)
            server_dir = tempfile.mkdtemp(prefix=f"{server.name.split()[0]}-", dir=workdir)
            if runs_group(args, systems):
                progress.note(f"{server.name}: the cache group scenario (bench.group)")
                groups.append(group_of(server, args, server_dir))
            if not runs_systems(args):
                continue
            progress.note(f"{server.name}: uploading the dataset")
            data = ds.upload(  # near: uploads are no figure
                server, sizes_from(args), server_dir, clients=client_sizes(args)
            )
            progress.note(f"{server.name}: creating the tree of {data.sizes.tree_files:,} objects")
            create_tree(server, data)
            if data.clients is not None:
                entry["clients_must_fetch_bytes"] = {
                    pattern: client_patterns.must_fetch_bytes(data.clients, pattern)
                    for pattern in client_patterns.PATTERNS
                }
            for latency in args.latencies:
                tables += 1
                name = f"{server.name}, {latency:g} ms"
                try:
                    target = at_latency(server, latency, server_dir)
                except Unavailable as exc:
                    servers.append({**entry, "name": name, "error": str(exc)})
                    continue
                try:
                    runs, ceilings, failed = run_on_server(
                        target, data, args, systems, server_dir, progress, latency, tables - 1
                    )
                finally:
                    target.stop()
                servers.append({
                    **entry, "name": name, "latency_ms": latency,
                    "ceiling_runs": ceilings, "unavailable": {**unavailable, **failed},
                })  # fmt: skip
                all_runs += runs
    return all_runs, servers, groups


def commit() -> str | None:
    """The commit of the code measured, "+dirty" when it has changes; None outside git."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(
            ["git", "-C", here, "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        changed = subprocess.run(
            ["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"{head}+dirty" if changed else head


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("fio") is None:
        print("bench: fio is missing (apt-get install fio)", file=sys.stderr)
        return 2
    started = time.time()
    measured = commit()  # before the run: the code it measures
    load_average = os.getloadavg()[0]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = os.path.abspath(os.path.join(args.out, stamp))
    os.makedirs(out_dir, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="pffs-bench-")
    systems, unavailable = make_systems(args.systems.split(","), args.pffs_options.split())
    page_cache_dropped = drop_caches()
    try:
        with leftovers.stopped_cleanly():
            all_runs, servers, groups = run_session(args, workdir, systems, unavailable)
    except (KeyboardInterrupt, leftovers.Stopped) as exc:
        why = "Ctrl-C" if isinstance(exc, KeyboardInterrupt) else str(exc)
        print(f"bench: stopped by {why}; its mounts and servers are gone", file=sys.stderr)
        return 130 if isinstance(exc, KeyboardInterrupt) else 143
    finally:
        if not os.environ.get("PFFS_BENCH_KEEP"):
            shutil.rmtree(workdir, ignore_errors=True)
    summary = report.summarize(all_runs, [s for s in servers if "error" not in s])
    summary["skipped_servers"] = {s["name"]: s["error"] for s in servers if "error" in s}
    summary["groups"] = groups
    summary["machine"] = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "page_cache_dropped": page_cache_dropped,
        "latency_ms": args.latencies,
        "load_average": round(load_average, 2),  # over the minute before the run
    }
    summary["command"] = "python -m bench " + " ".join(argv if argv is not None else sys.argv[1:])
    summary["commit"] = measured
    summary["date"] = time.strftime("%Y-%m-%d", time.gmtime(started))
    summary["seconds"] = round(time.time() - started, 1)
    summary["sizes"] = sizes_from(args).__dict__
    table = report.markdown(summary)
    report.write_json(os.path.join(out_dir, "results.json"), {"summary": summary, "runs": all_runs})
    with open(os.path.join(out_dir, "results.md"), "w", encoding="utf-8") as f:
        f.write(table)
    charts = draw_charts(summary, out_dir)
    print(table)
    for name, reason in summary["skipped_servers"].items():
        print(f"server {name}: not run ({reason})")
    print(f"results: {out_dir} ({len(charts)} charts), {summary['seconds']}s")
    return 0
