"""One contract, every backend: local disk, S3 on a real moto server over HTTP, the generic
pyarrow backend on arrow's local filesystem, and HDFS where PFFS_TEST_HDFS_URI names a cluster.

Each backend is given the same tree and must describe and read it the same way: stat, listings
(one larger than a page of S3's), ranged reads and version checks. What a backend declares in its
`capabilities` is held to the same standard: block runs, writes (put, delete, directories,
renames that replace) and multipart uploads run on every store that declares them, and are
skipped with the reason on the others; a capability a store implements must be declared, and one
it declares must be implemented.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import random
import typing
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple, TypeVar, cast

import pytest

from pffs import metrics
from pffs.backends import Backend, open_backend
from pffs.backends.arrow import ArrowLocalBackend
from pffs.backends.base import (
    BlockRunReader,
    Capabilities,
    MultipartBackend,
    WritableBackend,
    Writing,
    block_runs,
    multipart,
    writable,
)
from pffs.backends.hdfs import HdfsBackend
from pffs.backends.local import LocalBackend
from pffs.backends.s3 import S3Backend
from pffs.backends.s3writes import PART_LIMITS
from pffs.config import SourceConfig
from pffs.errors import Changed, NotFound, PffsError, UsageError
from pffs.testing.servers import MotoServer

RNG = random.Random(7)
TREE: dict[str, bytes] = {
    "a.txt": b"hello world\n",
    "empty": b"",
    "dir/b.bin": RNG.randbytes(1_000_003),
    "dir/sub/c.txt": b"c",
    "dir/z.txt": b"zz",
    "zeta/deep/er/file": b"deep",
}
EMPTY_DIRS = ["marker"]  # a directory with nothing in it (S3: a "marker/" object)
# Writers of the tree and of the big listing: threads, as the S3 one is one PUT per object.
WRITERS = 16


class Store(NamedTuple):
    """A backend over the tree, and a way to change the store behind its back."""

    name: str
    backend: Backend
    # Put objects (relative path: content) into the store directly, not through the backend;
    # an overwritten object's version always moves.
    write: Callable[[dict[str, bytes]], None]


def _local_tree(root: Path) -> Callable[[dict[str, bytes]], None]:
    def write(files: dict[str, bytes]) -> None:
        for key, data in files.items():
            path = root / key
            path.parent.mkdir(parents=True, exist_ok=True)
            existed = path.exists()
            path.write_bytes(data)
            if existed:  # make sure the version (mtime, size) moves even within one tick
                st = path.stat()
                os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))

    write(TREE)
    for name in EMPTY_DIRS:
        (root / name).mkdir()
    return write


def _local(tmp_path: Path) -> Store:
    write = _local_tree(tmp_path / "root")
    return Store("local", open_backend(SourceConfig(url=f"file://{tmp_path}/root")), write)


def _s3(moto: MotoServer, s3: Any, bucket: str) -> Store:
    def write(files: dict[str, bytes]) -> None:
        def put(item: tuple[str, bytes]) -> None:
            s3.put_object(Bucket=bucket, Key=f"pre/{item[0]}", Body=item[1])

        with ThreadPoolExecutor(WRITERS) as pool:
            list(pool.map(put, files.items()))

    write(TREE)
    for name in EMPTY_DIRS:
        s3.put_object(Bucket=bucket, Key=f"pre/{name}/", Body=b"")
    s3.put_object(Bucket=bucket, Key="outside.txt", Body=b"not under the prefix")
    source = SourceConfig(url=f"s3://{bucket}/pre", endpoint_url=moto.endpoint_url)
    return Store("s3", open_backend(source), write)


def _arrow_local(tmp_path: Path) -> Store:
    """The generic pyarrow backend over arrow's LocalFileSystem: the HDFS code, no cluster."""
    write = _local_tree(tmp_path / "root")
    return Store("arrow", open_backend(SourceConfig(url=f"arrow+file://{tmp_path}/root")), write)


