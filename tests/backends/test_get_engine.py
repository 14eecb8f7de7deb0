"""The lean GET engine (backends/s3get.py) on real servers: what each outcome of a GET becomes
through S3Backend's one mapping and retry loop, faults injected by a FaultProxy in front of
moto, many threads at once, and credentials from boto3's chain (s3rver checks access keys).
"""

from __future__ import annotations

import http.client
import http.server
import os
import random
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar
from urllib.parse import urlsplit

import boto3
import pytest
from botocore.credentials import RefreshableCredentials

from pffs.backends.s3 import S3Backend
from pffs.backends.s3errors import S3RequestFailed, Unanswered
from pffs.backends.s3get import LeanGetEngine
from pffs.config import RetryConfig, SourceConfig
from pffs.errors import BackendError, Changed, NotFound, PermissionDenied, Transient, UsageError
from pffs.testing.faults import FaultProxy
from pffs.testing.servers import MotoServer
from tests.waiting import eventually

DATA = random.Random(3).randbytes(3 << 20)
QUICK_RETRIES = RetryConfig(attempts=3, base_delay=0.01, max_delay=0.05, total_timeout=20.0)


def _backend(endpoint: str, bucket: str, **options: Any) -> S3Backend:
    source = SourceConfig(
        url=f"s3://{bucket}", endpoint_url=endpoint, retry=QUICK_RETRIES, **options
    )
    return S3Backend(source)


@pytest.fixture
def stored(s3: Any, bucket: str) -> tuple[str, str]:
    """(bucket, ETag) of the object "data" holding DATA."""
    etag = s3.put_object(Bucket=bucket, Key="data", Body=DATA)["ETag"]
    return bucket, etag


@pytest.fixture
def proxy(moto: MotoServer) -> Iterator[FaultProxy]:
    with FaultProxy(moto.port, stall_seconds=2.0, seed=11) as fault_proxy:
        yield fault_proxy


def test_the_store_answers_become_pffs_errors(moto: MotoServer, stored: tuple[str, str]) -> None:
    bucket, etag = stored
    backend = _backend(moto.endpoint_url, bucket)
    engine = backend.engine
    # The engine raises its own error: the S3 code and the HTTP status of the answer.
    answers = {
        ("missing", None): ("NoSuchKey", 404),
        ("data", '"0123456789abcdef0123456789abcdef"'): ("PreconditionFailed", 412),
    }
    for (key, if_match), (code, status) in answers.items():
        with pytest.raises(S3RequestFailed) as caught, engine.get(key, 0, 10, if_match):
            pass
        assert (caught.value.code, caught.value.status) == (code, status)
        assert caught.value.unanswered is None
    # ... which S3Backend maps in the one place it maps every boto3 call.
    with pytest.raises(NotFound):
        backend.read_range("missing", 0, 10, None)
    with pytest.raises(Changed):
        backend.read_range("data", 0, 10, '"0123456789abcdef0123456789abcdef"')
    assert backend.read_range("data", 5, 10, etag) == DATA[5:15]
    assert backend.read_range("data", len(DATA), 10, etag) == b""  # 416: past the end
    assert backend.read_range("data", len(DATA) - 4, 10, etag) == DATA[-4:]
    assert backend.retries == 0


@pytest.mark.parametrize("fault", ["reset", "503", "500", "truncate", "stall"])
def test_each_fault_costs_one_retry_and_bytes_stay_exact(
    proxy: FaultProxy, stored: tuple[str, str], fault: str
) -> None:
    bucket, etag = stored
    # A read timeout below the proxy's stall: a stalled body must time out, not hang.
    backend = _backend(proxy.endpoint_url, bucket, read_timeout=0.5)
    proxy.inject(fault)
    assert backend.read_range("data", 1000, 1 << 20, etag) == DATA[1000 : 1000 + (1 << 20)]
    proxy.inject(fault)
    lengths = [1 << 20, 1 << 20, 1 << 20]
    got = list(backend.read_blocks("data", 0, lengths, etag))
    assert got == [DATA[: 1 << 20], DATA[1 << 20 : 2 << 20], DATA[2 << 20 :]]
    assert proxy.injected[fault] == 2
    assert backend.retries == 2


def test_a_store_that_keeps_failing_gives_transient(
    proxy: FaultProxy, stored: tuple[str, str]
) -> None:
    bucket, etag = stored
    backend = _backend(proxy.endpoint_url, bucket, read_timeout=0.5)
    proxy.set_rates({"503": 1.0})
    with pytest.raises(Transient, match="SlowDown"):
        backend.read_range("data", 0, 100, etag)
    assert backend.retries == QUICK_RETRIES.attempts - 1


