"""The stores of the backend contract: the same tree on local disk, S3 on a real moto server
over HTTP and on Ceph's RADOS Gateway (a one-node cluster, pffs.testing.rgw), the generic
pyarrow backend on arrow's local filesystem, and HDFS where PFFS_TEST_HDFS_URI names a cluster;
and the helpers the contract's tests share."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import pytest

from pffs.backends import Backend, open_backend
from pffs.backends.hdfs import HdfsBackend
from pffs.config import SourceConfig

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


def local_tree(root: Path) -> Callable[[dict[str, bytes]], None]:
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


def local_store(tmp_path: Path) -> Store:
    write = local_tree(tmp_path / "root")
    return Store("local", open_backend(SourceConfig(url=f"file://{tmp_path}/root")), write)


def s3_store(name: str, endpoint_url: str, s3: Any, bucket: str) -> Store:
    """The tree in a bucket of an S3 server (moto's, or Ceph's gateway), under a prefix."""

    def write(files: dict[str, bytes]) -> None:
        def put(item: tuple[str, bytes]) -> None:
            s3.put_object(Bucket=bucket, Key=f"pre/{item[0]}", Body=item[1])

        with ThreadPoolExecutor(WRITERS) as pool:
            list(pool.map(put, files.items()))

    write(TREE)
    for directory in EMPTY_DIRS:
        s3.put_object(Bucket=bucket, Key=f"pre/{directory}/", Body=b"")
    s3.put_object(Bucket=bucket, Key="outside.txt", Body=b"not under the prefix")
    source = SourceConfig(url=f"s3://{bucket}/pre", endpoint_url=endpoint_url)
    return Store(name, open_backend(source), write)


def arrow_store(tmp_path: Path) -> Store:
    """The generic pyarrow backend over arrow's LocalFileSystem: the HDFS code, no cluster."""
    write = local_tree(tmp_path / "root")
    return Store("arrow", open_backend(SourceConfig(url=f"arrow+file://{tmp_path}/root")), write)


def hdfs_store(base_url: str) -> Store:
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


V = TypeVar("V")


def declared(store: Store, accessor: Callable[[Backend], V | None], capability: str) -> V:
    """The backend seen through `accessor`, or the test skipped: the store does not declare it."""
    view = accessor(store.backend)
    if view is None:
        name = type(store.backend).__name__
        pytest.skip(f"{store.name}: {name} does not declare {capability}")
    return view


def staged(tmp_path: Path, data: bytes) -> str:
    """A local file holding `data`, as the VFS stages what it uploads."""
    staging = tmp_path / "staging"
    staging.mkdir(exist_ok=True)
    path = staging / f"{len(list(staging.iterdir()))}.bin"
    path.write_bytes(data)
    return str(path)


def names_in(backend: Backend, path: str) -> set[str]:
    return {i.name for i in backend.list(path)}


def read_whole(backend: Backend, path: str) -> bytes:
    return backend.read_range(path, 0, backend.stat(path).size + 1, None)