def _hdfs(base_url: str) -> Store:
    """A real cluster: the tree is written under a fresh directory of PFFS_TEST_HDFS_URI."""
    root_url = f"{base_url.rstrip('/')}/pffs-contract-{os.getpid()}-{RNG.randrange(1 << 30)}"
    backend = HdfsBackend(SourceConfig(url=root_url))
    fs, root = backend.fs, backend.root

    def write(files: dict[str, bytes]) -> None:
        def put(item: tuple[str, bytes]) -> None:
            fs.create_dir(os.path.dirname(f"{root}/{item[0]}"), recursive=True)
            with fs.open_output_stream(f"{root}/{item[0]}") as f:
                f.write(item[1])

        with ThreadPoolExecutor(WRITERS) as pool:
            list(pool.map(put, files.items()))

    write(TREE)
    for name in EMPTY_DIRS:
        fs.create_dir(f"{root}/{name}")
    return Store("hdfs", backend, write)


HDFS_URI = os.environ.get("PFFS_TEST_HDFS_URI")


@pytest.fixture(params=["local", "s3", "arrow", "hdfs"])
def store(request, tmp_path) -> Iterator[Store]:
    if request.param == "local":
        yield _local(tmp_path)
    elif request.param == "arrow":
        yield _arrow_local(tmp_path)
    elif request.param == "hdfs":
        if not HDFS_URI:
            pytest.skip("no HDFS cluster here: set PFFS_TEST_HDFS_URI=hdfs://namenode:8020/tmp")
        yield _hdfs(HDFS_URI)
    else:
        moto = request.getfixturevalue("moto")
        yield _s3(moto, request.getfixturevalue("s3"), request.getfixturevalue("bucket"))


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
    if store.name == "s3":  # the store that pages: the listing did cross a page boundary
        assert _list_requests(backend.source_id) - before >= 2


# --- declared capabilities, exercised where declared ----------------------------------------

V = TypeVar("V")


def _declared(store: Store, accessor: Callable[[Backend], V | None], capability: str) -> V:
    """The backend seen through `accessor`, or the test skipped: the store does not declare it."""
    view = accessor(store.backend)
    if view is None:
        name = type(store.backend).__name__
        pytest.skip(f"{store.name}: {name} does not declare {capability}")
    return view


def _staged(tmp_path: Path, data: bytes) -> str:
    """A local file holding `data`, as the VFS stages what it uploads."""
    staging = tmp_path / "staging"
    staging.mkdir(exist_ok=True)
    path = staging / f"{len(list(staging.iterdir()))}.bin"
    path.write_bytes(data)
    return str(path)


def _names(backend: Backend, path: str) -> set[str]:
    return {i.name for i in backend.list(path)}


def _read(backend: Backend, path: str) -> bytes:
    return backend.read_range(path, 0, backend.stat(path).size + 1, None)


def test_read_blocks(store) -> None:
    reader = _declared(store, block_runs, "block_runs")
    data = TREE["dir/b.bin"]
    version = reader.stat("dir/b.bin").version
    cases = [(12345, [65536, 65536, 65536, 65536, 1000, 1]), (len(data) - 300, [200, 100])]
    for start, lengths in cases:  # the second ends at the object's last byte
        got: list[tuple[int, bytes]] = []

        def deliver(index: int, block: bytes, got: list[tuple[int, bytes]] = got) -> None:
            got.append((index, block))

        reader.read_blocks("dir/b.bin", start, lengths, version, deliver)
        assert [index for index, _ in got] == list(range(len(lengths)))  # in order, each once
        offset = start
        for (_, block), length in zip(got, lengths, strict=True):
            assert block == data[offset : offset + length], (start, offset, length)
            offset += length


def test_read_blocks_of_a_changed_object(store) -> None:
    reader = _declared(store, block_runs, "block_runs")
    old = reader.stat("dir/z.txt").version
    store.write({"dir/z.txt": b"a new, longer content"})
    got: list[tuple[int, bytes]] = []
    with pytest.raises(Changed):
        reader.read_blocks("dir/z.txt", 0, [1, 1], old, lambda i, b: got.append((i, b)))
    assert got == []


