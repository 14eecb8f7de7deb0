"""A hostile store's answers stay bounded in the lean GET engine (backends/s3get.py): a region
it names goes into a host name only when it looks like one, and a listing body is read up to
MAX_LISTING_BYTES, whatever its Content-Length says or however long it streams. Served by a
small HTTP server of the test's own, since no real store answers this way.
"""

from __future__ import annotations

import contextlib
import http.server
import threading
from typing import Any, ClassVar

import boto3
import pytest

from pffs.backends.s3errors import S3RequestFailed
from pffs.backends.s3get import LeanGetEngine
from tests.backends.test_get_engine import _backend


class _Hostile(http.server.BaseHTTPRequestHandler):
    """A store that names a region no region looks like, or answers a listing with more bytes
    than any page holds (its Content-Length said, or a body without one)."""

    protocol_version = "HTTP/1.1"
    mode: ClassVar[str] = "region"

    def do_GET(self) -> None:
        if self.mode == "region":
            body = b"<Error><Code>PermanentRedirect</Code><Message>elsewhere</Message></Error>"
            self.send_response(301)
            self.send_header("x-amz-bucket-region", "evil.example/x?")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        if self.mode == "declared":
            self.send_header("Content-Length", str(1 << 40))
            self.end_headers()
            self.wfile.write(b"<ListBucketResult>")
            return
        self.send_header("Connection", "close")  # a body up to the connection's end
        self.end_headers()
        chunk = b"<Contents><Key>k</Key></Contents>" * 30000
        with contextlib.suppress(OSError):
            for _ in range(40):  # ~40 MiB, past the cap
                self.wfile.write(chunk)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize("mode", ["region", "declared", "streamed"])
def test_a_hostile_store_is_bounded(mode: str) -> None:
    """A named region goes into a host name only when it looks like one; a listing body is
    read up to MAX_LISTING_BYTES, never without a bound."""
    handler = type("Handler", (_Hostile,), {"mode": mode})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    try:
        backend = _backend(f"http://127.0.0.1:{server.server_address[1]}", "hostile")
        asked: list[str] = []

        def regional(region: str) -> str:
            asked.append(region)
            return "http://127.0.0.1:1"

        lean = LeanGetEngine(
            backend.client,
            boto3.session.Session().get_credentials(),
            "hostile",
            True,
            4,
            regional_endpoint=regional,
        )
        with pytest.raises(S3RequestFailed) as failed:
            lean.list_page("", None)
        if mode == "region":
            assert asked == [] and failed.value.status == 301
        else:
            assert failed.value.code == "TooLarge"
    finally:
        server.shutdown()
        server.server_close()
