"""The group's metrics (in `.pffs/stats`, `pffs stats` and the Prometheus endpoint).

Bytes from the store are the store's own counter (`pffs_backend_received_bytes_total`), so a
block fetched by an owner for its peers counts once, where it was fetched.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from pffs.metrics import REGISTRY

MEMBERS = Gauge(
    "pffs_group_members", "Members of the cache group this mount is in", registry=REGISTRY
)
MEMBER_UP = Gauge(
    "pffs_group_member_up",
    "1 while a peer of the group answers, 0 while it is broken (its blocks from the store)",
    ["member"],
    registry=REGISTRY,
)
PEER_BYTES = Counter(
    "pffs_group_peer_bytes",
    "Block bytes moved between members: way=received (from peers) or served (to peers)",
    ["way"],
    registry=REGISTRY,
)
REFUSALS = Counter(
    "pffs_group_refusals",
    "Peer requests this member refused, by reason (unsigned, bad signature, foreign source...)",
    ["reason"],
    registry=REGISTRY,
)
FALLBACKS = Counter(
    "pffs_group_fallbacks",
    "Blocks a peer was asked for and the store then served, by reason",
    ["reason"],
    registry=REGISTRY,
)
