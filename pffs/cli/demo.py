"""`pffs demo`: a generated dataset served from an in-process S3 server, mounted and read back.

Nothing else needs to run: moto's server starts in this process on 127.0.0.1, the dataset is
uploaded to it, `pffs mount` brings up the daemon, and the demo lists and reads the tree
through the kernel, checks every byte against what it uploaded, prints timings, and unmounts.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from pffs.config import CacheConfig, FuseConfig, SourceConfig, single_source
from pffs.errors import PffsError, UsageError
from pffs.mounting.kernel import find_mount, fusermount, wait_unmounted
from pffs.testing.servers import DUMMY_CREDENTIALS, free_port

T = TypeVar("T")
MIB = 1 << 20


def _timed(label: str, fn: Callable[[], T], nbytes: int | None = None) -> T:
    started = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - started
    rate = f"  {nbytes / MIB / elapsed:8.1f} MiB/s" if nbytes else ""
    print(f"  {label:<46} {elapsed * 1000:9.1f} ms{rate}")
    return result


def make_dataset(files: int, large_mib: int) -> dict[str, bytes]:
    """Small "samples" in class directories, one large "shard", deterministic bytes."""
    rng = random.Random(2024)
    dataset = {
        f"train/class-{i % 8}/sample-{i:05d}.bin": rng.randbytes(rng.randrange(1, 64 * 1024))
        for i in range(files)
    }
    dataset["shards/shard-000.tar"] = rng.randbytes(large_mib * MIB)
    dataset["README.txt"] = b"A generated sample dataset served by pffs.\n"
    return dataset


def run_demo(files: int = 200, large_mib: int = 16) -> int:
    import boto3

    try:
        from moto.server import ThreadedMotoServer
    except ImportError:
        raise UsageError(
            "pffs demo runs moto's S3 server, which is not installed: pip install 'pffs[demo]'"
        ) from None

    from pffs.mounting.daemon import start_daemon

    for key, value in DUMMY_CREDENTIALS.items():
        os.environ.setdefault(key, value)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's per-request access log
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    mountpoint = tempfile.mkdtemp(prefix="pffs-demo-")
    cache_dir = tempfile.mkdtemp(prefix="pffs-demo-cache-")
    try:
        print(f"pffs demo: in-process S3 (moto) at {endpoint}, mountpoint {mountpoint}")
        s3 = boto3.client("s3", endpoint_url=endpoint)
        s3.create_bucket(Bucket="demo-dataset")
        dataset = make_dataset(files, large_mib)
        total = sum(len(v) for v in dataset.values())

        def upload() -> None:
            with ThreadPoolExecutor(8) as pool:
                put = lambda kv: s3.put_object(Bucket="demo-dataset", Key=kv[0], Body=kv[1])  # noqa: E731
                list(pool.map(put, dataset.items()))

        print(f"\n{len(dataset)} objects, {total / MIB:.1f} MiB:")
        _timed("upload the dataset", upload, total)
        config = single_source(
            SourceConfig(url="s3://demo-dataset", endpoint_url=endpoint),
            FuseConfig(mountpoint=mountpoint, read_only=True),
            cache=CacheConfig(disk_dir=cache_dir),
            log_file=os.path.join(tempfile.gettempdir(), "pffs-demo.log"),
        )
        _timed("pffs mount s3://demo-dataset", lambda: start_daemon(config))
        if _exercise(mountpoint, dataset) != 0:
            return 1
        # The second epoch: a new mount over the same cache directory, served from local disk.
        print("\nremounted over the same disk cache (the second epoch):")
        _timed("pffs umount", lambda: fusermount(mountpoint))
        wait_unmounted(mountpoint)
        _timed("pffs mount s3://demo-dataset", lambda: start_daemon(config))
        return _exercise(mountpoint, dataset)
    except PffsError as exc:
        print(f"pffs demo: {exc}")
        return exc.exit_code
    finally:
        entry = find_mount(mountpoint)
        if entry is not None:
            _timed("pffs umount", lambda: fusermount(mountpoint))
        server.stop()
        shutil.rmtree(cache_dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.rmdir(mountpoint)


def _exercise(mountpoint: str, dataset: dict[str, bytes]) -> int:
    def walk() -> list[str]:
        found = []
        for directory, _, names in os.walk(mountpoint):
            found += [os.path.relpath(os.path.join(directory, n), mountpoint) for n in names]
        return sorted(found)

    listed = _timed("list the whole tree (os.walk)", walk)
    if listed != sorted(dataset):
        print(f"  MISMATCH: listed {len(listed)} files, expected {len(dataset)}")
        return 1
    small = {k: v for k, v in dataset.items() if k.startswith("train/")}
    small_bytes = sum(len(v) for v in small.values())

    def read_small() -> int:
        bad = 0
        for key, data in small.items():
            with open(os.path.join(mountpoint, key), "rb") as f:
                bad += f.read() != data
        return bad

    bad = _timed(f"read {len(small)} small files, check bytes", read_small, small_bytes)
    shard = dataset["shards/shard-000.tar"]

    def read_shard() -> bool:
        digest = hashlib.sha256()
        with open(os.path.join(mountpoint, "shards/shard-000.tar"), "rb") as f:
            while chunk := f.read(MIB):
                digest.update(chunk)
        return digest.digest() == hashlib.sha256(shard).digest()

    ok = _timed("read the large file, check sha256", read_shard, len(shard))
    ok_again = _timed("read it again (kernel page cache)", read_shard, len(shard))
    if bad or not ok or not ok_again:
        print(f"  MISMATCH: {bad} small files differ, large file ok={ok and ok_again}")
        return 1
    print("\nall bytes match the source.")
    return 0
