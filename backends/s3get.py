"""The lean GET engine behind S3Backend's object reads and listings: one ranged GET or one
ListObjectsV2 page, signed by pffs.backends.sigv4, written whole on a pooled keep-alive
connection and its answer framed by http.client's response code (pffs.backends.s3connections),
without boto3's client call machinery.

Why: on a small machine the client's CPU per request limits a cold read, and boto3's event
hooks, parameter validation, serialisation and response parsing cost several times this path's
CPU per GET (docs/BENCHMARKS.md has the figures). Listing pages come here too, parsed by
pffs.backends.s3listing, since botocore's parsing of a page costs several times as much. Every
other S3 call stays on boto3.

Configuration has one source: the boto3 client S3Backend built, through its public `meta`: its
endpoint URL and region, and its botocore Config (timeouts, proxies, addressing style). The
credentials are the session's object, so refreshable and session-token credentials work as they
do for boto3; TLS verification is the value the backend gave boto3.

The engine performs a request and nothing else: no retries, no error mapping. It hands back the
body, or raises `S3RequestFailed` (pffs.backends.s3errors, which maps it and boto3's errors
alike): with the status, S3 error code and message of an error answer, or with why there was
no whole answer (no connection, a timeout, a connection closed or a body cut short).
"""

from __future__ import annotations

import http.client
import logging
import re
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from botocore.credentials import Credentials
from botocore.httpsession import ProxyConfiguration
from botocore.utils import get_environ_proxies

from pffs.backends.s3connections import Connection, Connections, LeanResponse
from pffs.backends.s3errors import S3RequestFailed, Unanswered
from pffs.backends.sigv4 import SigV4Signer, host_header
from pffs.errors import UsageError

# A probe's own timeouts (seconds): connecting, then each wait for the store's bytes. Whatever
# --request-timeout says, a store that answers again is seen within seconds.
PROBE_CONNECT_TIMEOUT = 2.0
PROBE_ANSWER_TIMEOUT = 3.0

# The S3 error code and message in an XML error body; a regex, as error bodies are small and
# flat and this keeps an XML parser off the path.
log = logging.getLogger(__name__)

_CODE_RE = re.compile(rb"<Code>([^<]*)</Code>")
_MESSAGE_RE = re.compile(rb"<Message>([^<]*)</Message>")
# What a region the store names may look like before it goes into a host name: AWS's own
# (us-east-1, us-gov-west-1, ap-southeast-3, ...); anything else is not followed.
_REGION_RE = re.compile(r"[a-z]{2}(-[a-z0-9]+){1,3}-[0-9]{1,2}")
# A listing page of 1,000 keys of at most 1,024 bytes each, URL-encoded, with their sizes,
# ETags and dates, is a few MiB: a body larger than this is not a listing page.
MAX_LISTING_BYTES = 32 << 20


class Body:
    """The bytes of one successful GET, read in pieces of exact sizes. A context manager: at
    its end the connection goes back to the pool when the body was read to its end, and is
    closed otherwise (a caller that stops early must not leave bytes on it)."""

    __slots__ = ("_connection", "_connections", "_response", "_url", "content_length")

    def __init__(
        self,
        response: http.client.HTTPResponse,
        url: str,
        connection: Connection,
        connections: Connections,
    ) -> None:
        self._response = response
        self._url = url
        self._connection: Connection | None = connection
        self._connections = connections
        self.content_length: int | None = response.length

    def __enter__(self) -> Body:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Hand the connection back (a whole answer read) or close it; once."""
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if self._response.isclosed() and not self._response.will_close:
            self._connections.give(connection)
        else:
            connection.close()

    def read(self, size: int) -> bytes:
        """`size` bytes, or fewer where the body ends early (the caller compares lengths)."""
        return self._read(size)

    def read_all(self, most: int) -> bytes:
        """The whole body, of at most `most` bytes; one cut short or larger raises."""
        if self.content_length is not None and self.content_length > most:
            raise self._too_large(most)
        data = self._read(most + 1)
        if len(data) > most:
            raise self._too_large(most)
        if self.content_length is not None and len(data) < self.content_length:
            raise S3RequestFailed(self._url, unanswered=Unanswered.CUT_SHORT)
        return data

    def _too_large(self, most: int) -> S3RequestFailed:
        self.close()  # the rest is never read: the connection cannot serve again
        message = f"an answer over {most} bytes"
        return S3RequestFailed(self._url, status=200, code="TooLarge", message=message)

    def _read(self, size: int | None) -> bytes:
        try:
            return self._response.read(size)
        except TimeoutError as exc:
            raise S3RequestFailed(self._url, unanswered=Unanswered.READ_TIMEOUT) from exc
        except (http.client.HTTPException, OSError) as exc:
            raise S3RequestFailed(self._url, unanswered=Unanswered.CUT_SHORT) from exc


@dataclass(frozen=True)
class _Target:
    """Where the bucket's GETs go and how they are signed; swapped whole, never changed."""

    region: str
    base: str  # scheme://host[:port]
    host: str  # the Host header, as signed
    key_prefix: str  # "/bucket/" (path style) or "/" (virtual-hosted)
    connections: Connections
    # A probe's: its own short timeouts, none kept idle (each probe connects afresh).
    probe_connections: Connections

    @property
    def bucket_path(self) -> str:
        """The path of the bucket itself: "/bucket" (path style) or "/"."""
        return self.key_prefix.rstrip("/") or "/"


