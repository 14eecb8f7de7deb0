"""`pffs stats MOUNTPOINT`: a live terminal view of a mount's metrics, or one JSON snapshot.

Everything comes from the mount's hidden `.pffs/stats` file (pffs.fs.special), so it works for any
user who can read the mount, with no port to open. The live view redraws with plain ANSI codes
every --interval seconds: per-second rates over the last interval (the first frame: since the
mount started), hit ratios, store throughput and latency percentiles from the histograms.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

from pffs.errors import MountpointError, UsageError

STATS_PATH = (".pffs", "stats")
CLEAR = "\x1b[H\x1b[2J"
MB = 1e6

Series = dict[tuple[str, tuple[tuple[str, str], ...]], Any]


def add_parser(commands: Any) -> None:
    stats = commands.add_parser(
        "stats",
        help="live metrics of a mount (or --json for scripts)",
        description="Show a pffs mount's metrics, refreshed every --interval seconds, from its "
        "hidden MOUNTPOINT/.pffs/stats file.",
    )
    stats.add_argument("mountpoint")
    stats.add_argument("--json", action="store_true", help="print one snapshot as JSON and exit")
    stats.add_argument("-i", "--interval", type=float, default=1.0, help="seconds between frames")
    stats.add_argument("-n", "--count", type=int, default=0, help="frames to show (0: until ^C)")


def stats_file(mountpoint: str) -> str:
    return os.path.join(os.path.abspath(mountpoint), *STATS_PATH)


def read_snapshot(mountpoint: str) -> dict[str, Any]:
    path = stats_file(mountpoint)
    try:
        with open(path, "rb") as f:
            data: dict[str, Any] = json.loads(f.read())
    except FileNotFoundError:
        raise MountpointError(f"{mountpoint} is not a pffs mount (no {path})") from None
    except OSError as exc:
        raise MountpointError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise MountpointError(f"{path} is not valid JSON: {exc}") from None
    return data


def run(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise UsageError("--interval must be positive")
    if args.json:
        # The file's own bytes: `pffs stats --json` is exactly what the stats file says.
        path = stats_file(args.mountpoint)
        read_snapshot(args.mountpoint)  # the same one-line errors as the live view
        with open(path, "rb") as f:
            sys.stdout.write(f.read().decode())
        return 0
    tty = sys.stdout.isatty()
    previous: dict[str, Any] | None = None
    shown = 0
    try:
        while True:
            current = read_snapshot(args.mountpoint)
            frame = render(previous, current, args.mountpoint)
            sys.stdout.write((CLEAR if tty else "") + frame + ("" if tty else "\n"))
            sys.stdout.flush()
            shown += 1
            if args.count and shown >= args.count:
                return 0
            previous = current
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0


# --- the numbers -----------------------------------------------------------------------------


def series(snapshot: dict[str, Any]) -> Series:
    """(metric name, sorted labels) -> value (or the histogram sample) of a snapshot."""
    out: Series = {}
    for name, family in snapshot.get("metrics", {}).items():
        for sample in family.get("samples", ()):
            key = (name, tuple(sorted(sample.get("labels", {}).items())))
            out[key] = sample if family.get("type") == "histogram" else sample.get("value", 0)
    return out


def total(values: Series, name: str, **labels: str) -> float:
    """Sum of a metric's samples whose labels include `labels`."""
    result = 0.0
    for (metric, sample_labels), value in values.items():
        if metric != name or isinstance(value, dict):
            continue
        if all((k, v) in sample_labels for k, v in labels.items()):
            result += float(value)
    return result


def label_values(values: Series, name: str, label: str) -> list[str]:
    found = {dict(labels).get(label) for metric, labels in values if metric == name}
    return sorted(v for v in found if v is not None)


def pace_lines(values: Series) -> list[str]:
    """One line per source: its pace's places and the requests of each use in them."""
    lines = []
    for source in label_values(values, "pffs_pace_places", "source"):
        uses = "  ".join(
            f"{use} {total(values, 'pffs_pace_in_flight', source=source, use=use):.0f}"
            f"+{total(values, 'pffs_pace_waiting', source=source, use=use):.0f}"
            for use in label_values(values, "pffs_pace_in_flight", "use")
        )
        lines.append(
            f"  pace {source}: places {total(values, 'pffs_pace_places', source=source):.0f}"
            f"/{total(values, 'pffs_pace_ceiling', source=source):.0f}  {uses} (in flight"
            f"+waiting)  push backs {total(values, 'pffs_pace_pushbacks_total', source=source):.0f}"
        )
    return lines


