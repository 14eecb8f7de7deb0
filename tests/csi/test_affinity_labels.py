"""Dataset identity, node labels and the cache annotation (csi/affinity/labels.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pffs.backends import open_backend
from pffs.config import SourceConfig
from pffs.csi.affinity.labels import (
    CACHE_ANNOTATION,
    DatasetCache,
    VolumeAttributesError,
    dataset_id,
    dataset_name,
    decode_annotation,
    encode_annotation,
    is_valid_label_key,
    is_valid_label_value,
    label_key,
    node_cache,
    node_labels,
    source_url_of,
)
from pffs.errors import UsageError


@pytest.mark.parametrize(
    ("url", "endpoint"),
    [
        ("s3://bucket", None),
        ("s3://bucket/", None),
        ("s3://my-datasets/imagenet/train", None),
        ("s3://my-datasets/imagenet/train/", "http://minio.storage:9000"),
        ("s3://b.with.dots/a/b/c", "https://s3.example.com"),
    ],
)
def test_dataset_id_is_the_s3_backends_source_id(
    url: str, endpoint: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    backend = open_backend(SourceConfig(url=url, endpoint_url=endpoint))
    attributes = {"source": url, "region": "eu-west-1"}
    if endpoint:
        attributes["endpoint"] = endpoint
    assert dataset_id(attributes) == backend.source_id
    assert source_url_of(backend.source_id) == (url.rstrip("/"), endpoint)


def test_dataset_id_default_endpoint_plays_aws_endpoint_url(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://10.0.0.5:9000")
    backend = open_backend(SourceConfig(url="s3://bkt/data"))
    assert dataset_id({"source": "s3://bkt/data"}, "http://10.0.0.5:9000") == backend.source_id
    # A volume's own endpoint wins over the default, as in the mount.
    own = open_backend(SourceConfig(url="s3://bkt/data", endpoint_url="http://other:9000"))
    attrs = {"source": "s3://bkt/data", "endpoint": "http://other:9000"}
    assert dataset_id(attrs, "http://10.0.0.5:9000") == own.source_id


def test_dataset_id_of_a_local_source_resolves_like_the_backend(tmp_path: Path) -> None:
    real = tmp_path / "data"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    for url in (f"file://{real}", f"file://{tmp_path}/link/", f"file://localhost{real}"):
        assert dataset_id({"source": url}) == open_backend(SourceConfig(url=url)).source_id


@pytest.mark.parametrize(
    "attributes", [{}, {"source": ""}, {"source": "s3://"}, {"source": "ftp://x/y"}]
)
def test_dataset_id_rejects_volumes_without_a_usable_source(attributes: dict[str, str]) -> None:
    with pytest.raises(UsageError, match=r"source|URL|scheme"):
        dataset_id(attributes)
    with pytest.raises(VolumeAttributesError):
        dataset_id({"source": "file://host/relative"})


def test_label_keys_are_readable_and_distinct() -> None:
    a = label_key("s3://my-datasets/imagenet/train")
    b = label_key("s3://my-datasets/imagenet/train@http://minio:9000")
    assert a.startswith("data.pffs.io/my-datasets.imagenet.train-")
    assert b.startswith("data.pffs.io/my-datasets.imagenet.train-")
    assert a != b  # the hash tells the endpoints apart
    assert dataset_name("file:///srv/Data Sets/COCO 2017") == "srv.data-sets.coco-2017"


def test_long_dataset_names_keep_their_specific_tail() -> None:
    sid = "s3://bucket/" + "/".join(["very-long-directory-name"] * 10) + "/shard-0042"
    key = label_key(sid)
    name = key.split("/", 1)[1]
    assert len(name) == 63
    assert is_valid_label_key(key)
    assert "shard-0042-" in name


_SOURCE_IDS = st.one_of(
    st.builds(
        lambda bucket, parts, endpoint: (
            f"s3://{bucket}/{'/'.join(parts)}".rstrip("/") + (f"@{endpoint}" if endpoint else "")
        ),
        st.from_regex(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]", fullmatch=True),
        st.lists(st.text(min_size=1, max_size=80).filter(lambda t: "/" not in t), max_size=6),
        st.one_of(st.none(), st.just("http://minio:9000"), st.just("https://[::1]:443")),
    ),
    st.builds(lambda p: "file:///" + p, st.text(max_size=300)),
)


@given(_SOURCE_IDS)
@settings(max_examples=300, deadline=None)
def test_every_source_gets_a_valid_label(source_id: str) -> None:
    key = label_key(source_id)
    assert is_valid_label_key(key), key
    assert label_key(source_id) == key  # stable


@given(
    st.dictionaries(
        _SOURCE_IDS,
        st.tuples(
            st.integers(0, 1 << 50),
            st.integers(0, 1 << 30),
            st.one_of(st.none(), st.integers(1, 1 << 52)),
            st.one_of(st.none(), st.floats(0, 1)),
        ),
        max_size=5,
    )
)
@settings(max_examples=200, deadline=None)
def test_annotation_round_trip(raw: dict[str, tuple[int, int, int | None, float | None]]) -> None:
    datasets = {sid: DatasetCache(sid, b, n, t, r) for sid, (b, n, t, r) in raw.items()}
    text = encode_annotation(datasets)
    back = decode_annotation(text)
    assert back.keys() == datasets.keys()
    for sid, d in datasets.items():
        got = back[sid]
        assert (got.bytes, got.blocks, got.total) == (d.bytes, d.blocks, d.total)
        if d.ratio is None:
            assert got.ratio is None
        else:
            assert got.ratio == pytest.approx(d.ratio, abs=1e-4)
    node = {"metadata": {"annotations": {CACHE_ANNOTATION: text}}}
    assert node_cache(node) == back
    for key, value in node_labels(datasets).items():
        assert is_valid_label_key(key) and is_valid_label_value(value)
    assert encode_annotation(back) == encode_annotation(decode_annotation(encode_annotation(back)))


def test_annotation_lists_label_of_each_dataset() -> None:
    sid = "s3://b/x"
    doc = json.loads(encode_annotation({sid: DatasetCache(sid, 10, 1, 100, 0.1)}))
    assert doc["v"] == 1
    assert doc["datasets"][sid]["label"] == label_key(sid)


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"datasets": []}',
        '{"datasets": {"s3://b/x": 5}}',
        '{"datasets": {"s3://b/x": {"bytes": "many", "blocks": 1}}}',
        '{"datasets": {"s3://b/x": {"bytes": true, "blocks": 1}}}',
    ],
)
def test_malformed_annotations_read_as_empty(text: str) -> None:
    assert decode_annotation(text) == {}


def test_out_of_range_values_are_clamped() -> None:
    text = '{"datasets": {"s3://b/x": {"bytes": -5, "blocks": 2, "total": 1e400, "ratio": 7}}}'
    [entry] = decode_annotation(text).values()
    assert entry.bytes == 0 and entry.total is None and entry.ratio == 1.0


@pytest.mark.parametrize(
    ("key", "valid"),
    [
        ("data.pffs.io/x", True),
        ("x", True),
        ("data.pffs.io/" + "a" * 63, True),
        ("data.pffs.io/" + "a" * 64, False),
        ("data.pffs.io/-a", False),
        ("data.pffs.io/a-", False),
        ("Data.pffs.io/a", False),
        ("data.pffs.io/", False),
        ("data..pffs.io/a", False),
    ],
)
def test_label_key_rules(key: str, valid: bool) -> None:
    assert is_valid_label_key(key) is valid
