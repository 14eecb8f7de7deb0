"""The node side of data affinity: publish what this node's cache holds on its Node object.

Entry point for the CSI node plugin (one per node, in a background thread)::

    from pffs.csi.affinity.publisher import NodeCachePublisher
    from pffs.kube import KubeClient

    publisher = NodeCachePublisher(node_name, "/var/cache/pffs", KubeClient.in_cluster())
    publisher.start()          # daemon thread; returns at once
    ...
    publisher.stop()           # on shutdown

Every `interval` seconds it reads the per-source usage of the cache directory (one small SQLite
query, see inventory.py) and the sources' total sizes. When the summary changed in a way the
scheduler can see (a dataset appeared or vanished, or its cached ratio moved by `min_change`),
or every `resync` seconds regardless, it GETs its Node and sends a JSON merge patch with the
differences: a `data.pffs.io/<name>=true` label per cached dataset (stale ones removed) and the
`pffs.io/cache` annotation (labels.py). API failures are logged and retried at the next tick;
they never stop the thread. RBAC: `get` and `patch` on nodes (the node name comes from the
downward API, spec.nodeName).

Cached ratios count blocks: pass `block_size` equal to the volumes' cache block size (the
default, 4 MiB, is CacheConfig's). Sources are listed for their totals with this process's
credentials (boto3's default chain); where that fails the ratio is published as null and the
extender falls back to comparing cached bytes between nodes.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from pffs.csi.affinity.inventory import DEFAULT_BLOCK_SIZE, CacheInventory, SourceTotals, summarize
from pffs.csi.affinity.labels import (
    CACHE_ANNOTATION,
    DatasetCache,
    encode_annotation,
    is_pffs_label,
    node_labels,
)
from pffs.kube import KubeClient, KubeError

log = logging.getLogger("pffs.csi.publisher")


class NodeCachePublisher:
    def __init__(
        self,
        node_name: str,
        cache_dir: str,
        api: KubeClient,
        interval: float = 10.0,
        *,
        resync: float = 300.0,
        min_change: float = 0.05,
        max_datasets: int = 100,
        block_size: int = DEFAULT_BLOCK_SIZE,
        list_totals: bool = True,
        totals: SourceTotals | None = None,
    ) -> None:
        self.node_name = node_name
        self.api = api
        self.interval = interval
        self.resync = resync
        # Scores move in steps of 0.1 of a dataset: smaller changes are not worth an API write.
        self.min_change = min_change
        # The annotation stays small (Node objects are read by every scheduler and kubelet).
        self.max_datasets = max_datasets
        self.list_totals = list_totals
        self.inventory = CacheInventory(cache_dir)
        self.totals = totals or SourceTotals(cache_dir, block_size=block_size)
        self._published: dict[str, DatasetCache] | None = None
        self._synced_at = float("-inf")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.patches = 0  # patches sent, for tests and logs

    # --- one round ---------------------------------------------------------------------------

    def summary(self) -> dict[str, DatasetCache]:
        """What the cache holds now: the `max_datasets` largest sources."""
        usage = self.inventory.usage()
        known = self.totals.load()
        if self.list_totals:
            self.totals.request(list(usage), known)
        datasets = summarize(usage, known)
        biggest = sorted(datasets.values(), key=lambda d: d.bytes, reverse=True)
        return {d.source_id: d for d in biggest[: self.max_datasets]}

    def _changed(self, now: dict[str, DatasetCache]) -> bool:
        before = self._published
        if before is None or before.keys() != now.keys():
            return True
        for sid, d in now.items():
            old = before[sid]
            if (old.ratio is None) != (d.ratio is None) or old.total != d.total:
                return True
            if d.ratio is not None and old.ratio is not None:
                if abs(d.ratio - old.ratio) >= self.min_change:
                    return True
            elif abs(d.bytes - old.bytes) >= self.min_change * max(old.bytes, 1):
                return True
        return False

    def publish_once(self, force: bool = False) -> bool:
        """Patch the Node if the summary changed (or `force`, or a resync is due); True if sent."""
        datasets = self.summary()
        due = time.monotonic() - self._synced_at >= self.resync
        if not (force or due or self._changed(datasets)):
            return False
        node = self.api.get_node(self.node_name)
        if node is None:
            raise KubeError(f"node {self.node_name} does not exist", 404)
        patch = node_patch(node, datasets)
        sent = False
        if patch:
            self.api.patch_node(self.node_name, patch)
            self.patches += 1
            sent = True
            log.info("published %d cached datasets on node %s", len(datasets), self.node_name)
        self._published = datasets
        self._synced_at = time.monotonic()
        return sent

    # --- the thread --------------------------------------------------------------------------

    def start(self) -> threading.Thread:
        """Run in a daemon thread until `stop()`; the first round happens at once."""
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, name="pffs-cache-publisher", daemon=True)
        self._thread.start()
        return self._thread

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                self.publish_once()
            except KubeError as exc:
                log.warning("cannot publish the cache summary on %s: %s", self.node_name, exc)
            except Exception:  # a damaged database must not end the node plugin's thread
                log.exception("cache summary of %s failed", self.node_name)
            self._stop.wait(self.interval)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.totals.close()
        self.inventory.close()


def node_patch(node: dict[str, Any], datasets: dict[str, DatasetCache]) -> dict[str, Any]:
    """The merge patch taking `node` to these datasets' labels and annotation ({} if none)."""
    metadata = node.get("metadata") or {}
    labels: dict[str, str] = metadata.get("labels") or {}
    annotations: dict[str, str] = metadata.get("annotations") or {}
    wanted = node_labels(datasets)
    label_patch: dict[str, str | None] = {
        key: None for key in labels if is_pffs_label(key) and key not in wanted
    }
    label_patch.update({k: v for k, v in wanted.items() if labels.get(k) != v})
    annotation = encode_annotation(datasets)
    meta_patch: dict[str, Any] = {}
    if label_patch:
        meta_patch["labels"] = label_patch
    if annotations.get(CACHE_ANNOTATION) != annotation:
        meta_patch["annotations"] = {CACHE_ANNOTATION: annotation}
    return {"metadata": meta_patch} if meta_patch else {}
