"""One mapping of S3 failures for both HTTP stacks (backends/s3errors.py): the GET engine's
S3RequestFailed and boto3's errors give the same pffs error for the same outcome, on a real moto
server with faults injected by a FaultProxy in front of it, and for every code in the tables."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import botocore.exceptions
import pytest

from pffs.backends.base import writable
from pffs.backends.s3 import S3Backend
from pffs.backends.s3errors import Kind, S3RequestFailed, Unanswered, classify, translate
from pffs.config import RetryConfig, SourceConfig
from pffs.errors import BackendError, Changed, NotFound, PermissionDenied, Throttled, Transient
from pffs.testing.faults import FaultProxy
from pffs.testing.servers import MotoServer

RETRIES = RetryConfig(attempts=3, base_delay=0.01, max_delay=0.05, total_timeout=20.0)
DATA = b"0123456789" * 1000


def _backend(endpoint: str, bucket: str, **options: Any) -> S3Backend:
    return S3Backend(
        SourceConfig(url=f"s3://{bucket}", endpoint_url=endpoint, retry=RETRIES, **options)
    )


@pytest.fixture
def stored(s3: Any, bucket: str) -> str:
    s3.put_object(Bucket=bucket, Key="data", Body=DATA)
    return bucket


@pytest.fixture
def proxy(moto: MotoServer) -> Iterator[FaultProxy]:
    """Faults for every request, boto3's HEADs too (not only object GETs)."""
    with FaultProxy(moto.port, match=_every, stall_seconds=2.0, seed=5) as fault_proxy:
        yield fault_proxy


def _every(method: str, path: str, headers: dict[str, str]) -> bool:
    return True


def _client_error(status: int, code: str) -> botocore.exceptions.ClientError:
    """What boto3 raises for an error answer (HEAD answers carry no code: the status)."""
    error = {
        "Error": {"Code": code, "Message": "m"},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return botocore.exceptions.ClientError(error, "Op")


@pytest.mark.parametrize(
    ("status", "code", "kind", "error"),
    [
        (503, "SlowDown", Kind.TRANSIENT, Throttled),
        (429, "TooManyRequests", Kind.TRANSIENT, Throttled),
        (503, "", Kind.TRANSIENT, Transient),
        (500, "InternalError", Kind.TRANSIENT, Transient),
        (404, "NoSuchKey", Kind.NOT_FOUND, NotFound),
        (404, "", Kind.NOT_FOUND, NotFound),
        (403, "AccessDenied", Kind.DENIED, PermissionDenied),
        (403, "", Kind.DENIED, PermissionDenied),
        (412, "PreconditionFailed", Kind.CHANGED, Changed),
        (416, "InvalidRange", Kind.BAD_RANGE, BackendError),
        (400, "InvalidArgument", Kind.OTHER, BackendError),
    ],
)
def test_both_stacks_answers_mean_the_same(
    status: int, code: str, kind: Kind, error: type[Exception]
) -> None:
    engine = S3RequestFailed("http://store/b/k", status=status, code=code, message="m")
    boto = _client_error(status, code)
    for failure in (engine, boto):
        assert classify(failure) is kind
        translated = translate(failure, "s3://b/k")
        assert type(translated) is error
        assert (
            str(status) in str(translated)
            or code in str(translated)
            or kind
            in (
                Kind.NOT_FOUND,
                Kind.CHANGED,
            )
        )


def test_throttling_is_transient_on_both_stacks(proxy: FaultProxy, stored: str) -> None:
    backend = _backend(proxy.endpoint_url, stored)
    proxy.inject("503")
    with pytest.raises(S3RequestFailed) as caught, backend.engine.get("data", 0, 10, None):
        pass
    assert (caught.value.status, caught.value.code) == (503, "SlowDown")
    assert classify(caught.value) is Kind.TRANSIENT
    # A GET (the engine) and a HEAD (boto3) still throttled after every retry: Transient.
    proxy.inject("503", RETRIES.attempts)
    with pytest.raises(Transient, match="SlowDown"):
        backend.read_range("data", 0, 10, None)
    proxy.inject("503", RETRIES.attempts)
    with pytest.raises(Transient, match="503"):
        backend.stat("data")
    assert backend.retries == 2 * (RETRIES.attempts - 1)
    # Throttled once, then served: one retry, the bytes exact.
    proxy.inject("503")
    assert backend.read_range("data", 5, 10, None) == DATA[5:15]
    assert backend.retries == 2 * (RETRIES.attempts - 1) + 1


def test_missing_is_not_found_on_both_stacks(moto: MotoServer, stored: str) -> None:
    backend = _backend(moto.endpoint_url, stored)
    with pytest.raises(S3RequestFailed) as caught, backend.engine.get("missing", 0, 10, None):
        pass
    assert (caught.value.status, caught.value.code) == (404, "NoSuchKey")
    with pytest.raises(NotFound):
        backend.read_range("missing", 0, 10, None)  # the engine
    with pytest.raises(NotFound):
        backend.stat("missing")  # boto3's HEAD, then the engine's LIST
    writer = writable(backend)
    assert writer is not None
    with pytest.raises(NotFound):
        writer.rename("missing", "elsewhere")  # boto3's HEAD, then the engine's LIST
    with pytest.raises(NotFound):
        _backend(moto.endpoint_url, "no-such-bucket-here").check()
    assert backend.retries == 0


def test_a_stalled_store_times_out_into_transient(proxy: FaultProxy, stored: str) -> None:
    backend = _backend(proxy.endpoint_url, stored, read_timeout=0.5)
    proxy.inject("stall")
    with (
        pytest.raises(S3RequestFailed) as caught,
        backend.engine.get("data", 0, len(DATA), None) as body,
    ):
        body.read(len(DATA))
    assert caught.value.unanswered is Unanswered.READ_TIMEOUT
    assert classify(caught.value) is Kind.TRANSIENT
    proxy.inject("stall", RETRIES.attempts)
    with pytest.raises(Transient, match="read timed out"):
        backend.read_range("data", 0, len(DATA), None)
    proxy.inject("stall", RETRIES.attempts)  # boto3's HEAD: the proxy answers nothing
    with pytest.raises(Transient):
        backend.stat("data")
    assert backend.read_range("data", 0, 10, None) == DATA[:10]


def test_an_unreachable_store_is_transient_on_both_stacks(stored: str) -> None:
    with socket.socket() as listener:  # a port nothing listens on
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
    backend = _backend(f"http://127.0.0.1:{port}", stored)
    with pytest.raises(S3RequestFailed) as caught:
        backend.engine.get("data", 0, 10, None)
    assert caught.value.unanswered is Unanswered.UNREACHABLE
    with pytest.raises(Transient, match="cannot reach the S3 endpoint"):
        backend.read_range("data", 0, 10, None)
    with pytest.raises(Transient, match="cannot reach the S3 endpoint"):
        backend.stat("data")
    assert backend.retries == 2 * (RETRIES.attempts - 1)
