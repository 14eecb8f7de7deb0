"""No request ends a grouped mount: a real `pffs mount` in a group, its peer port (127.0.0.2) sent
malformed heads, targets, header values (non-ASCII signatures among them: one once ended the
mount) and byte soup, from the test process over real sockets. After every malformed request
(hypothesis) and after every batch of a 10,000 (seeded), the member still answers a good signed
request with exact bytes, its RSS stays bounded, and its refusal log stays within its rate."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pffs.cache.keys import ObjectBlocks
from pffs.group import signing
from pffs.group.protocol import BlockRequest
from pffs.group.server import REFUSAL_LOG_BURST
from tests.conftest import metric_value, stats_snapshot
from tests.mount.groupasker import Asker, one_object
from tests.mount.test_group import MIB, SECRET, Cluster, group_mounts, log_of, proxy

__all__ = ["proxy"]  # the fixture, shared with the group's tests
pytestmark = pytest.mark.mount

SIGNING_HEADERS = [signing.TIME, signing.NONCE, signing.SIGNATURE, signing.TO, signing.PROOF]


class Member:
    """One grouped mount serving one file of two blocks, and an asker of it."""

    def __init__(self, mnt: Path, cluster: Cluster, asker: Asker, data: bytes) -> None:
        self.mnt = mnt
        self.cluster = cluster
        self.asker = asker
        self.data = data

    def answers_exactly(self) -> None:
        assert self.asker.block(0) == self.data[:MIB]
        assert self.asker.block(1) == self.data[MIB:]

    def rss_kib(self) -> int:
        pid = int(stats_snapshot(self.mnt)["pid"])
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise AssertionError("no VmRSS")


@pytest.fixture
def member(s3, bucket, proxy, tmp_path) -> Iterator[Member]:
    obj = one_object(s3, bucket, proxy.endpoint_url, MIB + 4321, MIB)
    cluster = Cluster(tmp_path, 1)
    host, port = cluster.addresses["node0"]
    asker = Asker("node0", host, port, SECRET.encode(), obj.blocks, obj.proof_key)
    with group_mounts(cluster, bucket, proxy.endpoint_url) as mounts:
        yield Member(mounts["node0"], cluster, asker, obj.data)


def _line(parts: list[bytes]) -> bytes:
    return b"".join(parts)


def signed_head(asker: Asker, target: str, overrides: dict[str, bytes]) -> bytes:
    """A request head signed right for `target`, then some header values replaced by raw bytes
    (non-ASCII ones included)."""
    headers = {
        k: v.encode()
        for k, v in signing.sign(asker.secret, "GET", target, asker.name, asker.proof_key).items()
    }
    headers.update(overrides)
    lines = [b"GET " + target.encode("utf-8", "surrogateescape") + b" HTTP/1.1", b"host: x"]
    lines += [name.encode() + b": " + value for name, value in headers.items()]
    return b"\r\n".join(lines) + b"\r\n\r\n"


header_value = st.binary(max_size=120).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))
bad_paths = st.sampled_from(
    ["/etc/shadow", "../../etc/passwd", "d//f", "", ".", "a/./b", "..", "d\0x", "data/f00.bin/.."]
)


def hostile_requests(asker: Asker) -> st.SearchStrategy[bytes]:
    """Raw bytes a hostile peer may send: soup, heads of any shape, signed heads with bad
    header values, signed heads for targets outside the source or of nonsense fields."""
    soup = st.binary(max_size=4096)
    heads = st.builds(
        lambda method, target, version, headers: _line(
            [method, b" ", target, b" ", version, b"\r\n"]
            + [name + b": " + value + b"\r\n" for name, value in headers]
            + [b"\r\n"]
        ),
        st.sampled_from([b"GET", b"POST", b"HEAD", b"G\xffT", b"", b"GET GET"]),
        st.one_of(
            st.binary(max_size=300),
            st.just(BlockRequest(asker.blocks, 0).target().encode()),
            st.text(max_size=200).map(lambda t: ("/v3/block?" + t).encode("utf-8")),
        ),
        st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/9.9", b"", b"\xff"]),
        st.lists(
            st.tuples(
                st.one_of(
                    st.sampled_from([h.encode() for h in SIGNING_HEADERS]), st.binary(max_size=20)
                ),
                header_value,
            ),
            max_size=8,
        ),
    )
    bad_values = st.dictionaries(st.sampled_from(SIGNING_HEADERS), header_value, min_size=1)
    signed_bad_values = bad_values.map(
        lambda values: signed_head(asker, BlockRequest(asker.blocks, 0).target(), values)
    )
    blocks = asker.blocks
    signed_bad_targets = st.one_of(
        bad_paths.map(
            lambda path: BlockRequest(
                ObjectBlocks(blocks.source, blocks.principal, path, blocks.version, 10, 4), 0
            ).target()
        ),
        st.text(max_size=200).map(lambda t: "/v3/block?" + t),
    ).map(lambda target: signed_head(asker, target, {}))
    return st.one_of(soup, heads, signed_bad_values, signed_bad_targets)


def test_malformed_requests_never_stop_a_member(member: Member) -> None:
    asker = member.asker
    member.answers_exactly()
    sent = [0]

    @settings(
        max_examples=300,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(request=hostile_requests(asker))
    def property_(request: bytes) -> None:
        reply = asker.send_raw(request)
        assert not reply.startswith(b"HTTP/1.1 200"), reply[:200]
        sent[0] += 1
        assert asker.block(0) == member.data[:MIB]  # the next good request: exact bytes

    started = time.monotonic()
    property_()
    member.answers_exactly()
    snapshot = stats_snapshot(member.mnt)
    assert metric_value(snapshot, "pffs_group_refusals_total") >= sent[0] // 2
    minutes = (time.monotonic() - started) // 60 + 1
    refused_lines = log_of(member.cluster, "node0").count("refused a request")
    assert refused_lines <= REFUSAL_LOG_BURST * minutes, refused_lines


def malformed(rng: random.Random, asker: Asker) -> bytes:
    """One of the kinds hostile_requests makes, drawn from a seeded generator (fast)."""
    kind = rng.randrange(5)
    target = BlockRequest(asker.blocks, 0).target()
    if kind == 0:
        return rng.randbytes(rng.randrange(1, 2048))
    if kind == 1:
        return b"GET " + rng.randbytes(rng.randrange(1, 200)) + b" HTTP/1.1\r\n\r\n"
    if kind == 2:  # the request that once ended the mount: a current time, non-ASCII signature
        return signed_head(
            asker, target, {signing.SIGNATURE: bytes(rng.choices(range(128, 256), k=64))}
        )
    if kind == 3:
        name = rng.choice(SIGNING_HEADERS)
        return signed_head(
            asker, target, {name: rng.randbytes(rng.randrange(0, 100)).replace(b"\n", b"")}
        )
    path = rng.choice(["/etc/shadow", "../x", "a//b", "..", ""])
    b = asker.blocks
    bad = ObjectBlocks(b.source, b.principal, path, b.version, b.size, b.block_size)
    return signed_head(asker, BlockRequest(bad, 0).target(), {})


def test_ten_thousand_malformed_requests(member: Member) -> None:
    asker = member.asker
    rng = random.Random(48)
    member.answers_exactly()
    rss = []
    for _batch in range(10):
        for _ in range(1000):
            asker.send_raw(malformed(rng, asker))
        member.answers_exactly()
        rss.append(member.rss_kib())
    # Bounded: after the first batch (buffers and counters in place), no growth worth naming.
    assert max(rss[1:]) - rss[0] < 32 * 1024, rss
    snapshot = stats_snapshot(member.mnt)
    assert metric_value(snapshot, "pffs_group_refusals_total") >= 10_000 * 0.9
