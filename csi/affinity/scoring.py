"""Scoring a pod against the nodes: which pffs datasets it reads, how much of them each caches.

Used by the scheduler extender (extender.py), by `pffs affinity` (manifest.py) and by the
simulation (bench/affinity.py), so all three score alike.

A pod's datasets come from its volumes: a PVC (also the PVC of a generic ephemeral volume,
named `<pod>-<volume>`) bound to a PV of driver csi.pffs.io, or an inline CSI volume of that
driver; the dataset is `dataset_id` of the CSI volume attributes. Lookups go through the API and
are remembered for a while (`VolumeResolver`).

Score of a node (0..10): the fraction of the pod's bytes its cache holds, rounded up, so that a
node holding any of the data beats one holding none. The pod's bytes are the datasets' total
sizes as the nodes report them; where no node knows a total, the most any node holds.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pffs.csi.affinity.labels import DRIVER_NAME, MODE_ANNOTATION, DatasetCache, dataset_id
from pffs.errors import PffsError
from pffs.kube import KubeClient, KubeError

log = logging.getLogger("pffs.csi.affinity")

MAX_SCORE = 10
PREFER, REQUIRE, OFF = "prefer", "require", "off"
_MODE_WORDS = {
    "preferred": PREFER,
    "prefer": PREFER,
    "required": REQUIRE,
    "require": REQUIRE,
    "none": OFF,
    "off": OFF,
    "false": OFF,
}

K = TypeVar("K")
V = TypeVar("V")


class LookupFailed(Exception):
    """The API could not tell what a pod's volumes are (unreachable, denied, ...)."""


def pod_mode(pod: Mapping[str, Any], default: str = PREFER) -> str:
    """prefer, require or off: the pod's `pffs.io/data-affinity` annotation, else `default`."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    word = str(annotations.get(MODE_ANNOTATION, "")).strip().lower()
    return _MODE_WORDS.get(word, default)


class TTLCache(Generic[K, V]):
    """A small thread-safe map whose entries expire (the extender serves requests in threads)."""

    def __init__(self, ttl: float, max_entries: int = 10_000) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._data: dict[K, tuple[float, V]] = {}
        self._lock = threading.Lock()

    def get(self, key: K) -> tuple[bool, V | None]:
        """(found, value) of an entry that has not expired."""
        with self._lock:
            hit = self._data.get(key)
            if hit is not None and hit[0] > time.monotonic():
                return True, hit[1]
        return False, None

    def put(self, key: K, value: V, ttl: float | None = None) -> None:
        now = time.monotonic()
        with self._lock:
            if len(self._data) >= self.max_entries:
                self._data = {k: v for k, v in self._data.items() if v[0] > now}
                if len(self._data) >= self.max_entries:
                    self._data.clear()
            self._data[key] = (now + (self.ttl if ttl is None else ttl), value)


def _csi_dataset(csi: Mapping[str, Any] | None) -> str | None:
    if not isinstance(csi, Mapping) or csi.get("driver") != DRIVER_NAME:
        return None
    attributes = csi.get("volumeAttributes") or {}
    if not isinstance(attributes, Mapping):
        return None
    try:
        return dataset_id({str(k): str(v) for k, v in attributes.items()})
    except PffsError as exc:
        log.warning("a %s volume without a usable source: %s", DRIVER_NAME, exc)
        return None


class VolumeResolver:
    """PVC -> PV -> dataset id through the API, remembered for `ttl` seconds.

    A bound PVC's PV never changes, so a found dataset is kept for `ttl`; "not (yet) bound" and
    "not pffs" answers only for `negative_ttl`, since a claim may be bound any moment.
    """

    def __init__(self, api: KubeClient | None, ttl: float = 300.0, negative_ttl: float = 5.0):
        self.api = api
        self.negative_ttl = negative_ttl
        self._claims: TTLCache[tuple[str, str], str | None] = TTLCache(ttl)

    def claim_dataset(self, namespace: str, claim: str) -> str | None:
        key = (namespace, claim)
        found, cached = self._claims.get(key)
        if found:
            return cached
        dataset = self._load_claim(namespace, claim)
        # A slow API call happens outside any lock; two requests may both load, which is fine.
        self._claims.put(key, dataset, None if dataset else self.negative_ttl)
        return dataset

    def _load_claim(self, namespace: str, claim: str) -> str | None:
        if self.api is None:
            raise LookupFailed(
                f"PVC {namespace}/{claim} needs the Kubernetes API (--api URL or in-cluster)"
            )
        try:
            pvc = self.api.get_pvc(namespace, claim)
            if pvc is None:
                return None
            volume = (pvc.get("spec") or {}).get("volumeName")
            if not volume:
                return None  # not bound yet: its data is nowhere
            pv = self.api.get_pv(str(volume))
        except KubeError as exc:
            raise LookupFailed(str(exc)) from None
        if pv is None:
            return None
        return _csi_dataset((pv.get("spec") or {}).get("csi"))

    def pod_datasets(self, pod: Mapping[str, Any]) -> list[str]:
        """The pod's pffs datasets, in volume order, without repeats."""
        metadata = pod.get("metadata") or {}
        namespace = str(metadata.get("namespace") or "default")
        volumes = (pod.get("spec") or {}).get("volumes") or []
        found: list[str] = []
        for volume in volumes if isinstance(volumes, list) else []:
            if not isinstance(volume, Mapping):
                continue
            dataset: str | None = None
            if isinstance(volume.get("persistentVolumeClaim"), Mapping):
                claim = volume["persistentVolumeClaim"].get("claimName")
                if claim:
                    dataset = self.claim_dataset(namespace, str(claim))
            elif isinstance(volume.get("csi"), Mapping):
                dataset = _csi_dataset(volume["csi"])
            elif isinstance(volume.get("ephemeral"), Mapping) and metadata.get("name"):
                # Generic ephemeral volumes: the PVC is named <pod>-<volume> and exists before
                # the pod is scheduled.
                dataset = self.claim_dataset(namespace, f"{metadata['name']}-{volume.get('name')}")
            if dataset and dataset not in found:
                found.append(dataset)
        return found


@dataclass(frozen=True)
class NodeScore:
    node: str
    score: int  # 0..MAX_SCORE
    cached_bytes: int  # of the pod's datasets
    wanted_bytes: int  # the pod's datasets in all


def score_nodes(
    datasets: Iterable[str], caches: Mapping[str, Mapping[str, DatasetCache]]
) -> dict[str, NodeScore]:
    """Score each node (name -> its cache) for a pod reading `datasets`."""
    wanted = list(dict.fromkeys(datasets))
    sizes: dict[str, int] = {}
    for sid in wanted:
        totals = [t for c in caches.values() if sid in c and (t := c[sid].total)]
        held = [c[sid].cached_bytes for c in caches.values() if sid in c]
        # A total a node measured wins; otherwise the best holder counts as complete.
        sizes[sid] = max(totals) if totals else max(held, default=0)
    need = sum(sizes.values())
    out: dict[str, NodeScore] = {}
    for node, cache in caches.items():
        cached = sum(min(cache[sid].cached_bytes, sizes[sid]) for sid in wanted if sid in cache)
        score = 0
        if need > 0 and cached > 0:
            score = min(MAX_SCORE, max(1, math.ceil(MAX_SCORE * cached / need - 1e-9)))
        out[node] = NodeScore(node, score, cached, need)
    return out


def holders(scores: Mapping[str, NodeScore]) -> list[str]:
    """The nodes that hold any of the pod's data."""
    return [n for n, s in scores.items() if s.cached_bytes > 0]