def test_no_server_gives_transient(stored: tuple[str, str]) -> None:
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    backend = _backend(f"http://127.0.0.1:{port}", stored[0])
    with pytest.raises(Transient):
        backend.read_range("data", 0, 100, None)
    assert backend.retries == QUICK_RETRIES.attempts - 1


def test_a_reader_that_stops_early_leaves_the_connection_clean(
    moto: MotoServer, stored: tuple[str, str]
) -> None:
    bucket, etag = stored
    # One idle connection: were a half-read one pooled, the next GET would read its leftovers.
    backend = _backend(moto.endpoint_url, bucket, max_concurrency=1)

    pieces = backend.read_blocks("data", 0, [1000, 1000], etag)
    assert next(pieces) == DATA[:1000]
    pieces.close()  # the reader went away after the first piece
    with backend.engine.get("data", 0, 1 << 20, etag) as body:
        assert body.read(10) == DATA[:10]
    for start in (0, 12345, 2 << 20):
        assert backend.read_range("data", start, 4096, etag) == DATA[start : start + 4096]


def test_many_threads_share_one_engine(moto: MotoServer, stored: tuple[str, str]) -> None:
    bucket, etag = stored
    # Fewer pooled connections than threads: the extra ones are opened and closed.
    backend = _backend(moto.endpoint_url, bucket, max_concurrency=2)
    rng = random.Random(5)
    ranges = [(rng.randrange(len(DATA)), rng.randrange(1, 300_000)) for _ in range(160)]

    def read(item: tuple[int, int]) -> bytes:
        start, length = item
        return backend.read_range("data", start, length, etag)

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(read, ranges))
    for (start, length), data in zip(ranges, results, strict=True):
        assert data == DATA[start : start + length]


# --- credentials: s3rver checks access keys, moto does not --------------------------------


@pytest.fixture(scope="module")
def s3rver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from bench.servers import Launcher, Unavailable

    launcher = Launcher(
        str(tmp_path_factory.mktemp("s3rver")), os.path.expanduser("~/.cache/pffs-bench")
    )
    try:
        server = launcher.s3rver()
    except Unavailable as exc:
        pytest.skip(f"needs s3rver: {exc}")
    try:
        client = boto3.client(
            "s3",
            endpoint_url=server.endpoint_url,
            aws_access_key_id=server.access_key,
            aws_secret_access_key=server.secret_key,
            region_name="us-east-1",
        )
        client.create_bucket(Bucket="creds")
        client.put_object(Bucket="creds", Key="data", Body=DATA[:1000])
        yield server
    finally:
        server.stop()


def test_wrong_credentials_are_permission_denied(
    s3rver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "not-a-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3rver.secret_key)
    backend = _backend(s3rver.endpoint_url, "creds")
    with pytest.raises(PermissionDenied, match="InvalidAccessKeyId"):
        backend.read_range("data", 0, 10, None)  # the engine
    with pytest.raises(PermissionDenied, match="403"):
        backend.stat("data")  # boto3's HEAD, mapped in the same place
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3rver.access_key)
    assert _backend(s3rver.endpoint_url, "creds").read_range("data", 0, 10, None) == DATA[:10]


def test_refreshable_credentials_are_refreshed(s3rver: Any) -> None:
    refreshed: list[int] = []

    def refresh() -> dict[str, str]:
        refreshed.append(1)
        expiry = datetime.now(UTC) + timedelta(hours=1)
        return {
            "access_key": s3rver.access_key,
            "secret_key": s3rver.secret_key,
            "token": "a-session-token",
            "expiry_time": expiry.isoformat(),
        }

    # Expired from the start, and wrong: only a refresh makes the GET succeed.
    expired = {
        "access_key": "stale",  # s3rver refuses it: InvalidAccessKeyId
        "secret_key": "stale",
        "token": "stale",
        "expiry_time": (datetime.now(UTC) - timedelta(minutes=1)).isoformat(),
    }
    credentials = RefreshableCredentials.create_from_metadata(expired, refresh, "test")
    backend = _backend(s3rver.endpoint_url, "creds")
    lean = LeanGetEngine(backend.client, credentials, "creds", True, 4)
    with lean.get("data", 0, 100, None) as body:
        assert body.read(100) == DATA[:100]
    assert refreshed


