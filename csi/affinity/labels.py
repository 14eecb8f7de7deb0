"""Names shared by the node publisher, the scheduler extender and `pffs affinity`.

A dataset's identity is the cache tag of its blocks: the backend's `source_id`
(`s3://bucket/prefix`, plus `@endpoint` when an endpoint is set; `file:///dir`). `dataset_id`
derives it from a pffs volume's CSI attributes exactly as the backends do, so the extender can
match a pod's volumes against what the nodes' disk caches hold.

On the Node object (written by publisher.py):
- one label per cached dataset, `data.pffs.io/<name>=true`, where `<name>` is a readable slug of
  the source (at most 52 characters, the most specific part kept) plus `-` and 10 hex digits of
  a hash of the full source id, so it is unique and always valid under the 63-character rule;
- the annotation `pffs.io/cache`, compact JSON: `{"v": 1, "datasets": {source_id: {"label",
  "bytes", "blocks", "total", "ratio"}}}` with the bytes and blocks on disk, the source's total
  size (null when unknown) and the cached fraction (null when the total is unknown).

A pod asks for require mode with the annotation `pffs.io/data-affinity: required`
(`preferred` is the default, `none` switches the hints off for the pod).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from pffs.config import DNS_LABEL, SourceConfig
from pffs.errors import UsageError

log = logging.getLogger("pffs.csi.labels")

DRIVER_NAME = "csi.pffs.io"
LABEL_PREFIX = "data.pffs.io"
CACHE_ANNOTATION = "pffs.io/cache"
MODE_ANNOTATION = "pffs.io/data-affinity"
ANNOTATION_VERSION = 1
# The label value: presence is what node affinity matches on (operator Exists or In [true]).
LABEL_VALUE = "true"

_NAME_MAX = 63
_HASH_HEX = 10  # 40 bits: collisions among one cluster's datasets are not a practical concern
_SLUG_MAX = _NAME_MAX - _HASH_HEX - 1
_NAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.\-]*[A-Za-z0-9])?$")


class VolumeAttributesError(UsageError):
    """A pffs volume's attributes do not name a usable source."""


def dataset_id(attributes: Mapping[str, str], default_endpoint: str | None = None) -> str:
    """The source id of a pffs volume, from its CSI volume attributes (`source`, `endpoint`).

    Equals the `source_id` of the backend `pffs mount` builds for the same URL and endpoint.
    `default_endpoint` plays the part of AWS_ENDPOINT_URL in the mounting process, for S3
    volumes that name no endpoint of their own.
    """
    source = (attributes.get("source") or "").strip()
    if not source:
        raise VolumeAttributesError("the volume has no 'source' attribute")
    endpoint = attributes.get("endpoint") or default_endpoint or None
    return source_id_of(source, endpoint)


def source_id_of(url: str, endpoint: str | None = None) -> str:
    """The backend's `source_id` for a source URL, without building a backend when it can."""
    scheme = urlsplit(url).scheme.lower()
    if scheme == "s3":
        from pffs.backends.s3 import parse_s3_url

        bucket, prefix = parse_s3_url(url)
        ident = f"s3://{bucket}/{prefix}".rstrip("/")
        return f"{ident}@{endpoint}" if endpoint else ident
    if scheme == "file":
        parts = urlsplit(url)
        path = unquote(parts.path)
        if parts.netloc not in ("", "localhost") or not path.startswith("/"):
            raise VolumeAttributesError(f"malformed URL {url!r}: use file:///absolute/path")
        return f"file://{os.path.realpath(path)}"
    # Any other store: ask its backend (no network traffic; see pffs.backends.open_backend).
    from pffs.backends import open_backend

    return open_backend(SourceConfig(url=url, endpoint_url=endpoint)).source_id


def source_url_of(source_id: str) -> tuple[str, str | None]:
    """(URL, endpoint) back from a source id, to list the source through its backend."""
    for marker in ("@http://", "@https://"):
        head, sep, tail = source_id.rpartition(marker)
        if sep:
            return head, marker[1:] + tail
    return source_id, None


