"""One contract, every backend (tests/backends/stores.py): each is given the same tree and must
describe and read it the same way: stat, listings (one larger than a page of S3's), ranged reads,
version checks and, where declared, block runs; and bad sources fail the same way.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from pffs import metrics
from pffs.backends import open_backend
from pffs.backends.base import (
    Backend,
    ObjectInfo,
    block_runs,
    join,
    tree_lister,
)
from pffs.config import SourceConfig
from pffs.errors import Changed, NotFound, UsageError
from tests.backends.stores import TREE, declared


def test_check_passes(store) -> None:
    backend = store.backend
    backend.check()


def test_stat_files_dirs_and_root(store) -> None:
    backend = store.backend
    info = backend.stat("dir/b.bin")
    assert (info.name, info.size, info.is_dir) == ("b.bin", len(TREE["dir/b.bin"]), False)
    assert info.mtime > 0
    assert backend.stat("empty").size == 0
    for directory in ("", "dir", "dir/sub", "marker", "zeta/deep"):
        assert backend.stat(directory).is_dir, directory
    for missing in ("nope", "dir/nope", "dir/sub/c.txt/x", "outside.txt"):
        with pytest.raises(NotFound):
            backend.stat(missing)


def test_list_root_and_nested(store) -> None:
    backend = store.backend
    root = {i.name: i for i in backend.list("")}
    assert set(root) == {"a.txt", "empty", "dir", "marker", "zeta"}
    assert root["dir"].is_dir and root["marker"].is_dir and not root["a.txt"].is_dir
    assert root["a.txt"].size == len(TREE["a.txt"])
    nested = [(i.name, i.is_dir) for i in backend.list("dir")]
    assert sorted(nested) == [("b.bin", False), ("sub", True), ("z.txt", False)]
    assert list(backend.list("marker")) == []
    # The etag or mtime a listing reports is the one stat reports: one version, two views.
    assert root["a.txt"].version == backend.stat("a.txt").version


def test_names_with_characters_urls_encode(store) -> None:
    """A listing names what stat and reads name: spaces, plus signs, percent signs, & and ?,
    accents (S3 listings come URL-encoded and are decoded)."""
    backend = store.backend
    names = ["a b.txt", "1+1=2", "100%", "q?a&b=c", "café ü", "tilde~x", "semi;colon"]
    store.write({f"odd/{name}": name.encode() for name in names})
    listed = {info.name: info for info in backend.list("odd")}
    assert set(listed) == set(names)
    for name in names:
        assert listed[name].size == len(name.encode())
        assert backend.stat(f"odd/{name}").version == listed[name].version
        assert backend.read_range(f"odd/{name}", 0, 100, listed[name].version) == name.encode()


def test_read_ranges(store) -> None:
    backend = store.backend
    data = TREE["dir/b.bin"]
    version = backend.stat("dir/b.bin").version
    rng = random.Random(3)
    cases = [(0, 1), (0, len(data)), (len(data) - 1, 1), (len(data) - 5, 100), (12345, 0)]
    cases += [(rng.randrange(len(data)), rng.randrange(1, 300_000)) for _ in range(10)]
    for start, length in cases:
        got = backend.read_range("dir/b.bin", start, length, version)
        assert got == data[start : start + length], (start, length)
    assert backend.read_range("dir/b.bin", len(data) + 10, 10, version) == b""
    assert backend.read_range("a.txt", 0, 100, None) == TREE["a.txt"]


def test_read_missing(store) -> None:
    backend = store.backend
    with pytest.raises(NotFound):
        backend.read_range("dir/nope", 0, 10, None)


def test_changed_object_is_detected(store) -> None:
    backend = store.backend
    old = backend.stat("dir/z.txt").version
    store.write({"dir/z.txt": b"a new, longer content"})
    assert backend.stat("dir/z.txt").version != old
    with pytest.raises(Changed):
        backend.read_range("dir/z.txt", 0, 2, old)


# More entries than one page of an S3 listing (1,000 keys and common prefixes together): the
# second page must follow the first with nothing lost or repeated at the boundary. S3Backend
# has no page size to set, so the directory is that large; every 50th entry is a directory
# (e1000 lands on the second page).
PAGE = 1000
BIG: dict[str, bytes] = {
    f"big/e{i:04d}" + ("/in" if i % 50 == 0 else ""): b"%d" % i for i in range(PAGE + 50)
}


def _list_requests(source_id: str) -> float:
    """LIST requests the backend has made (S3: one per page), from the metrics it counts into."""
    family = metrics.snapshot()["metrics"]["pffs_backend_requests_total"]
    wanted = {"source": source_id, "request": "LIST"}
    return float(sum(s["value"] for s in family["samples"] if s["labels"] == wanted))


def test_list_larger_than_a_page(store) -> None:
    backend = store.backend
    store.write(BIG)
    before = _list_requests(backend.source_id)
    entries = list(backend.list("big"))
    names = [i.name for i in entries]
    assert len(names) == len(set(names)) == len(BIG), "an entry lost or repeated"
    assert sorted(names) == sorted(key.split("/")[1] for key in BIG)
    assert {i.name for i in entries if i.is_dir} == {f"e{i:04d}" for i in range(0, PAGE + 50, 50)}
    files = {key[len("big/") :]: len(data) for key, data in BIG.items() if "/in" not in key}
    assert {i.name: i.size for i in entries if not i.is_dir} == files
    assert backend.read_range("big/e1049", 0, 10, None) == b"1049"
    if store.name in ("s3", "rgw"):  # the stores that page: the listing did cross a page boundary
        assert _list_requests(backend.source_id) - before >= 2


def _listings_below(backend: Backend, path: str) -> dict[str, list[ObjectInfo]]:
    """`list` of `path` and of every directory below it, by path relative to `path`."""
    found: dict[str, list[ObjectInfo]] = {}
    waiting = [""]
    while waiting:
        relative = waiting.pop()
        found[relative] = list(backend.list(join(path, relative) if relative else path))
        waiting += [join(relative, info.name) for info in found[relative] if info.is_dir]
    return found


def test_a_tree_page_holds_the_listings_below_a_directory(store) -> None:
    lister = declared(store, tree_lister, "tree_pages")
    for path in ("", "dir", "zeta"):
        page = lister.list_tree(path, 100)
        assert page.complete
        assert page.directories == _listings_below(lister, path), path
    # Cut short, a page holds nothing: what a directory lacks would be a guess.
    cut = lister.list_tree("", 3)
    assert not cut.complete and cut.directories == {}


def test_a_tree_page_shows_what_its_listings_show_of_odd_keys(store) -> None:
    """A key both an object and a prefix (both given: the listing keeps the directory), an
    empty component, a `..`: the page shows each as `list` does (moto keeps such keys as
    given)."""
    if store.name != "s3":
        pytest.skip("keys no file system holds, written as given: moto only")
    lister = declared(store, tree_lister, "tree_pages")
    store.write({"odd/x": b"f", "odd/x/y": b"d", "odd//e": b"e", "odd/bad/../z": b"z"})
    page = lister.list_tree("odd", 100)
    assert page.directories == _listings_below(lister, "odd")
    assert set(page.directories) == {"", "x", "bad"}
    entries = [(i.name, i.is_dir) for i in page.directories[""]]
    assert entries == [("bad", True), ("x", False), ("x", True)]


def test_read_blocks(store) -> None:
    reader = declared(store, block_runs, "block_runs")
    data = TREE["dir/b.bin"]
    version = reader.stat("dir/b.bin").version
    cases = [(12345, [65536, 65536, 65536, 65536, 1000, 1]), (len(data) - 300, [200, 100])]
    for start, lengths in cases:  # the second ends at the object's last byte
        got = list(reader.read_blocks("dir/b.bin", start, lengths, version))
        offset = start
        for block, length in zip(got, lengths, strict=True):  # in order, each once
            assert block == data[offset : offset + length], (start, offset, length)
            offset += length


def test_read_blocks_of_a_changed_object(store) -> None:
    reader = declared(store, block_runs, "block_runs")
    old = reader.stat("dir/z.txt").version
    store.write({"dir/z.txt": b"a new, longer content"})
    got: list[bytes] = []
    with pytest.raises(Changed):
        got.extend(reader.read_blocks("dir/z.txt", 0, [1, 1], old))
    assert got == []


def test_missing_root_is_not_found(tmp_path, moto) -> None:
    with pytest.raises(NotFound):
        open_backend(SourceConfig(url=f"file://{tmp_path}/nope")).check()
    source = SourceConfig(url="s3://no-such-bucket-here", endpoint_url=moto.endpoint_url)
    with pytest.raises(NotFound):
        open_backend(source).check()


@pytest.mark.parametrize(
    "url",
    [
        "s3://",
        "s3://UPPER",
        "s3://ok-bucket/a/../b",
        "file://host/x",
        "file:relative",
        "gs://x",
        "hdfs://nn:port/x",
        "hdfs://nn/a/../b",
        "hdfs://nn/x?y=1",
        "arrow+file://host/x",
    ],
)
def test_malformed_urls(url: str) -> None:
    with pytest.raises(UsageError):
        open_backend(SourceConfig(url=url))


def test_local_cannot_escape_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "secret").write_text("s")
    (root / "link").symlink_to(tmp_path / "secret")
    backend = open_backend(SourceConfig(url=f"file://{root}"))
    assert [i.name for i in backend.list("")] == []
    with pytest.raises(Exception, match="escapes"):
        backend.stat("../secret")
    with pytest.raises(Exception, match="escapes"):
        backend.read_range("link", 0, 1, None)
