"""The node publisher (csi/affinity/publisher.py): a real disk cache, labels on a Node.

The Node lives in tests/csi/kube_apiserver.py, a local stand-in for the Kubernetes API server
(none can run on this machine), spoken to over real HTTP.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pffs.cache.disk import DiskTier, entry_key
from pffs.cache.keys import BlockKey
from pffs.csi.affinity.labels import CACHE_ANNOTATION, dataset_id, decode_annotation, label_key
from pffs.csi.affinity.publisher import NodeCachePublisher
from pffs.kube import KubeClient
from tests.csi.kube_apiserver import FakeApiServer
from tests.waiting import eventually

BLOCK = 64 * 1024


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        server.add_node("node-1", {"zone": "a"}, {"other": "kept"})
        yield server


@pytest.fixture
def dataset(tmp_path: Path) -> tuple[str, Path]:
    """A local source of 4 files of 2 blocks each (8 blocks)."""
    root = tmp_path / "imagenet-mini"
    root.mkdir()
    for i in range(4):
        (root / f"f{i}").write_bytes(os.urandom(2 * BLOCK))
    return dataset_id({"source": f"file://{root}"}), root


def _cache(path: Path, source: str, blocks: int, start: int = 0) -> DiskTier:
    tier = DiskTier(str(path), capacity=1 << 30, free_ratio=0.0, compress=False)
    for i in range(start, start + blocks):
        tier.put(
            entry_key(BlockKey(source, "u", f"f{i // 2}", "v", i % 2), BLOCK),
            os.urandom(BLOCK),
            source,
        )
    return tier


def _labels(api: FakeApiServer) -> dict[str, str]:
    return dict(api.nodes["node-1"]["metadata"]["labels"])


def _published(api: FakeApiServer) -> dict:  # type: ignore[type-arg]
    return decode_annotation(api.nodes["node-1"]["metadata"]["annotations"].get(CACHE_ANNOTATION))


def _wait_for_totals(publisher: NodeCachePublisher) -> None:
    eventually(publisher.totals.idle, 20, "the totals listed")


def test_publishes_labels_and_annotation_on_change_only(
    tmp_path: Path, api: FakeApiServer, dataset: tuple[str, Path]
) -> None:
    sid, _ = dataset
    cache_dir = tmp_path / "cache"
    tier = _cache(cache_dir, sid, 4)  # half of the dataset
    publisher = NodeCachePublisher(
        "node-1", str(cache_dir), KubeClient(api.url), block_size=BLOCK, resync=3600
    )
    publisher.summary()
    _wait_for_totals(publisher)  # the dataset is listed through its backend
    assert publisher.publish_once() is True
    assert _labels(api) == {
        "kubernetes.io/hostname": "node-1",
        "zone": "a",
        label_key(sid): "true",
    }
    [entry] = _published(api).values()
    assert (entry.source_id, entry.blocks, entry.total, entry.ratio) == (sid, 4, 8 * BLOCK, 0.5)
    assert api.nodes["node-1"]["metadata"]["annotations"]["other"] == "kept"

    patches = api.count("PATCH", "/api/v1/nodes/node-1")
    assert publisher.publish_once() is False  # nothing changed: no API call at all
    assert api.count("PATCH", "/api/v1/nodes/node-1") == patches

    _cache(cache_dir, sid, 4, start=4).close()  # warmup in another writer fills the rest
    assert publisher.publish_once() is True
    [entry] = _published(api).values()
    assert entry.ratio == 1.0

    tier.clear()  # `pffs cache clear`: the label goes away
    assert publisher.publish_once() is True
    assert _labels(api) == {"kubernetes.io/hostname": "node-1", "zone": "a"}
    assert _published(api) == {}
    tier.close()
    publisher.stop()


def test_small_changes_wait_for_the_resync(tmp_path: Path, api: FakeApiServer) -> None:
    cache_dir = tmp_path / "cache"
    _cache(cache_dir, "s3://b/huge", 100).close()  # no total known: compared by bytes
    publisher = NodeCachePublisher(
        "node-1", str(cache_dir), KubeClient(api.url), list_totals=False, resync=3600
    )
    assert publisher.publish_once() is True
    _cache(cache_dir, "s3://b/huge", 1, start=100).close()  # +1%: below min_change
    assert publisher.publish_once() is False
    assert publisher.publish_once(force=True) is True  # a resync sends the exact figures
    [entry] = _published(api).values()
    assert entry.blocks == 101
    publisher.stop()


def test_stale_labels_from_an_earlier_run_are_removed(
    tmp_path: Path, api: FakeApiServer, dataset: tuple[str, Path]
) -> None:
    sid, _ = dataset
    api.nodes["node-1"]["metadata"]["labels"][label_key("s3://gone/dataset")] = "true"
    cache_dir = tmp_path / "cache"
    _cache(cache_dir, sid, 2).close()
    publisher = NodeCachePublisher("node-1", str(cache_dir), KubeClient(api.url), block_size=BLOCK)
    publisher.publish_once()
    assert label_key("s3://gone/dataset") not in _labels(api)
    assert label_key(sid) in _labels(api)
    publisher.stop()


def test_the_thread_publishes_and_survives_api_failures(
    tmp_path: Path, api: FakeApiServer, dataset: tuple[str, Path]
) -> None:
    sid, _ = dataset
    cache_dir = tmp_path / "cache"
    publisher = NodeCachePublisher(
        "node-1", str(cache_dir), KubeClient(api.url), interval=0.05, block_size=BLOCK
    )
    api.fail_with = 503
    publisher.start()  # no cache directory yet, and the API fails: it keeps trying
    time.sleep(0.3)
    assert publisher.patches == 0
    api.fail_with = None
    tier = _cache(cache_dir, sid, 8)

    def whole() -> bool:
        published = _published(api)
        return sid in published and published[sid].ratio == 1.0

    eventually(whole, 20, f"{sid} published whole")
    assert label_key(sid) in _labels(api)
    publisher.stop()
    assert publisher._thread is not None and not publisher._thread.is_alive()
    tier.close()
