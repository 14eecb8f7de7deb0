"""The counting proxy (bench.counting): requests counted by kind from the HTTP stream, bodies
of every framing skipped, and real S3 traffic through it counted and answered intact."""

from __future__ import annotations

import os
from typing import Any

import boto3
import pytest

from bench.counting import CountingProxy, RequestParser, kind_of
from bench.servers import Server
from pffs.testing.servers import MotoServer


@pytest.mark.parametrize(
    ("method", "target", "kind"),
    [
        ("GET", "/bucket/train/a.bin", "GET"),
        ("GET", "/bucket/a%20b?versionId=3", "GET"),
        ("HEAD", "/bucket/a", "HEAD"),
        ("HEAD", "/bucket", "HEAD"),
        ("GET", "/bucket?list-type=2&prefix=train%2F&delimiter=%2F", "LIST"),
        ("GET", "/bucket/?prefix=x", "LIST"),
        ("GET", "/bucket", "LIST"),
        ("GET", "/bucket?location", "OTHER"),
        ("PUT", "/bucket/a", "OTHER"),
        ("DELETE", "/bucket/a", "OTHER"),
    ],
)
def test_each_request_has_its_kind(method: str, target: str, kind: str) -> None:
    assert kind_of(method, target) == kind


def test_bodies_are_skipped_whatever_their_framing_and_however_the_stream_is_cut() -> None:
    body = b"GET /b/fake HTTP/1.1\r\n\r\n" * 3  # looks like requests, is data
    chunked = b"%x\r\n%s\r\n0\r\nx-trailer: 1\r\n\r\n" % (len(body), body)
    stream = (
        b"PUT /b/k HTTP/1.1\r\nHost: s\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        + b"HEAD /b/k HTTP/1.1\r\nHost: s\r\n\r\n"
        + b"PUT /b/c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        + chunked
        + b"GET /b?list-type=2 HTTP/1.1\r\nHost: s\r\n\r\n"
        + b"GET /b/k HTTP/1.1\r\nHost: s\r\n\r\n"
    )
    expected = {"OTHER": 2, "HEAD": 1, "LIST": 1, "GET": 1}
    for step in (1, 2, 7, len(stream)):
        parser = RequestParser()
        for start in range(0, len(stream), step):
            parser.feed(stream[start : start + step])
        assert dict(parser.counts) == expected, step


def test_a_request_still_arriving_is_not_counted() -> None:
    parser = RequestParser()
    parser.feed(b"GET /b/k HTTP/1.1\r\nHost: s\r\n")
    assert sum(parser.counts.values()) == 0
    parser.feed(b"\r\n")
    assert parser.counts["GET"] == 1


def _near(moto: MotoServer) -> Server:
    env = os.environ
    return Server("moto", moto.endpoint_url, env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"])


def _client_of(proxy: CountingProxy) -> Any:
    """An S3 client that talks to the store through `proxy`."""
    return boto3.client(
        "s3",
        endpoint_url=proxy.server.endpoint_url,
        aws_access_key_id=proxy.server.access_key,
        aws_secret_access_key=proxy.server.secret_key,
        region_name="us-east-1",
    )


def test_s3_traffic_through_the_proxy_is_counted_and_answered(
    moto: MotoServer, s3, bucket: str
) -> None:
    for index in range(5):
        s3.put_object(Bucket=bucket, Key=f"d/o{index}", Body=bytes([index]) * 1000)
    proxy = CountingProxy(_near(moto))
    try:
        through = _client_of(proxy)
        through.get_object(Bucket=bucket, Key="d/o0")["Body"].read()
        before_restart = proxy.restart_count()
        first_get_bytes = proxy.store_bytes
        bodies = [through.get_object(Bucket=bucket, Key=f"d/o{i}")["Body"].read() for i in range(3)]
        through.head_object(Bucket=bucket, Key="d/o4")
        pages = through.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix="d/", PaginationConfig={"PageSize": 2}
        )
        listed = [item["Key"] for page in pages for item in page["Contents"]]
        through.put_object(Bucket=bucket, Key="d/new", Body=b"x" * 100_000)
    finally:
        counts = proxy.stop()
    assert bodies == [bytes([i]) * 1000 for i in range(3)]
    assert listed == [f"d/o{i}" for i in range(5)]
    assert before_restart == {"GET": 1, "HEAD": 0, "LIST": 0, "OTHER": 0}
    assert counts == {"GET": 3, "HEAD": 1, "LIST": 3, "OTHER": 1}
    # The store's bytes: each GET's body and its response head, nothing of the requests.
    assert 1000 < first_get_bytes < 1000 + 2000, first_get_bytes
    assert 3000 < proxy.store_bytes < 100_000, proxy.store_bytes


def test_a_large_answer_passes_intact_and_its_bytes_are_counted(
    moto: MotoServer, s3, bucket: str
) -> None:
    """The store's answers are spliced through a pipe in chunks of at most 1 MiB: a body of
    several chunks, read whole and in ranges, arrives byte for byte and is counted."""
    body = os.urandom(5 * (1 << 20) + 12_345)
    s3.put_object(Bucket=bucket, Key="big", Body=body)
    proxy = CountingProxy(_near(moto))
    try:
        through = _client_of(proxy)
        whole = through.get_object(Bucket=bucket, Key="big")["Body"].read()
        ranged = through.get_object(Bucket=bucket, Key="big", Range="bytes=1048570-3145733")
        part = ranged["Body"].read()
    finally:
        counts = proxy.stop()
    assert whole == body
    assert part == body[1048570:3145734]
    assert counts["GET"] == 2
    sent = len(body) + len(part)
    assert sent < proxy.store_bytes < sent + 4000, proxy.store_bytes