class LeanGetEngine:
    """GETs of one bucket's objects; thread-safe (the pool and the signer hold no request)."""

    def __init__(
        self,
        client: Any,
        credentials: Credentials | None,
        bucket: str,
        verify: bool | str,
        max_connections: int,
        regional_endpoint: Callable[[str], str] | None = None,
    ) -> None:
        """`client` is the backend's boto3 S3 client and `credentials` its session's (boto3's
        chain; refreshable ones refresh here too): endpoint, region, timeouts, proxies and
        addressing style come from the client's meta, so both paths always agree. `verify` is
        what the client was given (True, False or a CA bundle's path); `max_connections` the
        idle connections kept. `regional_endpoint(region)`, where given, is the endpoint URL of
        a region: a bucket found in another region (as AWS answers a GET signed for the wrong
        one) is then followed there, as boto3's redirector does."""
        config = client.meta.config
        self._credentials = credentials
        self._signer = SigV4Signer()
        self._bucket = bucket
        self._path_style = (config.s3 or {}).get("addressing_style") == "path"
        self._max_connections = max_connections
        self._timeouts = (float(config.connect_timeout), float(config.read_timeout))
        self._verify = verify
        self._config = config
        self._regional_endpoint = regional_endpoint
        self._lock = threading.Lock()
        self._target = self._aim(client.meta.region_name, client.meta.endpoint_url)

    def _aim(self, region: str, endpoint_url: str) -> _Target:
        endpoint = urlsplit(endpoint_url)
        # Virtual-hosted style as boto3's "auto" does it: when the bucket name can be a host
        # label (no dots, or TLS certificates would not match).
        if self._path_style or "." in self._bucket:
            netloc, key_prefix = endpoint.netloc, f"/{self._bucket}/"
        else:
            netloc, key_prefix = f"{self._bucket}.{endpoint.netloc}", "/"
        base = f"{endpoint.scheme}://{netloc}"
        proxy = self._proxy_for(base)
        # A connection's first answer is awaited as a probe's is (see s3connections).
        connections = Connections(
            endpoint.scheme,
            netloc,
            *self._timeouts,
            self._verify,
            self._max_connections,
            proxy,
            first_answer_timeout=PROBE_ANSWER_TIMEOUT,
        )
        probe_connections = Connections(
            endpoint.scheme,
            netloc,
            PROBE_CONNECT_TIMEOUT,
            PROBE_ANSWER_TIMEOUT,
            self._verify,
            0,
            proxy,
        )
        return _Target(region, base, host_header(base), key_prefix, connections, probe_connections)

    def _proxy_for(self, base: str) -> tuple[str, dict[str, str]] | None:
        """The proxy boto3 would go through to `base` (HTTP(S)_PROXY, NO_PROXY, the client's
        proxies setting), with its headers (Proxy-Authorization), or None."""
        config = self._config
        # As boto3's endpoint resolves them: the config's proxies, else HTTP(S)_PROXY/NO_PROXY.
        proxies = ProxyConfiguration(
            config.proxies or get_environ_proxies(base), config.proxies_config
        )
        url: str | None = proxies.proxy_url_for(base + "/")
        if not url:
            return None
        if urlsplit(url).scheme != "http":
            raise UsageError(f"proxy {url!r}: S3 reads go through http:// proxies only")
        return url, dict(proxies.proxy_headers_for(url))

    def close(self) -> None:
        self._target.connections.close()

    def renew(self) -> None:
        """Let go of every connection open now: the store came back (see s3connections)."""
        self._target.connections.renew()

    def get(self, key: str, start: int, length: int, if_match: str | None) -> Body:
        """GET bytes [start, start+length) of `key`, only while its ETag is `if_match` (when
        given); its Body is to be used in a `with` (which hands its connection back)."""
        headers = {"Range": f"bytes={start}-{start + length - 1}"}
        if if_match is not None:
            headers["If-Match"] = if_match
        encoded = quote(key, safe="/~")
        body = self._request(lambda target: target.key_prefix + encoded, headers)
        if body._response.status == 200 and start > 0:  # a store that ignored the Range header
            body.close()
            message = "the store ignored the Range header"
            raise S3RequestFailed(body._url, status=200, code="RangeIgnored", message=message)
        return body

    def list_page(
        self, prefix: str, token: str | None, delimiter: str | None = "/", max_keys: int = 1000
    ) -> bytes:
        """The body of one ListObjectsV2 page of up to `max_keys` keys under `prefix`, grouped
        by `delimiter` (None: every key below), from the continuation `token` on (None: the
        first page); keys come URL-encoded, as boto3 asks for them (a key may hold characters
        XML cannot carry)."""
        query = _list_query(prefix, token, delimiter, max_keys)
        listing = self._request(lambda target: f"{target.bucket_path}?{query}", {})
        with listing:
            return listing.read_all(MAX_LISTING_BYTES)

    def probe(self, prefix: str) -> None:
        """A one-key listing of `prefix` on a new connection with the probe's own timeouts,
        closed after (never one opened while the store hung): whether the store answers."""
        query = _list_query(prefix, None, "/", 1)
        listing = self._request(lambda target: f"{target.bucket_path}?{query}", {}, probe=True)
        with listing:
            listing.read_all(MAX_LISTING_BYTES)

    def _request(
        self, path_of: Callable[[_Target], str], headers: dict[str, str], probe: bool = False
    ) -> Body:
        """One signed GET of `path_of(target)` (a path and query), followed once to the
        bucket's own region when the store names another; an error status raises. (Not a
        generator context manager: two of them cost 10 us a GET.) A `probe` goes on a fresh
        connection of the probe's timeouts."""
        target = self._target
        body = self._send(target, path_of(target), headers, probe)
        response = body._response
        if response.status in (301, 307, 400) and self._follow(target, response):
            _drain(response)
            body.close()
            body = self._send(self._target, path_of(self._target), headers, probe)
            response = body._response
        if response.status >= 300:
            try:
                raise _error(response, body._url)
            finally:
                body.close()
        return body

    def _send(self, target: _Target, path: str, headers: dict[str, str], probe: bool) -> Body:
        url = target.base + path
        signed = self._signed(target, url, path, headers)
        connections = target.probe_connections if probe else target.connections
        if connections.absolute_form:
            request = _request_head(url, target.host, signed | connections.request_headers)
        else:
            request = _request_head(path, target.host, signed)
        while True:
            try:
                connection, reused = connections.take()
            except TimeoutError as exc:
                raise S3RequestFailed(url, unanswered=Unanswered.CONNECT_TIMEOUT) from exc
            except ssl.SSLError as exc:
                raise S3RequestFailed(url, unanswered=Unanswered.TLS) from exc
            except OSError as exc:
                raise S3RequestFailed(url, unanswered=Unanswered.UNREACHABLE) from exc
            if log.isEnabledFor(logging.DEBUG):  # which requests paid a connection's round trip
                log.debug(
                    "GET %s %s on a %s connection",
                    path,
                    headers.get("Range", ""),
                    "kept-alive" if reused else "new",
                )
            try:
                connection.send(request)
                response = LeanResponse(connection, method="GET")  # type: ignore[arg-type]
                response.begin()
                connections.answered(connection)
                return Body(response, url, connection, connections)
            except TimeoutError as exc:
                connection.close()
                # (On a connection that never carried an answer: its first-answer timeout.)
                raise S3RequestFailed(url, unanswered=Unanswered.READ_TIMEOUT) from exc
            except (http.client.RemoteDisconnected, BrokenPipeError) as exc:
                connection.close()
                if not reused:
                    raise S3RequestFailed(url, unanswered=Unanswered.CUT_SHORT) from exc
                # Closed without a word as the request went out: the server ended an idle
                # keep-alive connection (a race the check in `take` cannot close), which is not
                # the store failing. Once more, on another connection. A reset stays a failure.
            except (http.client.HTTPException, OSError) as exc:
                connection.close()  # resets, closes and malformed answers before the body
                raise S3RequestFailed(url, unanswered=Unanswered.CUT_SHORT) from exc

    def _follow(self, target: _Target, response: http.client.HTTPResponse) -> bool:
        """Aim at the bucket's own region when the store names another one; True if so."""
        region = response.getheader("x-amz-bucket-region")
        if not region or region == target.region or self._regional_endpoint is None:
            return False
        if not _REGION_RE.fullmatch(region):  # it becomes part of a host name: never unchecked
            log.warning("the store named the bucket's region %r, which is no region", region[:64])
            return False
        with self._lock:
            if self._target is target:  # the first thread to learn it moves everyone
                self._target = self._aim(region, self._regional_endpoint(region))
                target.connections.close()
        return True

    def _signed(
        self, target: _Target, url: str, path: str, headers: dict[str, str]
    ) -> dict[str, str]:
        if self._credentials is None:
            raise S3RequestFailed(url, unanswered=Unanswered.NO_CREDENTIALS)
        # Frozen per request as botocore does: a refresh between reading the key and the
        # secret must not mix two credentials.
        frozen = self._credentials.get_frozen_credentials()
        return self._signer.sign(frozen, target.region, target.host, path, headers)


