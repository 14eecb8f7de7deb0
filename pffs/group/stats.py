"""The group's metrics (in `.pffs/stats`, `pffs stats` and the Prometheus endpoint).

Bytes from the store are the store's own counter (`pffs_backend_received_bytes_total`), so a
block fetched by an owner for its peers counts once, where it was fetched.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

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
CONNECTION_ERRORS = Counter(
    "pffs_group_connection_errors",
    "Peer connections this member's server closed for an error or a cap (each ends only its "
    "own connection), by kind",
    ["kind"],
    registry=REGISTRY,
)
UNAUTHENTICATED_REPLIES = Counter(
    "pffs_group_unauthenticated_replies",
    "Peer replies refused because their tag did not match (not from a member holding the "
    "group's secret): the block came from the store",
    registry=REGISTRY,
)
FALLBACKS = Counter(
    "pffs_group_fallbacks",
    "Blocks a peer or the shared tier was asked for and the store then served, by reason",
    ["reason"],
    registry=REGISTRY,
)
# The shared tier's origin fetches, each block asked of the tier once: `claimed` is the one
# expected per block; every other reason is a fetch the tier's single flight did not save.
TIER_ORIGIN = Counter(
    "pffs_group_tier_origin",
    "Blocks the shared tier was asked for and the origin then served, by reason",
    ["reason"],
    registry=REGISTRY,
)
TIER_WRITES = Counter(
    "pffs_group_tier_writes",
    "Blocks the origin served handed to the shared tier: written, dropped (too many pending) "
    "or failed",
    ["outcome"],
    registry=REGISTRY,
)
# Seconds, from a poll's pause to the longest wait for a claimed block (claims.WAIT) and past it.
WAIT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
CLAIMS = Counter(
    "pffs_group_claims",
    "Claims of missed blocks in the shared tier, by outcome",
    ["outcome"],
    registry=REGISTRY,
)
TIER_WAITS = Histogram(
    "pffs_group_tier_wait_seconds",
    "How long a mount waited for a block another mount claimed in the shared tier",
    buckets=WAIT_BUCKETS,
    registry=REGISTRY,
)
TIER_POLLS = Counter(
    "pffs_group_tier_polls",
    "Looks in the shared tier for a block another mount claimed",
    registry=REGISTRY,
)
CLAIM_LIVES = Histogram(
    "pffs_group_claim_seconds",
    "From a claim won in the shared tier to its block written there (what its waiters wait for)",
    buckets=WAIT_BUCKETS,
    registry=REGISTRY,
)
