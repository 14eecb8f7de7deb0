"""Claims of a shared tier's blocks (pffs.group.claims) on real S3 servers through pffs's S3
backend: moto and Ceph RGW 16 refuse a second `If-None-Match: *` PUT of one name, s3rver
ignores the condition (the read-back fallback). Racing mounts are Claims of their own tokens in
one trio run; nothing here is timed."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import uuid
from collections.abc import Iterator

import boto3
import pytest
import trio

from pffs.backends import open_backend
from pffs.backends.base import writable
from pffs.cache.keys import ObjectBlocks
from pffs.config import SourceConfig
from pffs.errors import NotFound
from pffs.flow.permits import SourceFlow
from pffs.group import claims, shared
from pffs.group.claims import Claims
from pffs.group.shared import SharedTier
from pffs.metrics import snapshot
from pffs.mounting.grouping import _SharedStore
from tests.conftest import metric_value


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


# Mid-period, so a claim of the previous period has lapsed (one of its first WAIT seconds would
# still honour it): the tests pass the claims this clock, never the machine's.
PERIOD_START = 1_000 * claims.PERIOD


def mid_period() -> float:
    return PERIOD_START + claims.PERIOD / 2


def race(store: _SharedStore, conditional: bool, name: str, count: int) -> list[str]:
    """`count` mounts claiming block object `name` at once: each one's outcome."""
    outcomes: list[str] = []

    async def main() -> None:
        flow = SourceFlow(count)

        async def one() -> None:
            claimer = Claims(store, conditional, flow, clock=mid_period)
            outcomes.append(await claimer.claim(name))

        async with trio.open_nursery() as nursery:
            for _ in range(count):
                nursery.start_soon(one)

    trio.run(main)
    return outcomes


def claim_once(claimer: Claims, name: str) -> str:
    async def main() -> str:
        return await claimer.claim(name)

    return trio.run(main)


def test_moto_honours_the_condition_and_one_of_eight_wins(moto, bucket) -> None:
    store = store_of(moto.endpoint_url, bucket)
    assert claims.probe(store, "")
    assert race(store, True, "a/0", 8).count("won") == 1
    assert race(store, True, "a/0", 8).count("won") == 0  # claimed: everyone waits
    # A claim whose mount never wrote its block lapses with its period: claimed anew, by one.
    # One after the other: the race above is moto's conditional write under eight at once,
    # which a loaded machine once let two through after a delete (its check and its write
    # are two steps); the lapse is the claims' logic, not moto's.
    store.delete(claims.claim_name("a/0", mid_period()))
    store.put_new(claims.claim_name("a/0", mid_period() - claims.PERIOD), b"dead")
    claimers = [Claims(store, True, SourceFlow(1), clock=mid_period) for _ in range(2)]
    assert [claim_once(claimer, "a/0") for claimer in claimers] == ["won", "lost"]


def test_a_released_claim_can_be_claimed_again(moto, bucket) -> None:
    store = store_of(moto.endpoint_url, bucket)
    first = Claims(store, True, SourceFlow(1), clock=mid_period)
    assert claim_once(first, "b/3") == "won"
    trio.run(first.release, "b/3")
    assert claim_once(Claims(store, True, SourceFlow(1), clock=mid_period), "b/3") == "won"


def test_a_claim_of_the_previous_period_holds_for_its_first_seconds(moto, bucket) -> None:
    """A block claimed just before a period ends is not claimed again just after it: its
    claimant is still fetching. Past the first WAIT seconds it has lapsed."""
    store = store_of(moto.endpoint_url, bucket)
    dying = PERIOD_START - 0.1  # the last moment of the previous period
    assert claim_once(Claims(store, True, SourceFlow(1), clock=lambda: dying), "f/0") == "won"
    early = Claims(store, True, SourceFlow(1), clock=lambda: PERIOD_START + 0.1)
    assert claim_once(early, "f/0") == "lost"
    # Its own claim, written before it saw the previous one, is gone: nobody waits on it.
    with pytest.raises(NotFound):
        store.read_range(claims.claim_name("f/0", PERIOD_START + 0.1), 0, 64, None)
    assert claim_once(Claims(store, True, SourceFlow(1), clock=mid_period), "f/0") == "won"


def test_a_failing_store_is_a_claim_won(tmp_path) -> None:
    """No shared store answering: the mount goes to the origin, as without claims."""
    from pffs.testing.servers import free_port

    store = store_of(f"http://127.0.0.1:{free_port()}", "gone")
    assert claim_once(Claims(store, True, SourceFlow(1)), "c/0") == "failed"