def _error(response: http.client.HTTPResponse, url: str) -> S3RequestFailed:
    """The store's error answer (its body read, so the connection can serve again)."""
    text = _drain(response)
    code = _CODE_RE.search(text)
    message = _MESSAGE_RE.search(text)
    return S3RequestFailed(
        url,
        status=response.status,
        code=code.group(1).decode(errors="replace") if code else "",
        message=message.group(1).decode(errors="replace") if message else response.reason,
    )


def _list_query(prefix: str, token: str | None, delimiter: str | None, max_keys: int) -> str:
    """The query of a ListObjectsV2 page (see `LeanGetEngine.list_page`), encoded as SigV4's
    canonical query wants it, so the signature covers it as sent."""
    params = {"list-type": "2", "prefix": prefix, "encoding-type": "url"}
    if delimiter is not None:
        params["delimiter"] = delimiter
    if max_keys != 1000:  # S3's default page
        params["max-keys"] = str(max_keys)
    if token is not None:
        params["continuation-token"] = token
    return "&".join(f"{name}={quote(params[name], safe='-_.~')}" for name in sorted(params))


def _request_head(target: str, host: str, headers: dict[str, str]) -> bytes:
    """A GET's request line and headers, as http.client would send them (Host and
    Accept-Encoding first), in one piece for one send."""
    lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    text = f"GET {target} HTTP/1.1\r\nHost: {host}\r\nAccept-Encoding: identity\r\n{lines}\r\n"
    # A line break inside a value (an ETag or token from elsewhere) would split a header:
    # refused, as http.client refuses it.
    if text.count("\n") != len(headers) + 4 or text.count("\r") != len(headers) + 4:
        raise ValueError(f"a header of the GET of {target!r} holds a line break")
    return text.encode("latin-1")


def _drain(response: http.client.HTTPResponse) -> bytes:
    """An error answer's body, read off the connection so that it can serve again."""
    try:
        return response.read(64 * 1024)
    except (http.client.HTTPException, OSError):
        return b""  # the status alone still says what happened
