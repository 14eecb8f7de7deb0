"""One contract, every backend: local disk, S3 on a real moto server over HTTP, the generic
pyarrow backend on arrow's local filesystem, and HDFS where PFFS_TEST_HDFS_URI names a cluster.

Each backend is given the same tree and must describe and read it the same way.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pffs.backends import Backend, open_backend
from pffs.backends.arrow import ArrowLocalBackend
from pffs.backends.base import Capabilities, block_runs, multipart, writable
from pffs.backends.hdfs import HdfsBackend
from pffs.backends.local import LocalBackend
from pffs.backends.s3 import S3Backend
from pffs.config import SourceConfig
from pffs.errors import Changed, NotFound, UsageError
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


def _local(tmp_path: Path) -> tuple[Backend, Callable[[str, bytes], None]]:
    root = tmp_path / "root"
    for key, data in TREE.items():
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(data)
    for name in EMPTY_DIRS:
        (root / name).mkdir()

    def overwrite(key: str, data: bytes) -> None:
        path = root / key
        path.write_bytes(data)
        st = path.stat()  # make sure the version (mtime, size) moves even within one tick
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))

    return open_backend(SourceConfig(url=f"file://{root}")), overwrite


def _s3(moto: MotoServer, s3: Any, bucket: str) -> tuple[Backend, Callable[[str, bytes], None]]:
    for key, data in TREE.items():
        s3.put_object(Bucket=bucket, Key=f"pre/{key}", Body=data)
    for name in EMPTY_DIRS:
        s3.put_object(Bucket=bucket, Key=f"pre/{name}/", Body=b"")
    s3.put_object(Bucket=bucket, Key="outside.txt", Body=b"not under the prefix")

    def overwrite(key: str, data: bytes) -> None:
        s3.put_object(Bucket=bucket, Key=f"pre/{key}", Body=data)

    source = SourceConfig(url=f"s3://{bucket}/pre", endpoint_url=moto.endpoint_url)
    return open_backend(source), overwrite


def _arrow_local(tmp_path: Path) -> tuple[Backend, Callable[[str, bytes], None]]:
    """The generic pyarrow backend over arrow's LocalFileSystem: the HDFS code, no cluster."""
    _, overwrite = _local(tmp_path)
    return open_backend(SourceConfig(url=f"arrow+file://{tmp_path}/root")), overwrite


def _hdfs(base_url: str) -> tuple[Backend, Callable[[str, bytes], None]]:
    """A real cluster: the tree is written under a fresh directory of PFFS_TEST_HDFS_URI."""
    from pffs.backends.hdfs import HdfsBackend

    root_url = f"{base_url.rstrip('/')}/pffs-contract-{os.getpid()}-{RNG.randrange(1 << 30)}"
    backend = HdfsBackend(SourceConfig(url=root_url))
    fs, root = backend.fs, backend.root

    def overwrite(key: str, data: bytes) -> None:
        with fs.open_output_stream(f"{root}/{key}") as f:
            f.write(data)

    for key, data in TREE.items():
        fs.create_dir(os.path.dirname(f"{root}/{key}"), recursive=True)
        overwrite(key, data)
    for name in EMPTY_DIRS:
        fs.create_dir(f"{root}/{name}")
    return backend, overwrite


HDFS_URI = os.environ.get("PFFS_TEST_HDFS_URI")


@pytest.fixture(params=["local", "s3", "arrow", "hdfs"])
def store(request, tmp_path) -> Iterator[tuple[Backend, Callable[[str, bytes], None]]]:
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
    backend, _ = store
    backend.check()


def test_stat_files_dirs_and_root(store) -> None:
    backend, _ = store
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
    backend, _ = store
    root = {i.name: i for i in backend.list("")}
    assert set(root) == {"a.txt", "empty", "dir", "marker", "zeta"}
    assert root["dir"].is_dir and root["marker"].is_dir and not root["a.txt"].is_dir
    assert root["a.txt"].size == len(TREE["a.txt"])
    nested = [(i.name, i.is_dir) for i in backend.list("dir")]
    assert sorted(nested) == [("b.bin", False), ("sub", True), ("z.txt", False)]
    assert list(backend.list("marker")) == []
    # The etag or mtime a listing reports is the one stat reports: one version, two views.
    assert root["a.txt"].version == backend.stat("a.txt").version


def test_read_ranges(store) -> None:
    backend, _ = store
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
    backend, _ = store
    with pytest.raises(NotFound):
        backend.read_range("dir/nope", 0, 10, None)


def test_changed_object_is_detected(store) -> None:
    backend, overwrite = store
    old = backend.stat("dir/z.txt").version
    overwrite("dir/z.txt", b"a new, longer content")
    assert backend.stat("dir/z.txt").version != old
    with pytest.raises(Changed):
        backend.read_range("dir/z.txt", 0, 2, old)


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


@pytest.mark.parametrize(
    "backend_class",
    [S3Backend, LocalBackend, ArrowLocalBackend, HdfsBackend],
    ids=lambda c: c.__name__,
)
def test_declared_capabilities_are_implemented(backend_class: type[Backend]) -> None:
    """A declared capability's methods exist; what a store declares is all callers look at."""
    declared = backend_class.capabilities
    assert isinstance(declared, Capabilities)
    for capability, methods in CAPABILITY_METHODS.items():
        if getattr(declared, capability):
            for method in methods:
                assert callable(getattr(backend_class, method, None)), (capability, method)
    # A store with parts takes writes too: MultipartBackend is a WritableBackend.
    assert not declared.multipart or declared.writes


def test_accessors_follow_the_declaration(tmp_path: Path) -> None:
    local = LocalBackend(SourceConfig(url=f"file://{tmp_path}"))
    assert writable(local) is local
    assert multipart(local) is None and block_runs(local) is None
    s3 = S3Backend(SourceConfig(url="s3://bucket", endpoint_url="http://127.0.0.1:1"))
    assert writable(s3) is s3 and multipart(s3) is s3 and block_runs(s3) is s3