def test_put_new_and_replacing(store, tmp_path: Path) -> None:
    writer = _declared(store, writable, "writes")
    backend = store.backend
    data = random.Random(5).randbytes(300_001)
    info = writer.put("dir/new.bin", _staged(tmp_path, data))
    assert (info.name, info.size, info.is_dir) == ("new.bin", len(data), False)
    # What put returns is what the store holds: its version serves reads at once.
    assert info.version == backend.stat("dir/new.bin").version
    assert backend.read_range("dir/new.bin", 0, len(data), info.version) == data
    assert _names(backend, "dir") == {"b.bin", "new.bin", "sub", "z.txt"}

    old = backend.stat("a.txt").version
    info = writer.put("a.txt", _staged(tmp_path, b"replaced"))
    assert (info.size, backend.stat("a.txt").size) == (8, 8)
    assert info.version != old and info.version == backend.stat("a.txt").version
    assert _read(backend, "a.txt") == b"replaced"
    with pytest.raises(Changed):
        backend.read_range("a.txt", 0, 1, old)
    assert _names(backend, "") == {"a.txt", "empty", "dir", "marker", "zeta"}  # no leftovers

    info = writer.put("dir/sub/zero", _staged(tmp_path, b""))
    assert (info.size, backend.stat("dir/sub/zero").size, _read(backend, "dir/sub/zero")) == (
        0,
        0,
        b"",
    )


def test_delete(store) -> None:
    writer = _declared(store, writable, "writes")
    backend = store.backend
    writer.delete("dir/z.txt")
    with pytest.raises(NotFound):
        backend.stat("dir/z.txt")
    with pytest.raises(NotFound):
        backend.read_range("dir/z.txt", 0, 1, None)
    assert _names(backend, "dir") == {"b.bin", "sub"}
    writer.delete("dir/sub/c.txt")  # the last entry: on S3 the directory goes with it
    with pytest.raises(NotFound):
        backend.stat("dir/sub/c.txt")


def test_make_dir_and_remove_dir(store, tmp_path: Path) -> None:
    writer = _declared(store, writable, "writes")
    backend = store.backend
    info = writer.make_dir("dir/new")
    assert (info.name, info.is_dir) == ("new", True)
    assert backend.stat("dir/new").is_dir
    assert list(backend.list("dir/new")) == []
    assert {i.name: i.is_dir for i in backend.list("dir")}["new"] is True
    writer.put("dir/new/f", _staged(tmp_path, b"in a new directory"))  # one made is usable
    assert _read(backend, "dir/new/f") == b"in a new directory"
    writer.delete("dir/new/f")
    writer.remove_dir("dir/new")
    with pytest.raises(NotFound):
        backend.stat("dir/new")
    assert "new" not in _names(backend, "dir")
    writer.remove_dir("marker")  # an empty directory the store already had
    with pytest.raises(NotFound):
        backend.stat("marker")
    assert "marker" not in _names(backend, "")


def test_rename_a_file(store) -> None:
    writer = _declared(store, writable, "writes")
    backend = store.backend
    writer.rename("a.txt", "dir/sub/moved.txt")
    with pytest.raises(NotFound):
        backend.stat("a.txt")
    assert backend.stat("dir/sub/moved.txt").size == len(TREE["a.txt"])
    assert _read(backend, "dir/sub/moved.txt") == TREE["a.txt"]
    # Onto an existing file: it is replaced.
    writer.rename("dir/z.txt", "dir/sub/c.txt")
    with pytest.raises(NotFound):
        backend.stat("dir/z.txt")
    assert _read(backend, "dir/sub/c.txt") == TREE["dir/z.txt"]
    assert _names(backend, "dir/sub") == {"c.txt", "moved.txt"}
    assert _names(backend, "dir") == {"b.bin", "sub"}


def test_rename_a_directory(store) -> None:
    writer = _declared(store, writable, "writes")
    backend = store.backend
    writer.rename("dir", "moved")
    for gone in ("dir", "dir/b.bin", "dir/sub/c.txt"):
        with pytest.raises(NotFound):
            backend.stat(gone)
    assert backend.stat("moved").is_dir
    assert _names(backend, "moved") == {"b.bin", "sub", "z.txt"}
    assert _read(backend, "moved/b.bin") == TREE["dir/b.bin"]
    assert _read(backend, "moved/sub/c.txt") == TREE["dir/sub/c.txt"]
    assert _names(backend, "") == {"a.txt", "empty", "moved", "marker", "zeta"}
    # Onto an existing empty directory: it is replaced.
    writer.rename("zeta", "marker")
    with pytest.raises(NotFound):
        backend.stat("zeta")
    assert _names(backend, "marker") == {"deep"}
    assert _read(backend, "marker/deep/er/file") == TREE["zeta/deep/er/file"]
    # An empty directory moves too.
    writer.make_dir("fresh")
    writer.rename("fresh", "renamed")
    with pytest.raises(NotFound):
        backend.stat("fresh")
    assert backend.stat("renamed").is_dir and list(backend.list("renamed")) == []
    assert _names(backend, "") == {"a.txt", "empty", "moved", "marker", "renamed"}


