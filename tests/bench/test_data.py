"""The bench's dataset (bench.data): after its upload, every large object is read once straight
from the store, so no system is the first to read one (counted at the store's side)."""

from __future__ import annotations

import os

from bench import data as ds
from bench.counting import CountingProxy
from bench.largeobjects import CHECKPOINT_KEY, shard_keys
from bench.lazyload import KEY as LAZY_KEY
from bench.servers import Server
from pffs.testing.servers import MotoServer

KIB = 1024


def test_the_upload_reads_each_large_object_once_before_any_system(
    moto: MotoServer, tmp_path
) -> None:
    env = os.environ
    near = Server("moto", moto.endpoint_url, env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"])
    sizes = ds.Sizes(large=256 * KIB, parallel=128 * KIB, small_files=2, wide_files=2,
                     write=64 * KIB, epoch_files=2, epoch_size=4 * KIB, checkpoint=192 * KIB,
                     shard_files=3, shard_size=64 * KIB, lazy_tensors=2)  # fmt: skip
    proxy = CountingProxy(near)
    try:
        dataset = ds.upload(proxy.server, sizes, str(tmp_path), bucket="primed")
    finally:
        counts = proxy.stop()
    primed = ["parallel.bin", CHECKPOINT_KEY, *shard_keys(3), LAZY_KEY]
    # verify() reads large.bin; the prime reads each other large object (the lazily loaded
    # checkpoint too) whole, once: every byte of them comes back from the store.
    assert counts["GET"] == 1 + len(primed), counts
    whole = sizes.large + sizes.parallel + sizes.checkpoint + 3 * sizes.shard_size
    assert proxy.store_bytes > whole, (proxy.store_bytes, whole)
    assert dataset.shard_sha256 and dataset.lazy_sha256