def test_s3rver_ignores_the_condition_and_claims_are_read_back(s3rver_store) -> None:
    store = s3rver_store
    assert not claims.probe(store, "")
    first, second = (Claims(store, False, SourceFlow(1), clock=mid_period) for _ in range(2))
    assert claim_once(first, "d/0") == "won"
    assert claim_once(first, "d/0") == "won"  # its own claim
    assert claim_once(second, "d/0") == "lost"  # a fresh claim of another mount
    store.put_new(claims.claim_name("d/1", mid_period() - claims.PERIOD), b"dead")
    assert claim_once(second, "d/1") == "won"  # one of a past period has lapsed
    assert race(store, False, "d/2", 8).count("won") >= 1


def test_ceph_rgw_honours_the_condition(rgw, rgw_s3) -> None:
    name = f"t-{uuid.uuid4().hex[:12]}"
    rgw_s3.create_bucket(Bucket=name)
    store = store_of(rgw.endpoint, name)
    assert claims.probe(store, "")
    assert race(store, True, "e/0", 4).count("won") == 1


class LandsWhileClaiming:
    """The real moto store, but another mount's block object lands (and that mount's claim is
    gone) between this mount's first look and its claim: the race a won claim's second look
    closes. Not a mock: every request reaches moto; only the order is forced."""

    def __init__(self, store: _SharedStore, name: str, body: bytes) -> None:
        self.store, self.name, self.body = store, name, body
        self.read_range = store.read_range
        self.delete = store.delete

    def put(self, path: str, local_path: str) -> object:
        return self.store.put(path, local_path)

    def put_new(self, path: str, body: bytes) -> bool:
        if path.startswith(self.name + ".claim-"):
            with open_body(self.body) as local:
                self.store.put(self.name, local)
        return self.store.put_new(path, body)


@contextlib.contextmanager
def open_body(body: bytes) -> Iterator[str]:
    with tempfile.NamedTemporaryFile() as f:
        f.write(body)
        f.flush()
        yield f.name


def test_a_won_claim_looks_again_before_the_origin(moto, bucket) -> None:
    """The block landed between the miss and the claim: the tier gives it, and the claim
    just won is released; the origin is not asked."""
    store = store_of(moto.endpoint_url, bucket)
    blocks = ObjectBlocks("s3://origin", "me", "train/0.bin", "etag-1", 1000, 4096)
    data = os.urandom(1000)
    name = shared.object_name(blocks, 0)
    key = shared.tier_key(b"the-tier-secret-of-the-test")
    racing = LandsWhileClaiming(store, name, shared.pack(key, blocks, 0, data))
    flow = SourceFlow(2)
    # Nothing is written here (the block is found): no background tasks to run writes.
    tier = SharedTier(
        racing,
        "",
        flow,
        key,
        Claims(racing, True, flow, clock=mid_period),
        background=lambda write: False,
    )
    before = metric_value(snapshot(), "pffs_group_tier_origin_total", reason="claimed")

    async def main() -> bytes | None:
        return await tier.fetch_block(blocks, 0)

    assert trio.run(main) == data
    assert metric_value(snapshot(), "pffs_group_tier_origin_total", reason="claimed") == before
    with pytest.raises(NotFound):  # released: no waiter waits on it
        store.read_range(claims.claim_name(name, mid_period()), 0, 64, None)


class SlowWrites:
    """The real s3rver store, each claim write taking `delay` seconds more (a loaded server):
    every request reaches s3rver, only slower."""

    def __init__(self, store: _SharedStore, delay: float) -> None:
        self.store, self.delay = store, delay
        self.read_range = store.read_range
        self.delete = store.delete

    def put_new(self, path: str, body: bytes) -> bool:
        time.sleep(self.delay)
        return self.store.put_new(path, body)


def test_s3rver_read_back_waits_out_a_slow_write_of_another_mount(s3rver_store) -> None:
    """Mount B found no claim while mount A's write was on its way, and B's write lands after
    A's; A reads back after its own write's time twice, so it sees B's: one of them wins."""
    slow = SlowWrites(s3rver_store, 0.5)
    outcomes: list[str] = []

    async def main() -> None:
        async def one(start: float) -> None:
            await trio.sleep(start)
            claimer = Claims(slow, False, SourceFlow(1), clock=mid_period)
            outcomes.append(await claimer.claim("g/0"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, 0.0)
            nursery.start_soon(one, 0.1)

    trio.run(main)
    assert sorted(outcomes) == ["lost", "won"]
