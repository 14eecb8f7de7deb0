"""Claims of a shared tier's blocks (pffs.group.claims) on real S3 servers through pffs's S3
backend: moto and Ceph RGW 16 refuse a second `If-None-Match: *` PUT of one name, s3rver
ignores the condition (the read-back fallback). Racing mounts are Claims of their own tokens in
one trio run; nothing here is timed."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import boto3
import pytest
import trio

from pffs.backends import open_backend
from pffs.backends.base import writable
from pffs.config import SourceConfig
from pffs.group import claims
from pffs.group.claims import Claims
from pffs.mounting.grouping import _SharedStore


def store_of(endpoint: str, bucket: str) -> _SharedStore:
    backend = open_backend(SourceConfig(url=f"s3://{bucket}/tier", endpoint_url=endpoint))
    writer = writable(backend)
    assert writer is not None
    return _SharedStore(backend, writer)


@pytest.fixture
def s3rver_store(tmp_path) -> Iterator[_SharedStore]:
    from bench.servers import Launcher, Unavailable

    launcher = Launcher(str(tmp_path), os.path.expanduser("~/.cache/pffs-bench"))
    try:
        server = launcher.s3rver()
    except Unavailable as exc:
        pytest.skip(f"s3rver: {exc}")
    try:
        environ = server.env()
        keys = {
            "aws_access_key_id": environ["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": environ["AWS_SECRET_ACCESS_KEY"],
        }
        boto3.client("s3", endpoint_url=server.endpoint_url, **keys).create_bucket(Bucket="tier")
        saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
        os.environ.update(AWS_ACCESS_KEY_ID=keys["aws_access_key_id"])
        os.environ.update(AWS_SECRET_ACCESS_KEY=keys["aws_secret_access_key"])
        try:
            yield store_of(server.endpoint_url, "tier")
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    finally:
        server.stop()


def race(store: _SharedStore, conditional: bool, name: str, count: int) -> list[bool]:
    """`count` mounts claiming block object `name` at once: who won."""
    outcomes: list[bool] = []

    async def main() -> None:
        limiter = trio.CapacityLimiter(count)

        async def one() -> None:
            outcomes.append(await Claims(store, conditional, limiter).claim(name))

        async with trio.open_nursery() as nursery:
            for _ in range(count):
                nursery.start_soon(one)

    trio.run(main)
    return outcomes


def claim_once(claimer: Claims, name: str) -> bool:
    async def main() -> bool:
        return await claimer.claim(name)

    return trio.run(main)


def test_moto_honours_the_condition_and_one_of_eight_wins(moto, bucket) -> None:
    store = store_of(moto.endpoint_url, bucket)
    assert claims.probe(store, "")
    assert race(store, True, "a/0", 8).count(True) == 1
    assert race(store, True, "a/0", 8).count(True) == 0  # claimed: everyone waits
    # A claim whose mount never wrote its block lapses with its period: claimed anew, by one.
    period = int(time.time() // claims.PERIOD)
    store.delete(f"a/0.claim-{period}")
    store.put_new(f"a/0.claim-{period - 1}", b"dead")
    assert race(store, True, "a/0", 8).count(True) == 1


def test_a_released_claim_can_be_claimed_again(moto, bucket) -> None:
    store = store_of(moto.endpoint_url, bucket)
    first = Claims(store, True, trio.CapacityLimiter(1))
    assert claim_once(first, "b/3")
    trio.run(first.release, "b/3")
    assert claim_once(Claims(store, True, trio.CapacityLimiter(1)), "b/3")


def test_a_failing_store_is_a_claim_won(tmp_path) -> None:
    """No shared store answering: the mount goes to the origin, as without claims."""
    from pffs.testing.servers import free_port

    store = store_of(f"http://127.0.0.1:{free_port()}", "gone")
    assert claim_once(Claims(store, True, trio.CapacityLimiter(1)), "c/0")


def test_s3rver_ignores_the_condition_and_claims_are_read_back(s3rver_store) -> None:
    store = s3rver_store
    assert not claims.probe(store, "")
    first, second = (Claims(store, False, trio.CapacityLimiter(1)) for _ in range(2))
    assert claim_once(first, "d/0")
    assert claim_once(first, "d/0")  # its own claim
    assert not claim_once(second, "d/0")  # a fresh claim of another mount
    store.put_new(f"d/1.claim-{int(time.time() // claims.PERIOD) - 1}", b"dead")
    assert claim_once(second, "d/1")  # one of a past period has lapsed
    assert race(store, False, "d/2", 8).count(True) >= 1


def test_ceph_rgw_honours_the_condition(rgw, rgw_s3) -> None:
    name = f"t-{uuid.uuid4().hex[:12]}"
    rgw_s3.create_bucket(Bucket=name)
    store = store_of(rgw.endpoint, name)
    assert claims.probe(store, "")
    assert race(store, True, "e/0", 4).count(True) == 1