class _WrongRegion(http.server.BaseHTTPRequestHandler):
    """Answers every GET as AWS answers one signed for the wrong region."""

    def do_GET(self) -> None:
        body = b"<Error><Code>PermanentRedirect</Code><Message>elsewhere</Message></Error>"
        self.send_response(301)
        self.send_header("x-amz-bucket-region", "eu-west-3")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_bucket_of_another_region_is_followed(moto: MotoServer, stored: tuple[str, str]) -> None:
    bucket, etag = stored
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _WrongRegion)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    try:
        wrong = f"http://127.0.0.1:{server.server_address[1]}"
        backend = _backend(wrong, bucket)
        asked: list[str] = []

        def regional(region: str) -> str:
            asked.append(region)
            return moto.endpoint_url

        lean = LeanGetEngine(
            backend.client,
            boto3.session.Session().get_credentials(),  # the chain the backend's session uses
            bucket,
            True,
            4,
            regional_endpoint=regional,
        )
        for _ in range(2):  # learnt once, then every GET goes there at once
            with lean.get("data", 10, 100, etag) as body:
                assert body.read(100) == DATA[10:110]
        assert asked == ["eu-west-3"]
        # Without a way to the region (a custom endpoint), the answer is the store's error.
        with pytest.raises(BackendError, match="PermanentRedirect"):
            backend.read_range("data", 0, 10, etag)
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
def test_a_connection_the_store_closed_while_idle_is_not_used(
    s3rver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3rver.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3rver.secret_key)
    backend = _backend(s3rver.endpoint_url, "creds")
    assert backend.read_range("data", 0, 10, None) == DATA[:10]
    # s3rver (node) closes a keep-alive connection idle for 5 s: wait until it has, so that the
    # next request cannot race the close (a reset, which would count as a failure).
    port = urlsplit(s3rver.endpoint_url).port
    assert port is not None
    wait_closed_by_server(port)
    assert backend.read_range("data", 10, 10, None) == DATA[10:20]
    assert backend.retries == 0  # the closed connection was dropped, not tried and retried


def wait_closed_by_server(port: int, timeout: float = 60) -> None:
    """Wait until a connection to 127.0.0.1:`port` was closed by the server while the client
    keeps it: the kernel's TCP table shows it in CLOSE_WAIT (state 08)."""
    remote = f"0100007F:{port:04X}"

    def closed_by_server() -> bool:
        with open("/proc/net/tcp") as table:
            rows = [line.split() for line in table.readlines()[1:]]
        return any(row[2] == remote and row[3] == "08" for row in rows)

    eventually(closed_by_server, timeout, f"a connection to port {port} closed by the server")


class _Ranges(http.server.BaseHTTPRequestHandler):
    """Serves DATA's bytes of any "bytes=a-b" range, whatever the key (an HTTPS store)."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        first, last = self.headers["Range"].removeprefix("bytes=").split("-")
        body = DATA[int(first) : int(last) + 1]
        self.send_response(206)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class _ClosesSecondRequests(_Ranges):
    """Answers the first request of each connection; a second one on the same connection is
    read and met by a close without a word, as when a store's idle timer ends a keep-alive
    connection just as a request goes out on it."""

    requests = 0

    def do_GET(self) -> None:
        self.requests += 1
        if self.requests > 1:
            self.close_connection = True
            return
        super().do_GET()


def test_a_keep_alive_connection_closed_as_the_request_goes_out_is_not_a_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ClosesSecondRequests)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    try:
        backend = _backend(f"http://127.0.0.1:{server.server_address[1]}", "closing")
        for offset in range(0, 50, 10):  # each after the first goes out on a kept connection
            assert backend.read_range("data", offset, 10, None) == DATA[offset : offset + 10]
        assert backend.retries == 0  # not counted, nor retried, as the store's failure
    finally:
        server.shutdown()
        server.server_close()


def _certificate(folder: str) -> tuple[str, str]:
    """(certificate, key) files of a self-signed certificate for 127.0.0.1."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    cert, key = f"{folder}/cert.pem", f"{folder}/key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", key, "-out", cert, "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


@contextmanager
def _serving(
    handler: type[http.server.BaseHTTPRequestHandler], cert: tuple[str, str] | None = None
) -> Iterator[str]:
    """The endpoint URL of a threaded HTTP server on 127.0.0.1 (HTTPS with `cert`)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    if cert is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(*cert)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    try:
        yield f"{'https' if cert else 'http'}://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def https_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(endpoint URL, CA bundle) of an HTTPS store on 127.0.0.1 with its own certificate."""
    cert = _certificate(str(tmp_path_factory.mktemp("tls")))
    with _serving(_Ranges, cert) as endpoint:
        yield endpoint, cert[0]