# S3's smallest part but the last one.
PART = PART_LIMITS.min_size


def test_multipart_upload(store, tmp_path: Path) -> None:
    uploader = _declared(store, multipart, "multipart")
    backend = store.backend
    data = random.Random(11).randbytes(PART + 123_457)
    local = _staged(tmp_path, data)
    upload_id = uploader.begin_upload("dir/parts.bin")
    # The VFS sends parts in parallel, so they may arrive in any order: the etags' order counts.
    second = uploader.upload_part("dir/parts.bin", upload_id, 2, local, PART, len(data) - PART)
    first = uploader.upload_part("dir/parts.bin", upload_id, 1, local, 0, PART)
    with pytest.raises(NotFound):  # nothing shows before the upload is finished
        backend.stat("dir/parts.bin")
    info = uploader.finish_upload("dir/parts.bin", upload_id, [first, second], len(data))
    assert (info.name, info.size, info.is_dir) == ("parts.bin", len(data), False)
    assert info.version == backend.stat("dir/parts.bin").version
    for start, length in [(0, len(data)), (PART - 10, 20), (len(data) - 1, 1)]:
        got = backend.read_range("dir/parts.bin", start, length, info.version)
        assert got == data[start : start + length], (start, length)
    assert "parts.bin" in _names(backend, "dir")


def test_multipart_replacing_and_aborted(store, tmp_path: Path) -> None:
    uploader = _declared(store, multipart, "multipart")
    backend = store.backend
    local = _staged(tmp_path, random.Random(13).randbytes(PART))
    upload_id = uploader.begin_upload("a.txt")
    etag = uploader.upload_part("a.txt", upload_id, 1, local, 0, PART)
    uploader.abort_upload("a.txt", upload_id)
    assert _read(backend, "a.txt") == TREE["a.txt"]  # what it would have replaced is intact
    with pytest.raises(PffsError):  # an aborted upload cannot be finished
        uploader.finish_upload("a.txt", upload_id, [etag], PART)
    assert _read(backend, "a.txt") == TREE["a.txt"]

    # A finished one replaces the object; a single part may be small.
    small = b"replaced in one part"
    upload_id = uploader.begin_upload("a.txt")
    etag = uploader.upload_part("a.txt", upload_id, 1, _staged(tmp_path, small), 0, len(small))
    info = uploader.finish_upload("a.txt", upload_id, [etag], len(small))
    assert info.size == len(small) and info.version == backend.stat("a.txt").version
    assert _read(backend, "a.txt") == small


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


# --- declared capabilities ------------------------------------------------------------------

CAPABILITY_METHODS = {
    "writes": ("put", "delete", "make_dir", "remove_dir", "rename"),
    "multipart": ("begin_upload", "upload_part", "finish_upload", "abort_upload"),
    "block_runs": ("read_blocks",),
}
# Each capability: its accessor, and the protocol of the methods it promises.
CAPABILITIES: dict[str, tuple[Callable[[Backend], object], type]] = {
    "writes": (writable, WritableBackend),
    "multipart": (multipart, MultipartBackend),
    "block_runs": (block_runs, BlockRunReader),
}
BACKEND_CLASSES = [S3Backend, LocalBackend, ArrowLocalBackend, HdfsBackend]


def _methods(protocol: type) -> dict[str, inspect.Signature]:
    """The methods `protocol` adds to the protocols it extends, with their signatures."""
    return {
        name: inspect.signature(value)
        for name, value in vars(protocol).items()
        if inspect.isfunction(value) and not name.startswith("_")
    }


def _defined(cls: type, name: str) -> object:
    """What `cls` or one of its bases defines as `name`, or None (nothing is called)."""
    return next((vars(klass)[name] for klass in cls.__mro__ if name in vars(klass)), None)


def _parameters(signature: inspect.Signature) -> list[tuple[str, object, object]]:
    """Names, kinds and defaults: what a caller passing arguments by name depends on."""
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


