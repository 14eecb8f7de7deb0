"""The benchmark's dataset: generated, uploaded, verified in the store, and its large objects
read once from it (`prime`), before any run.

One large file (sequential and random reads), a second large file (parallel readers), a
checkpoint (one large file read in 8 MiB reads), a safetensors checkpoint (a few of its
tensors loaded lazily, bench.lazyload), shards (large files read whole by several
readers, bench.largeobjects), a file for time to first byte, many small files, a wide
directory for metadata, and a training set (one directory of `epoch_files` files of
`epoch_size` bytes, read whole by the epochs); the tree of tiny objects for metadata at scale
is bench.metadata's (`create_tree`). A local copy of the large file is kept for the local-disk
ceiling and for verifying bytes read through mounts.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field

import boto3
from boto3.s3.transfer import TransferConfig

from bench import clients as client_patterns
from bench.largeobjects import CHECKPOINT_KEY, shard_keys
from bench.lazyload import KEY as LAZY_KEY
from bench.lazyload import write_checkpoint
from bench.leftovers import in_threads
from bench.servers import Server

MIB = 1 << 20
SMALL_SIZE = 64 * 1024


@dataclass(frozen=True)
class Sizes:
    large: int
    parallel: int
    small_files: int
    wide_files: int
    write: int
    epoch_files: int
    epoch_size: int
    tree_files: int = 0  # tiny objects of the metadata-at-scale tree (bench.metadata)
    checkpoint: int = 0  # the checkpoint's size (bench.largeobjects)
    shard_files: int = 0
    shard_size: int = 0
    lazy_tensors: int = 0  # tensors of the lazily loaded checkpoint (bench.lazyload)

    @staticmethod
    def full() -> Sizes:
        # 100 KiB: ImageNet's mean file size.
        return Sizes(large=1 << 30, parallel=512 * MIB, small_files=1000, wide_files=10_000,
                     write=1 << 30, epoch_files=2000, epoch_size=100 * 1024,
                     tree_files=100_000, checkpoint=1 << 30, shard_files=16,
                     shard_size=64 * MIB, lazy_tensors=64)  # fmt: skip

    @staticmethod
    def quick() -> Sizes:
        # A smoke test a user can wait for: the peers pay a round trip or two per file at
        # 20 ms, so the file counts set its length.
        return Sizes(large=32 * MIB, parallel=16 * MIB, small_files=40, wide_files=300,
                     write=8 * MIB, epoch_files=200, epoch_size=100 * 1024,
                     tree_files=1000, checkpoint=32 * MIB, shard_files=4,
                     shard_size=4 * MIB, lazy_tensors=16)  # fmt: skip


@dataclass
class Dataset:
    bucket: str
    sizes: Sizes
    local_large: str
    large_sha256: str
    small_keys: list[str]
    wide_keys: list[str]
    epoch_keys: list[str]
    checkpoint_sha256: str = ""
    shard_sha256: dict[str, str] = field(default_factory=dict)  # by file name
    lazy_sha256: dict[str, str] = field(default_factory=dict)  # by tensor name
    clients: client_patterns.ClientData | None = None  # the clients scenario's, when it runs


def client(server: Server):
    return boto3.client(
        "s3",
        endpoint_url=server.endpoint_url,
        aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key,
        region_name="us-east-1",
    )


def make_local_file(path: str, size: int) -> str:
    """Random bytes on local disk (reused across runs of the same size); returns its sha256."""
    digest = hashlib.sha256()
    if not (os.path.exists(path) and os.path.getsize(path) == size):
        with open(path, "wb") as f:
            remaining = size
            while remaining:
                chunk = os.urandom(min(remaining, 8 * MIB))
                f.write(chunk)
                remaining -= len(chunk)
    with open(path, "rb") as f:
        while chunk := f.read(8 * MIB):
            digest.update(chunk)
    return digest.hexdigest()


# The first byte is timed on this many cold files (the median is the figure), each in a
# directory of its own under ttfb/: pffs's dataset preload may then take ttfb/ for a dataset,
# never the bucket's root, so the scenarios after it stay cold.
TTFB_SAMPLES = 3


def ttfb_directories() -> list[str]:
    """The directories of the first byte's samples, each holding one 1 MiB `f.bin`."""
    return [f"ttfb/{n}" for n in range(TTFB_SAMPLES)]


