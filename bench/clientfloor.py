"""What the store alone allows each clients pattern: its floor time beside issue 50's target.

A pattern must fetch some bytes from the store whatever system serves it: what its client
read (a projection's footers and column chunks, a lazy load's header and tensors, a whole
file for a scan), or for the Arrow batches the whole file, which pyarrow has every system
read (`bench.clients.must_fetch_bytes`). The fastest the store sends them is its ceiling at
that latency, measured in the same run by curl's parallel ranged GETs (bench.scenarios
`server_ceiling`; `clients_server_mbs` over a file of the clients' own size when the run has
one, else `server_mbs`). Bytes over the ceiling is the floor: no system reads the pattern
faster on this server. The target is the best peer's time times TARGET_SHARE (0.77 when the
store is far, 1.3x faster; 1.0 at 0 ms). Where the target is below the floor, the table says
so: no system could meet it here, and the gap is the store's, not the reader's.

The ceiling is 8 GETs at once; a system running more may pass it on a store that scales
with connections, so a floor is the store's at that parallelism, not an absolute bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.clients import PATTERNS, seconds_key

# The share of the best peer's time each pattern's target is (issue 50): 1.3x faster with
# the store far, level with it at 0 ms.
TARGET_SHARE_FAR = 0.77
TARGET_SHARE_NEAR = 1.0
LABELS = {
    "parquet_columns": "Parquet: 2 of 20 columns",
    "parquet_scan": "Parquet: files read whole",
    "safetensors_lazy": "safetensors: 6 tensors (mmap)",
    "safetensors_full": "safetensors: every tensor",
    "arrow_batches": "Arrow by mmap: random batches",
    "tar": "tar shards through tarfile",
}


@dataclass(frozen=True)
class Floor:
    """One pattern at one server and latency."""

    pattern: str
    pffs_s: float | None
    best_peer: str | None  # the peer with the shortest time
    best_peer_s: float | None
    floor_s: float | None
    target_s: float | None

    @property
    def reachable(self) -> bool | None:
        """Whether the store allows the target (None when a figure is missing)."""
        if self.floor_s is None or self.target_s is None:
            return None
        return self.floor_s <= self.target_s

    @property
    def met(self) -> bool | None:
        """Whether pffs met the target."""
        if self.pffs_s is None or self.target_s is None:
            return None
        return self.pffs_s <= self.target_s


def target_share(latency_ms: float) -> float:
    return TARGET_SHARE_FAR if latency_ms > 0 else TARGET_SHARE_NEAR


def floor_seconds(must_fetch_bytes: int, ceiling_mbs: float) -> float | None:
    """The bytes over the store's ceiling (MB/s, 1e6 bytes); None without a ceiling."""
    if ceiling_mbs <= 0:
        return None
    return must_fetch_bytes / (ceiling_mbs * 1e6)


def ceiling_of(server: dict[str, Any]) -> float | None:
    """The ceiling a floor divides by: over the clients' own file size when measured."""
    ceilings = server.get("ceilings", {})
    for key in ("clients_server_mbs", "server_mbs"):
        value = ceilings.get(key)
        if isinstance(value, int | float) and value > 0:
            return float(value)
    return None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and value > 0 else None


def floors(server: dict[str, Any]) -> list[Floor]:
    """Each clients pattern of a summarized server entry (bench.report.summarize) that has
    the bytes it must fetch; none for a run without the clients scenario."""
    must_fetch: dict[str, int] = server.get("clients_must_fetch_bytes") or {}
    ceiling = ceiling_of(server)
    share = target_share(float(server.get("latency_ms", 0)))
    medians: dict[str, dict[str, Any]] = server.get("medians", {})
    out = []
    for pattern in PATTERNS:
        key = seconds_key(pattern)
        mine = _number(medians.get("pffs", {}).get(key))
        peers = {
            system: seconds
            for system, figures in medians.items()
            if system != "pffs" and (seconds := _number(figures.get(key))) is not None
        }
        if pattern not in must_fetch or (mine is None and not peers):
            continue
        best = min(peers, key=lambda system: peers[system]) if peers else None
        best_s = peers[best] if best is not None else None
        out.append(
            Floor(
                pattern=pattern,
                pffs_s=mine,
                best_peer=best,
                best_peer_s=best_s,
                floor_s=floor_seconds(must_fetch[pattern], ceiling) if ceiling else None,
                target_s=best_s * share if best_s is not None else None,
            )
        )
    return out


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def verdict(floor: Floor) -> str:
    """The reachable column: "yes", or why not ("floor 2.10 s > target 1.80 s")."""
    if floor.reachable is None:
        return "-"
    if floor.reachable:
        return "yes"
    return f"no: floor {_s(floor.floor_s)} s > target {_s(floor.target_s)} s"


def floor_table(server: dict[str, Any]) -> str:
    """The clients patterns against the store's floor, in Markdown; "" without them."""
    rows = floors(server)
    if not rows:
        return ""
    share = target_share(float(server.get("latency_ms", 0)))
    ceiling = ceiling_of(server)
    lines = [
        f"Clients against the store's floor (bytes each must fetch over the server's ceiling, "
        f"{_s(ceiling)} MB/s; the target is the best peer's time x {share:g}):\n",
        "| pattern | pffs s | best peer s | pffs / best | floor s | target s "
        "| target reachable | pffs meets it |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ratio = (
            f"{row.best_peer_s / row.pffs_s:.2f}x"
            if row.pffs_s is not None and row.best_peer_s is not None
            else "-"
        )
        peer = f"{_s(row.best_peer_s)} ({row.best_peer})" if row.best_peer else "-"
        met = "-" if row.met is None else ("yes" if row.met else "no")
        cells = [LABELS[row.pattern], _s(row.pffs_s), peer, ratio, _s(row.floor_s)]
        cells += [_s(row.target_s), verdict(row), met]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