def test_tls_uses_the_ca_bundle_of_boto3s_chain(
    https_store: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint, bundle = https_store
    monkeypatch.setenv("AWS_CA_BUNDLE", bundle)
    assert _backend(endpoint, "tls").read_range("data", 7, 1000, None) == DATA[7:1007]
    monkeypatch.delenv("AWS_CA_BUNDLE")  # a certificate nobody vouches for: never trusted
    with pytest.raises(Transient, match=r"TLS failed.*CERTIFICATE_VERIFY_FAILED"):
        _backend(endpoint, "tls").read_range("data", 7, 1000, None)


class _ForwardProxy(http.server.BaseHTTPRequestHandler):
    """A plain HTTP proxy: forwards "GET http://host/path" and remembers what it saw."""

    protocol_version = "HTTP/1.1"
    seen: ClassVar[list[tuple[str, str | None]]] = []

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get("Proxy-Authorization")))
        target = urlsplit(self.path)
        upstream = http.client.HTTPConnection(target.netloc, timeout=10)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "proxy-authorization"}
        upstream.request("GET", target.path, headers=headers)
        answer = upstream.getresponse()
        body = answer.read()
        self.send_response(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        upstream.close()

    def log_message(self, *args: Any) -> None:
        pass


def test_reads_go_through_the_proxy_boto3_would_use(
    moto: MotoServer, stored: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket, etag = stored
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ForwardProxy)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    try:
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTP_PROXY", f"http://user:secret@127.0.0.1:{server.server_address[1]}")
        backend = _backend(moto.endpoint_url, bucket)
        assert backend.read_range("data", 3, 100, etag) == DATA[3:103]
        assert _ForwardProxy.seen == [
            (f"{moto.endpoint_url}/{bucket}/data", "Basic dXNlcjpzZWNyZXQ=")
        ]
        monkeypatch.setenv("HTTP_PROXY", "https://127.0.0.1:3129")  # TLS to the proxy: not here
        with pytest.raises(UsageError, match="http:// proxies only"):
            _backend(moto.endpoint_url, bucket)
    finally:
        server.shutdown()
        server.server_close()


class _Stalls(_Ranges):
    """Answers nothing (`where` "before the answer"), or the status, the headers and half the
    body ("mid-body"), then holds the connection open without a word until the test ends, as
    a store that stops answering does."""

    where: ClassVar[str] = ""
    released: ClassVar[threading.Event] = threading.Event()
    # Set when a hold ran out before the test released it: a client waited the server's 30 s
    # (the bound only ends a hang) rather than its own read timeout.
    outwaited: ClassVar[threading.Event] = threading.Event()

    def do_GET(self) -> None:
        first, last = self.headers["Range"].removeprefix("bytes=").split("-")
        body = DATA[int(first) : int(last) + 1]
        if self.where == "mid-body":
            self.send_response(206)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
        if not self.released.wait(30):
            self.outwaited.set()
        self.close_connection = True


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
@pytest.mark.parametrize("where", ["before the answer", "mid-body"])
def test_a_store_that_stops_answering_times_out_as_a_read_timeout(
    tls: bool,
    where: str,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Plain sockets time out in the kernel (SO_RCVTIMEO), TLS ones in Python: the same error
    # either way, retried as one, and never a hang.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    cert = _certificate(str(tmp_path)) if tls else None
    if cert is not None:
        monkeypatch.setenv("AWS_CA_BUNDLE", cert[0])
    handler: type[_Stalls] = type(
        "Stalls",
        (_Stalls,),
        {"where": where, "released": threading.Event(), "outwaited": threading.Event()},
    )
    with _serving(handler, cert) as endpoint:
        try:
            backend = _backend(endpoint, "stalls", read_timeout=0.3)
            with (
                pytest.raises(S3RequestFailed) as caught,
                backend.engine.get("data", 0, 100_000, None) as body,
            ):
                body.read(100_000)
            assert caught.value.unanswered is Unanswered.READ_TIMEOUT
            with pytest.raises(Transient, match="read timed out"):
                backend.read_range("data", 0, 100_000, None)
            assert backend.retries == QUICK_RETRIES.attempts - 1
            # Each attempt gave up on its read timeout with the server still holding it.
            assert not handler.outwaited.is_set()
        finally:
            handler.released.set()


def test_a_line_break_in_a_header_value_is_refused(
    moto: MotoServer, stored: tuple[str, str]
) -> None:
    bucket, etag = stored
    backend = _backend(moto.endpoint_url, bucket)
    with pytest.raises(BackendError, match="holds a line break"):
        backend.read_range("data", 0, 10, '"e"\r\nX-Injected: 1')
    assert backend.read_range("data", 0, 10, etag) == DATA[:10]  # nothing left on the wire