def upload(
    server: Server,
    sizes: Sizes,
    workdir: str,
    bucket: str = "pffs-bench",
    clients: client_patterns.ClientSizes | None = None,
) -> Dataset:
    """The dataset in `bucket`; with `clients`, the clients scenario's files too."""
    s3 = client(server)
    s3.create_bucket(Bucket=bucket)
    local_large = os.path.join(workdir, f"large-{sizes.large}.bin")
    local_parallel = os.path.join(workdir, f"parallel-{sizes.parallel}.bin")
    sha = make_local_file(local_large, sizes.large)
    make_local_file(local_parallel, sizes.parallel)
    transfer = TransferConfig(multipart_chunksize=64 * MIB, max_concurrency=4)
    s3.upload_file(local_large, bucket, "large.bin", Config=transfer)
    s3.upload_file(local_parallel, bucket, "parallel.bin", Config=transfer)
    large_objects = [(CHECKPOINT_KEY, sizes.checkpoint)]
    large_objects += [(key, sizes.shard_size) for key in shard_keys(sizes.shard_files)]
    digests = {}
    for key, size in large_objects:  # one at a time: one local copy on disk at once
        local = os.path.join(workdir, "object.bin")
        digests[key] = make_local_file(local, size)
        s3.upload_file(local, bucket, key, Config=transfer)
        os.remove(local)
    lazy_sha256 = {}
    if sizes.lazy_tensors:
        local = os.path.join(workdir, "object.bin")
        lazy_sha256 = write_checkpoint(local, sizes.lazy_tensors)
        s3.upload_file(local, bucket, LAZY_KEY, Config=transfer)
        os.remove(local)
    for directory in ttfb_directories():
        s3.put_object(Bucket=bucket, Key=f"{directory}/f.bin", Body=os.urandom(MIB))
    # s3rver 3 leaves a prefix holding only sub-prefixes out of a delimited listing: one object
    # directly in ttfb/ makes it show at the top of the bucket (as tree/'s marker does).
    s3.put_object(Bucket=bucket, Key="ttfb/about", Body=b"first byte samples")
    client_data = None
    if clients is not None:
        client_data = client_patterns.generate(
            clients, workdir, lambda local, key: s3.upload_file(local, bucket, key, Config=transfer)
        )
    tops = {key.split("/")[0] for key, _ in large_objects} | {LAZY_KEY.split("/")[0]}
    for top in tops | (set(client_patterns.TOPS) if clients is not None else set()):
        # The same for the large objects' top directories (each holds one directory below it).
        s3.put_object(Bucket=bucket, Key=f"{top}/about", Body=b"large objects below")
    s3.put_object(Bucket=bucket, Key=EPOCH_PARENT_MARKER, Body=b"the training set is in train/")
    small_keys = [f"small/f{i:05d}.bin" for i in range(sizes.small_files)]
    wide_keys = [f"wide/o{i:05d}" for i in range(sizes.wide_files)]
    epoch_keys = epoch_names(sizes.epoch_files)
    objects = [(k, lambda: os.urandom(SMALL_SIZE)) for k in small_keys]
    objects += [(k, lambda: b"w" * 16) for k in wide_keys]
    objects += [(k, lambda: os.urandom(sizes.epoch_size)) for k in epoch_keys]
    in_threads(16, lambda kv: s3.put_object(Bucket=bucket, Key=kv[0], Body=kv[1]()), objects)
    dataset = Dataset(bucket, sizes, local_large, sha, small_keys, wide_keys, epoch_keys)
    dataset.checkpoint_sha256 = digests.pop(CHECKPOINT_KEY)
    dataset.lazy_sha256 = lazy_sha256
    dataset.clients = client_data
    dataset.shard_sha256 = {os.path.basename(key): digest for key, digest in digests.items()}
    verify(server, dataset)
    large_keys = ["parallel.bin", *(key for key, _ in large_objects)]
    large_keys += [LAZY_KEY] if sizes.lazy_tensors else []
    large_keys += client_patterns.keys(client_data) if client_data is not None else []
    prime(server, bucket, large_keys)
    return dataset


def prime(server: Server, bucket: str, keys: list[str]) -> None:
    """Read each object once, whole, straight from the store, before any system does.

    So no system is timed on an object it is the first to read after its upload: a store may
    serve that read at a higher cost (suspected of RGW once, not reproduced since:
    docs/notes/rgw-sequential.md), and the system that read first would pay it alone.
    large.bin needs none: verify() has read it, and the server ceiling reads it again before
    every repetition."""
    s3 = client(server)

    def read(key: str) -> None:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"]
        while body.read(8 * MIB):
            pass

    in_threads(4, read, keys)


# The training set's directory. One level down, as a bucket of datasets lays one out, so no
# other scenario opens files in a directory beside it: pffs's dataset preload takes opens in
# sibling directories within its trigger window for one dataset (ImageNet's classes), and at the
# bucket's top the training set and the scenarios after it would be siblings.
EPOCH_DIRECTORY = "datasets/train"
# One object directly in the training set's parent, for s3rver 3 (as ttfb/about): a file, so no
# directory beside the training set; no scenario opens it.
EPOCH_PARENT_MARKER = "datasets/about"


def epoch_names(count: int) -> list[str]:
    """The training set's keys: one directory, as a dataset of samples is laid out."""
    return [f"{EPOCH_DIRECTORY}/sample{i:06d}.bin" for i in range(count)]


def verify(server: Server, dataset: Dataset) -> None:
    """The store holds what was generated: sizes and counts, and the large file's bytes."""
    s3 = client(server)
    head = s3.head_object(Bucket=dataset.bucket, Key="large.bin")
    if head["ContentLength"] != dataset.sizes.large:
        raise RuntimeError(f"{server.name}: large.bin has {head['ContentLength']} bytes")
    digest = hashlib.sha256()
    body = s3.get_object(Bucket=dataset.bucket, Key="large.bin")["Body"]
    while chunk := body.read(8 * MIB):
        digest.update(chunk)
    if digest.hexdigest() != dataset.large_sha256:
        raise RuntimeError(f"{server.name}: large.bin differs from what was uploaded")
    for prefix, expected in (
        ("small/", len(dataset.small_keys)),
        ("wide/", len(dataset.wide_keys)),
        (f"{EPOCH_DIRECTORY}/", len(dataset.epoch_keys)),
    ):
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=dataset.bucket, Prefix=prefix)
        count = sum(len(page.get("Contents", [])) for page in pages)
        if count != expected:
            raise RuntimeError(
                f"{server.name}: {count} objects under {prefix}, expected {expected}"
            )