def test_every_capability_is_covered() -> None:
    """A new Capabilities field needs its accessor and protocol here, and tests above."""
    assert {field.name for field in dataclasses.fields(Capabilities)} == set(CAPABILITIES)
    for capability, (_, protocol) in CAPABILITIES.items():
        assert set(_methods(protocol)) == set(CAPABILITY_METHODS[capability])
    # A store with parts takes writes too: MultipartBackend is a WritableBackend.
    with pytest.raises(ValueError, match="multipart"):
        Capabilities(multipart=PART_LIMITS)


def test_part_limits_size_the_parts_of_an_upload() -> None:
    """The part size staging asks for, grown where S3's rules require it, refused past them."""
    preferred = 8 << 20
    assert PART_LIMITS.part_size(0, preferred) == preferred  # a streamed upload: size unknown
    assert PART_LIMITS.part_size(0, 1 << 20) == 5 << 20  # never below the store's minimum
    big = 200 << 30  # 200 GiB: 10,000 parts of 8 MiB would not hold it
    size = PART_LIMITS.part_size(big, preferred)
    assert size * PART_LIMITS.max_count >= big > (size - 1) * PART_LIMITS.max_count
    with pytest.raises(ValueError, match="larger than"):
        PART_LIMITS.part_size(PART_LIMITS.max_size * PART_LIMITS.max_count + 1, preferred)


def _implementer(backend_class: type, capability: str) -> type | None:
    """The class whose methods a capability promises: the backend's own, or for writes and
    parts its writer's (the class's annotation of `writer`; None where it has none)."""
    if capability in ("writes", "multipart"):
        writer: type | None = typing.get_type_hints(backend_class).get("writer")
        return writer
    return backend_class


@pytest.mark.parametrize("backend_class", BACKEND_CLASSES, ids=lambda c: c.__name__)
def test_declared_capabilities_are_implemented(backend_class: type[Backend]) -> None:
    """A declared capability's methods exist, with the protocol's parameters; an undeclared
    one's do not, so nothing a store can do goes undeclared. What a store declares is all
    callers look at."""
    declared = backend_class.capabilities
    assert isinstance(declared, Capabilities)
    flags = dataclasses.asdict(declared)
    promised: list[tuple[bool, str, type]] = [(True, "reads", Backend)]
    promised += [(bool(flags[c]), c, protocol) for c, (_, protocol) in CAPABILITIES.items()]
    for is_declared, capability, protocol in promised:
        owner = _implementer(backend_class, capability)
        for name, signature in _methods(protocol).items():
            method = None if owner is None else _defined(owner, name)
            if not is_declared:
                assert method is None, f"{name} is implemented but {capability} is not declared"
                continue
            assert inspect.isfunction(method) and callable(method), (capability, name)
            assert _parameters(inspect.signature(method)) == _parameters(signature), name
    # No forwarding wall: where an object of its own takes the writes, the backend has none.
    writer_class = _implementer(backend_class, "writes")
    if writer_class is not None and not issubclass(backend_class, writer_class):
        assert all(_defined(backend_class, name) is None for name in CAPABILITY_METHODS["writes"])
    assert declared.multipart is None or declared.writes


def test_accessors_give_what_is_declared(store) -> None:
    """Each accessor gives the backend itself (block runs) or its writer (writes, parts) where
    its class declares the capability, None elsewhere; the rest of what every backend carries is
    there too."""
    backend = store.backend
    assert backend.capabilities is type(backend).capabilities  # declared by the class
    flags = dataclasses.asdict(backend.capabilities)
    for capability, (accessor, _) in CAPABILITIES.items():
        view = cast(Writing, backend).writer if capability in ("writes", "multipart") else backend
        assert accessor(backend) is (view if flags[capability] else None), capability
    assert isinstance(backend.source_id, str) and backend.source_id
    assert isinstance(backend.max_concurrency, int) and backend.max_concurrency > 0
    assert backend.retries == 0  # a counter, and nothing has been retried yet


def test_accessors_follow_the_declaration(tmp_path: Path) -> None:
    local = LocalBackend(SourceConfig(url=f"file://{tmp_path}"))
    assert writable(local) is local
    assert multipart(local) is None and block_runs(local) is None
    s3 = S3Backend(SourceConfig(url="s3://bucket", endpoint_url="http://127.0.0.1:1"))
    assert writable(s3) is s3.writer and multipart(s3) is s3.writer and block_runs(s3) is s3
    assert s3.capabilities.multipart == PART_LIMITS