def quantile(buckets: Iterable[tuple[float, float]], q: float) -> float | None:
    """The q-quantile from cumulative (upper bound, count) buckets, interpolated linearly."""
    pairs = sorted(buckets)
    if not pairs or pairs[-1][1] <= 0:
        return None
    target = q * pairs[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in pairs:
        if count >= target:
            if bound == float("inf"):
                return lower_bound
            span = count - lower_count
            fraction = (target - lower_count) / span if span > 0 else 1.0
            return lower_bound + (bound - lower_bound) * fraction
        lower_bound, lower_count = bound, count
    return lower_bound


def _histogram_delta(
    now: Series, before: Series, name: str, **labels: str
) -> tuple[float, float, list[tuple[float, float]]]:
    """(count, sum, cumulative buckets) of a histogram over the interval, labels summed."""
    count, total_sum = 0.0, 0.0
    buckets: dict[float, float] = {}
    for key, sample in now.items():
        metric, sample_labels = key
        if metric != name or not all((k, v) in sample_labels for k, v in labels.items()):
            continue
        old = before.get(key) or {"count": 0, "sum": 0.0, "buckets": []}
        count += sample["count"] - old["count"]
        total_sum += sample["sum"] - old["sum"]
        old_buckets = {float(le): c for le, c in old["buckets"]}
        for le, c in sample["buckets"]:
            bound = float(le)
            buckets[bound] = buckets.get(bound, 0.0) + c - old_buckets.get(bound, 0.0)
    return count, total_sum, sorted(buckets.items())


def _health(now: Series) -> str:
    """The sources' state (pffs_source_up): "  (up)", or which are down."""
    down = [
        source
        for source in label_values(now, "pffs_source_up", "source")
        if total(now, "pffs_source_up", source=source) == 0
    ]
    return f"  DOWN: {', '.join(down)}" if down else "  (up)"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def _ratio(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole > 0 else "-"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return (
        f"{hours}h{rest // 60:02d}m{rest % 60:02d}s" if hours else f"{rest // 60}m{rest % 60:02d}s"
    )


def dataset_lines(now: Series) -> list[str]:
    """A line per dataset being consumed: its size, its share the disk tier holds, whether
    it fits its room (else the cache keeps a stable subset of it: pffs.cache.datasetroom)."""
    lines = []
    for name in label_values(now, "pffs_dataset_size_bytes", "dataset"):
        size = total(now, "pffs_dataset_size_bytes", dataset=name)
        room = total(now, "pffs_dataset_room_bytes", dataset=name)
        fits = total(now, "pffs_dataset_fits", dataset=name) > 0
        lines.append(
            f"  dataset {name}: {size / MB:.1f} MB in "
            f"{total(now, 'pffs_dataset_files', dataset=name):.0f} files, "
            f"cached {_ratio(total(now, 'pffs_dataset_cached_bytes', dataset=name), size)}, "
            + ("fits" if fits else f"does not fit: a stable subset of {_ratio(room, size)} kept")
        )
    return lines


def group_lines(now: Series, rate: Callable[..., float]) -> list[str]:
    """The cache group (pffs.group), when the mount is in one: its members and which are
    broken, bytes from and to peers, fallbacks to the store and refusals."""
    if not total(now, "pffs_group_members"):
        return []
    broken = [
        member
        for member in label_values(now, "pffs_group_member_up", "member")
        if total(now, "pffs_group_member_up", member=member) == 0
    ]
    return [
        "",
        f"group: {total(now, 'pffs_group_members'):.0f} members, "
        + (f"broken: {', '.join(broken)}" if broken else "all up"),
        f"  from peers {rate('pffs_group_peer_bytes_total', way='received') / MB:.1f} MB/s "
        f"({total(now, 'pffs_group_peer_bytes_total', way='received') / MB:.0f} MB), "
        f"served to peers {rate('pffs_group_peer_bytes_total', way='served') / MB:.1f} MB/s "
        f"({total(now, 'pffs_group_peer_bytes_total', way='served') / MB:.0f} MB), "
        f"from the store {total(now, 'pffs_backend_received_bytes_total') / MB:.0f} MB; "
        f"fallbacks {total(now, 'pffs_group_fallbacks_total'):.0f}, "
        f"refusals {total(now, 'pffs_group_refusals_total'):.0f}",
    ]


def render(previous: dict[str, Any] | None, current: dict[str, Any], mountpoint: str) -> str:
    """One frame: rates over the interval since `previous` (or since the mount started)."""
    now = series(current)
    before = series(previous) if previous is not None else {}
    start = float(current.get("start_time", current.get("time", 0.0)))
    since = float(previous["time"]) if previous is not None else start
    elapsed = max(float(current.get("time", 0.0)) - since, 1e-9)
    window = "last interval" if previous is not None else "since mount"

    def rate(name: str, **labels: str) -> float:
        return (total(now, name, **labels) - total(before, name, **labels)) / elapsed

    lines = [
        f"pffs stats  {current.get('mountpoint', mountpoint)}  pid {current.get('pid', '?')}  "
        f"up {_duration(float(current.get('time', start)) - start)}  "
        f"(rates per second, {window})",
        "sources: " + ", ".join(current.get("sources", [])) + _health(now),
        "",
        f"{'FUSE op':<14}{'ops/s':>10}{'errors/s':>10}{'p50 ms':>10}{'p99 ms':>10}",
    ]
    for op in label_values(now, "pffs_fuse_operations_total", "op"):
        ops = rate("pffs_fuse_operations_total", op=op)
        count, _, buckets = _histogram_delta(now, before, "pffs_fuse_operation_seconds", op=op)
        if ops == 0 and count == 0:
            continue
        lines.append(
            f"  {op:<12}{ops:>10.1f}{rate('pffs_fuse_errors_total', op=op):>10.1f}"
            f"{_ms(quantile(buckets, 0.5)):>10}{_ms(quantile(buckets, 0.99)):>10}"
        )

    served = {t: rate("pffs_cache_served_bytes_total", tier=t) for t in ("memory", "disk", "store")}
    all_served = sum(served.values())
    cumulative = {
        t: total(now, "pffs_cache_served_bytes_total", tier=t) for t in ("memory", "disk", "store")
    }
    lines += [
        "",
        f"{'cache tier':<14}{'hits/s':>10}{'misses/s':>10}{'MB/s':>10}{'share':>10}",
    ]
    for tier in ("memory", "disk"):
        lines.append(
            f"  {tier:<12}{rate('pffs_cache_hits_total', tier=tier):>10.1f}"
            f"{rate('pffs_cache_misses_total', tier=tier):>10.1f}"
            f"{served[tier] / MB:>10.1f}{_ratio(served[tier], all_served):>10}"
        )
    lines.append(
        f"  {'store':<12}{'':>10}{'':>10}{served['store'] / MB:>10.1f}"
        f"{_ratio(served['store'], all_served):>10}"
    )
    lines.append(
        f"  hit ratio (bytes): {_ratio(served['memory'] + served['disk'], all_served)} now, "
        f"{_ratio(cumulative['memory'] + cumulative['disk'], sum(cumulative.values()))} overall;"
        f" evictions/s {rate('pffs_cache_evictions_total'):.1f}"
    )
    lines.append(
        f"  readahead/s: issued {rate('pffs_readahead_issued_total'):.1f}  "
        f"used {rate('pffs_readahead_used_total'):.1f}  "
        f"wasted {rate('pffs_readahead_wasted_total'):.1f}  "
        f"skipped {rate('pffs_readahead_skipped_total'):.1f}"
    )
    lines.append(
        f"  preload: files/s {rate('pffs_preload_files_fetched_total'):.1f}  "
        f"{rate('pffs_preload_files_fetched_bytes_total') / MB:.1f} MB/s  "
        f"in flight {total(now, 'pffs_preload_files_in_flight'):.0f}  "
        f"used {total(now, 'pffs_preload_files_used_total'):.0f}  "
        f"wasted {total(now, 'pffs_preload_files_wasted_total'):.0f}  "
        f"failed {total(now, 'pffs_preload_files_failed_total'):.0f}"
    )
    lines += dataset_lines(now)
    lines += pace_lines(now)

    lines += [
        "",
        f"{'store request':<14}{'req/s':>10}{'errors/s':>10}{'retries/s':>10}{'MB/s':>10}"
        f"{'p50 ms':>10}{'p99 ms':>10}",
    ]
    for request in label_values(now, "pffs_backend_requests_total", "request"):
        requests = rate("pffs_backend_requests_total", request=request)
        count, _, buckets = _histogram_delta(
            now, before, "pffs_backend_request_seconds", request=request
        )
        if requests == 0 and count == 0:
            continue
        lines.append(
            f"  {request:<12}{requests:>10.1f}"
            f"{rate('pffs_backend_errors_total', request=request):>10.1f}"
            f"{rate('pffs_backend_retries_total', request=request):>10.1f}"
            f"{rate('pffs_backend_received_bytes_total', request=request) / MB:>10.1f}"
            f"{_ms(quantile(buckets, 0.5)):>10}{_ms(quantile(buckets, 0.99)):>10}"
        )
    lines.append(
        f"  store throughput {rate('pffs_backend_received_bytes_total') / MB:.1f} MB/s in, "
        f"{rate('pffs_uploaded_bytes_total') / MB:.1f} MB/s uploaded; "
        f"slow requests {total(now, 'pffs_backend_slow_requests_total'):.0f}"
    )

    lines += group_lines(now, rate)

    memory_used = total(now, "pffs_cache_memory_used_bytes")
    memory_cap = total(now, "pffs_cache_memory_capacity_bytes")
    lines += [
        "",
        f"writes: staged {rate('pffs_staged_bytes_total') / MB:.1f} MB/s, "
        f"uploads/s {rate('pffs_uploads_total'):.1f}, "
        f"failed uploads {total(now, 'pffs_upload_failures_total'):.0f}",
        f"open files {total(now, 'pffs_open_files'):.0f}, "
        f"staged files {total(now, 'pffs_staged_files'):.0f}, "
        f"memory tier {memory_used / MB:.0f}/{memory_cap / MB:.0f} MB, "
        f"process RSS {total(now, 'pffs_process_resident_memory_bytes') / MB:.0f} MB",
    ]
    return "\n".join(lines) + "\n"