def dataset_name(source_id: str) -> str:
    """A short readable name: bucket and prefix (or path) joined by dots, tail kept if long."""
    url, _ = source_url_of(source_id)
    parts = urlsplit(url)
    words = [w for w in (parts.netloc + "/" + parts.path).split("/") if w]
    slug = ".".join(words).lower()
    slug = re.sub(r"[^a-z0-9._\-]+", "-", slug)
    if len(slug) > _SLUG_MAX:
        slug = slug[-_SLUG_MAX:]
    slug = slug.strip("._-")
    return slug or "dataset"


def _hash(source_id: str) -> str:
    return hashlib.blake2b(source_id.encode(), digest_size=8).hexdigest()[:_HASH_HEX]


def label_key(source_id: str) -> str:
    """The node label saying "this node's cache holds `source_id`"."""
    return f"{LABEL_PREFIX}/{dataset_name(source_id)}-{_hash(source_id)}"


def is_pffs_label(key: str) -> bool:
    return key.startswith(LABEL_PREFIX + "/")


def is_valid_label_key(key: str) -> bool:
    """The Kubernetes rules: optional DNS-subdomain prefix (<= 253) and a name of <= 63."""
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not all(DNS_LABEL.match(p) for p in prefix.split("."))):
        return False
    return 0 < len(name) <= _NAME_MAX and bool(_NAME_RE.match(name))


def is_valid_label_value(value: str) -> bool:
    return value == "" or (len(value) <= _NAME_MAX and bool(_NAME_RE.match(value)))


@dataclass(frozen=True)
class DatasetCache:
    """What one node's disk cache holds of one dataset."""

    source_id: str
    bytes: int  # on disk (lz4 may make this smaller than the data it holds)
    blocks: int
    total: int | None = None  # the source's size in bytes, when it has been measured
    ratio: float | None = None  # cached fraction of the source, when the total is known

    @property
    def cached_bytes(self) -> int:
        """Bytes of the dataset the node can serve locally: ratio x total, else bytes on disk."""
        if self.ratio is not None and self.total is not None:
            return int(self.ratio * self.total)
        return self.bytes


def encode_annotation(datasets: Mapping[str, DatasetCache]) -> str:
    """The `pffs.io/cache` annotation value (compact JSON, keys sorted so equal means equal)."""
    body: dict[str, Any] = {}
    for sid, d in datasets.items():
        body[sid] = {
            "label": label_key(sid),
            "bytes": d.bytes,
            "blocks": d.blocks,
            "total": d.total,
            "ratio": None if d.ratio is None else round(d.ratio, 4),
        }
    doc = {"v": ANNOTATION_VERSION, "datasets": body}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def _int(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return max(0, int(value))


def _fraction(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return min(1.0, max(0.0, float(value))) if math.isfinite(value) else None


def decode_annotation(text: str | None) -> dict[str, DatasetCache]:
    """The datasets of a `pffs.io/cache` annotation; malformed parts are skipped, never raised."""
    if not text:
        return {}
    try:
        doc = json.loads(text)
    except ValueError:
        log.warning("ignoring a malformed %s annotation", CACHE_ANNOTATION)
        return {}
    if not isinstance(doc, dict) or not isinstance(doc.get("datasets"), dict):
        return {}
    out: dict[str, DatasetCache] = {}
    for sid, entry in doc["datasets"].items():
        if not isinstance(entry, dict):
            continue
        size, blocks = _int(entry.get("bytes")), _int(entry.get("blocks"))
        if size is None or blocks is None:
            continue
        total = _int(entry.get("total"))
        ratio = _fraction(entry.get("ratio"))
        out[str(sid)] = DatasetCache(str(sid), size, blocks, total, ratio)
    return out


def node_cache(node: Mapping[str, Any]) -> dict[str, DatasetCache]:
    """What a Node object (a dict as the API serves it) says its cache holds."""
    metadata = node.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    return decode_annotation(annotations.get(CACHE_ANNOTATION))


def node_labels(datasets: Mapping[str, DatasetCache]) -> dict[str, str]:
    """The `data.pffs.io/...` labels a node with these cached datasets carries."""
    return {label_key(sid): LABEL_VALUE for sid, d in datasets.items() if d.blocks > 0}
