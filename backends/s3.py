"""S3 and S3-compatible stores through boto3 (`s3://bucket[/prefix]`).

Directories are key prefixes: a listing uses the '/' delimiter, so common prefixes become
directories whether or not a "dir/" marker object exists. When a key is both an object and a
prefix ("a" and "a/b"), the directory wins and the object is hidden, as in mountpoint-s3.

Retries are ours (pffs.retry), not botocore's, so every backend behaves alike; botocore's own are
switched off. Credentials are the source's own keys (pffs.credentials), given to the boto3 session
as arguments, else its profile or boto3's default chain; the principal they name (principal.py)
is part of every cache key of the source's blocks.

Object reads (read_range, read_blocks) and listings (of a directory, of the keys under a
renamed one, and the check that a prefix is a directory) go through the lean GET engine of
s3get.py, which costs far less CPU per request than boto3 (listing pages are parsed by
s3listing.py); every other call goes through boto3. Writes (PUTs, multipart uploads, deletes,
renames) are the backend's `writer`, an S3Writes (s3writes.py) sharing the client, the engine
and the S3Calls.

How every S3 call is made, reads and writes alike (`S3Calls`, below): with pffs's retries
(pffs.retry), counted and timed by pffs.metrics, and its failure translated into a pffs error
by s3errors.py's one mapping of either stack's failures. S3Backend owns one and shares it with
its writes, so a write fails, retries and shows in the metrics the way a read does. A request's
terms say how many times its source has come back up (`RetryTerms.recovered`); the first
request to bring a higher count calls `renew` before it goes out, which lets go of the
connections opened before (the GET engine's and boto3's).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import urlsplit

import boto3
import botocore.exceptions
import botocore.session
from botocore.config import Config

from pffs import metrics
from pffs.backends.base import (
    BlockRunReader,
    Capabilities,
    ObjectInfo,
    TreeLister,
    TreePage,
    Writing,
    is_valid_name,
    join,
)
from pffs.backends.principal import s3_principal, s3_principal_key
from pffs.backends.s3errors import Kind, classify, error_code, is_transient, translate
from pffs.backends.s3get import LeanGetEngine
from pffs.backends.s3listing import parse_page
from pffs.backends.s3timestamps import use_fast_timestamps
from pffs.backends.s3writes import PART_LIMITS, S3Writes
from pffs.config import RetryConfig, SourceConfig
from pffs.errors import Changed, NotFound, PermissionDenied, PffsError, Transient, UsageError
from pffs.flow.permits import ceiling_for
from pffs.retry import RetryTerms, stream_with_retry

log = logging.getLogger("pffs.s3")

# Bucket names per the S3 rules (3-63 characters, lowercase letters, digits, dots, hyphens).
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")


def parse_s3_url(url: str) -> tuple[str, str]:
    """(bucket, prefix) of s3://bucket[/prefix]; the prefix is '' or ends with '/'."""
    parts = urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment:
        raise UsageError(f"malformed URL {url!r}: use s3://bucket[/prefix]")
    bucket = parts.netloc
    if not _BUCKET_RE.match(bucket) or ".." in bucket:
        raise UsageError(f"malformed URL {url!r}: {bucket!r} is not a valid bucket name")
    prefix = parts.path.strip("/")
    if any(part in ("", ".", "..") for part in prefix.split("/")) and prefix:
        raise UsageError(f"malformed URL {url!r}: the prefix has empty, '.' or '..' parts")
    return bucket, f"{prefix}/" if prefix else ""


def _session(source: SourceConfig) -> botocore.session.Session:
    """The botocore session of `source`, given its keys as arguments when it has them: no chain
    runs then, so no profile's credential_process either."""
    credentials = source.credentials
    if credentials is not None and source.profile:
        raise UsageError(f"{source.url}: give a profile or credentials, not both")
    botocore_session = botocore.session.Session(profile=source.profile)
    if credentials is not None:
        botocore_session.set_credentials(
            credentials.access_key_id, credentials.secret_access_key, credentials.session_token
        )
    use_fast_timestamps(botocore_session)  # every stat parses a HEAD's Last-Modified
    return botocore_session


def _setup_error(exc: botocore.exceptions.BotoCoreError, url: str) -> PffsError:
    """One line for botocore's refusal to set up a session: a profile or config file that
    is wrong (a usage error), or credentials the chain could not get (access denied)."""
    first = (str(exc).splitlines() or [type(exc).__name__])[0]
    config_errors = (
        botocore.exceptions.ProfileNotFound,
        botocore.exceptions.PartialCredentialsError,
        botocore.exceptions.InvalidConfigError,
        botocore.exceptions.ConfigParseError,
        botocore.exceptions.ConfigNotFound,
        botocore.exceptions.UnknownCredentialError,
    )
    if isinstance(exc, config_errors):
        return UsageError(f"{url}: AWS credentials or config: {first}")
    return PermissionDenied(f"{url}: cannot get AWS credentials: {first}")


T = TypeVar("T")

# The mount's preflight check must answer within seconds, not after a minute of retries.
QUICK = RetryConfig(attempts=2, base_delay=0.1, max_delay=0.5, total_timeout=5.0)


class S3Calls:
    """Calls to one bucket and prefix (`source_id` names them in metrics and logs)."""

    def __init__(
        self,
        source_id: str,
        url_prefix: str,
        policy: RetryConfig,
        renew: Callable[[], None] | None = None,
    ) -> None:
        """`url_prefix`: the s3:// URL a path is appended to in error messages; `renew`: lets
        go of the connections open now (called once per return of the source)."""
        self.source_id = source_id
        self.url_prefix = url_prefix
        self.policy = policy
        self.retries = 0  # transient failures retried, for stats
        self._renew = renew
        self._recovered = 0  # the source's returns seen so far
        self._renew_lock = threading.Lock()

    def run(
        self,
        fn: Callable[[], T],
        what: str,
        path: str = "",
        quick: bool = False,
        terms: RetryTerms | None = None,
    ) -> T:
        """`fn()` retried while it fails transiently, under the request's `terms`; its last
        failure raised as it is."""
        (result,) = self.stream(lambda: iter((fn(),)), what, path, quick, terms)
        return result

    def stream(
        self,
        start: Callable[[], Iterator[T]],
        what: str,
        path: str = "",
        quick: bool = False,
        terms: RetryTerms | None = None,
    ) -> Iterator[T]:
        """`run` of a streamed answer: what `start()` yields, as it comes (its bytes counted as
        they do), started again where it failed transiently (pffs.retry.stream_with_retry)."""
        if terms is not None and terms.recovered > self._recovered:
            self._renew_after(terms.recovered)
        # Counted, timed and logged when slow by pffs.metrics (one request, retries included).
        with metrics.BackendRequest(self.source_id, what, path, self._count_retry) as request:
            for item in stream_with_retry(
                start,
                is_transient=is_transient,
                policy=QUICK if quick else self.policy,
                what=f"{what} {self.source_id}",
                on_retry=request.retried,
                terms=terms,
            ):
                yield request.received(item)

    def do(self, fn: Callable[[], T], what: str, path: str, terms: RetryTerms | None = None) -> T:
        """`run`, its failure translated into a pffs error about `path`."""
        try:
            return self.run(fn, what, path, terms=terms)
        except Exception as exc:
            raise self.translate(exc, path) from exc

    def head(
        self, client: Any, bucket: str, key: str, path: str, terms: RetryTerms | None = None
    ) -> dict[str, Any] | None:
        """The HEAD answer of the object at `key` (`path` in the source), or None where there
        is none."""
        try:
            answer: dict[str, Any] = self.run(
                lambda: client.head_object(Bucket=bucket, Key=key), "HEAD", path, terms=terms
            )
        except Exception as exc:
            if classify(exc) is Kind.NOT_FOUND:
                return None
            raise self.translate(exc, path) from exc
        return answer

    def _renew_after(self, recovered: int) -> None:
        """The source came back up since the last request: once, let go of the connections."""
        with self._renew_lock:
            if recovered <= self._recovered:
                return  # another thread did it
            self._recovered = recovered
            if self._renew is not None:
                self._renew()

    def translate(self, exc: BaseException, path: str) -> PffsError:
        return translate(exc, self.url(path))

    def url(self, path: str) -> str:
        return self.url_prefix + path

    def _count_retry(self, _exc: BaseException) -> None:
        self.retries += 1


class S3Backend:
    """A bucket, or a prefix inside one."""

    capabilities = Capabilities(
        writes=True, multipart=PART_LIMITS, block_runs=True, tree_pages=True
    )
    writer: S3Writes

    def __init__(self, source: SourceConfig) -> None:
        self.bucket, self.prefix = parse_s3_url(source.url)
        self.max_concurrency = source.max_concurrency

        try:
            botocore_session = _session(source)
            session = boto3.session.Session(botocore_session=botocore_session)
            region = source.region or session.region_name or "us-east-1"
            # TLS verification as boto3 resolves it when not told (AWS_CA_BUNDLE, the profile's
            # ca_bundle, else botocore's bundle), given to both HTTP stacks alike.
            verify: bool | str = botocore_session.get_config_variable("ca_bundle") or True
            config = Config(
                region_name=region,
                connect_timeout=source.connect_timeout,
                read_timeout=source.read_timeout,
                # Our retry helper decides; botocore retrying underneath would multiply attempts.
                retries={"total_max_attempts": 1},
                max_pool_connections=max(10, source.max_concurrency + 4),
                # Writes carry Content-MD5 (s3writes), which every S3 server checks; boto3's own
                # CRC32 would be a second digest of each body, and one RGW 16 does not check.
                request_checksum_calculation="when_required",
            )
            self.client = _client(session, config, verify, source.endpoint_url, source.path_style)
            # The endpoint is what the client uses: botocore also applies AWS_ENDPOINT_URL_S3,
            # AWS_ENDPOINT_URL and a profile's endpoint_url when none is given. One of those that
            # is not AWS's own is taken as given (path-style addressing, no regional redirects).
            self.endpoint_url: str | None = source.endpoint_url
            if self.endpoint_url is None and not _is_aws(self.client.meta.endpoint_url):
                self.endpoint_url = self.client.meta.endpoint_url
                self.client = _client(session, config, verify, self.endpoint_url, source.path_style)
            self.source_id = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
            if self.endpoint_url:
                self.source_id += f"@{self.client.meta.endpoint_url}"
            self.calls = S3Calls(
                self.source_id, f"s3://{self.bucket}/{self.prefix}", source.retry, self._renew
            )
            credentials = session.get_credentials()
            scoped = botocore_session.get_scoped_config()
            # Frozen credentials may be refreshed here, from a credential_process of the user's.
            self.principal = s3_principal(credentials, scoped, os.environ)
            self.principal_key = s3_principal_key(credentials)
        except botocore.exceptions.BotoCoreError as exc:
            raise _setup_error(exc, source.url) from None
        # Object reads and listings go through the lean engine, configured from the same
        # session and client; every other call stays on boto3.
        self.engine = LeanGetEngine(
            self.client,
            credentials,
            self.bucket,
            verify,
            # Idle connections kept: as many as GETs may be in flight, the readers' and the
            # permits of loading ahead (pffs.flow.permits). A smaller pool closes the extra ones
            # after each burst and connects anew.
            config.max_pool_connections + ceiling_for(source.max_concurrency),
            # On AWS itself a bucket of another region is followed there, as boto3 does.
            regional_endpoint=None if self.endpoint_url else _aws_endpoint,
        )
        self.writer = S3Writes(self.client, self.engine, self.calls, self.bucket, self.prefix)

    @property
    def retries(self) -> int:
        """Transient failures retried, reads and writes alike, for stats."""
        return self.calls.retries

    # --- the protocol ------------------------------------------------------------------------

    def check(self) -> None:
        where = f"bucket {self.bucket!r}" + (
            f" at {self.endpoint_url}" if self.endpoint_url else ""
        )
        try:
            self.calls.run(
                lambda: self.client.head_bucket(Bucket=self.bucket), "HEAD bucket", quick=True
            )
            self.calls.run(
                lambda: self.client.list_objects_v2(
                    Bucket=self.bucket, Prefix=self.prefix, Delimiter="/", MaxKeys=1
                ),
                "LIST",
                quick=True,
            )
        except Exception as exc:
            kind = classify(exc)
            if kind is Kind.NOT_FOUND:
                raise NotFound(f"{where} does not exist") from exc
            if kind is Kind.DENIED:
                raise PermissionDenied(
                    f"access to {where} denied ({error_code(exc)}): check the credentials "
                    "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or ~/.aws)"
                ) from exc
            raise self.calls.translate(exc, "") from exc

    def probe(self) -> None:
        try:
            self.engine.probe(self.prefix)  # one try: the breaker's schedule is the retrying
        except Exception as exc:
            if is_transient(exc):  # no answer, or a 5xx: still down
                raise self.calls.translate(exc, "") from exc
            # Any other answer (denied, no such bucket) is the store answering: it is up, and
            # the requests that need it meet that answer themselves.

    def stat(self, path: str, terms: RetryTerms | None = None) -> ObjectInfo:
        name = path.rsplit("/", 1)[-1]
        if not path:
            return _dir_info("")
        key = self.prefix + path
        head = self.calls.head(self.client, self.bucket, key, path, terms)
        if head is not None:
            return _object_info(name, head["ContentLength"], head["LastModified"], head.get("ETag"))
        # Not an object: a directory if anything lives under "key/" (marker object or not).
        first = functools.partial(self._list_page, key + "/", None, max_keys=1)
        page = self.calls.do(first, "LIST", path, terms)
        if page.get("KeyCount", 0) > 0 or page.get("Contents") or page.get("CommonPrefixes"):
            return _dir_info(name)
        raise NotFound(f"{self.calls.url(path)} does not exist")

    def list(self, path: str, terms: RetryTerms | None = None) -> Iterator[ObjectInfo]:
        prefix = self.prefix + (path + "/" if path else "")
        token: str | None = None
        while True:
            page = self.calls.do(
                functools.partial(self._list_page, prefix, token), "LIST", path, terms
            )
            yield from self._page_entries(page, prefix)
            if not page.get("IsTruncated"):
                return
            token = page.get("NextContinuationToken")

    def list_tree(self, path: str, limit: int, terms: RetryTerms | None = None) -> TreePage:
        """One page of the keys under `path` with no delimiter, as the listings `list` would
        give of `path` and of each directory below it: a key's every prefix is a directory
        (its marker object, a key ending in "/", is none of the entries), and a name no
        listing can show hides what lies under it."""
        prefix = self.prefix + (path + "/" if path else "")
        page = self.calls.do(
            functools.partial(self._list_page, prefix, None, None, limit), "LIST", path, terms
        )
        if page.get("IsTruncated"):
            return TreePage({}, complete=False)
        # Per directory, its entries by their key in it (a directory's ends in "/"), the order
        # of a listing's page.
        found: dict[str, dict[str, ObjectInfo]] = {"": {}}
        for obj in page.get("Contents", ()):
            *directories, name = obj["Key"][len(prefix) :].split("/")
            parent = ""
            for directory in directories:
                if not is_valid_name(directory):
                    break
                found[parent][directory + "/"] = _dir_info(directory)
                parent = join(parent, directory)
                found.setdefault(parent, {})
            else:
                if is_valid_name(name):
                    found[parent][name] = _listed(name, obj)
        listings = {
            directory: [entries[key] for key in sorted(entries)]
            for directory, entries in found.items()
        }
        return TreePage(listings, complete=True)

    def read_range(
        self,
        path: str,
        start: int,
        length: int,
        version: str | None,
        terms: RetryTerms | None = None,
    ) -> bytes:
        if length <= 0:
            return b""

        def get() -> bytes:
            with self.engine.get(self.prefix + path, start, length, _if_match(version)) as body:
                data = body.read(length)
                expected = body.content_length
            # min: a store that ignores Range sends a whole object (from 0), read in part.
            if expected is not None and len(data) != min(expected, length):
                # A body cut short by the network: retryable, never served.
                raise Transient(f"truncated body: {len(data)} of {expected} bytes")
            return data

        try:
            return self.calls.run(get, "GET", path, terms=terms)
        except Exception as exc:
            if classify(exc) is Kind.BAD_RANGE:  # asked from past the object's end: nothing
                return b""
            raise self.calls.translate(exc, path) from exc

    def read_blocks(
        self,
        path: str,
        start: int,
        lengths: Sequence[int],
        version: str | None,
        terms: RetryTerms | None = None,
    ) -> Generator[bytes, None, None]:
        """Consecutive pieces of `lengths` from `start` in one GET, each yielded as soon as its
        bytes are in; a retry asks only for the pieces not yet yielded.

        One 16 MiB GET instead of four 4 MiB ones: the per-request cost (signing, parsing,
        the server's own) is paid once, which on a small machine is what limits a cold read.
        """
        done = 0

        def get() -> Iterator[bytes]:
            nonlocal done
            first = start + sum(lengths[:done])
            key, size = self.prefix + path, sum(lengths[done:])
            with self.engine.get(key, first, size, _if_match(version)) as body:
                while done < len(lengths):
                    data = body.read(lengths[done])
                    if len(data) != lengths[done]:
                        raise Transient(f"truncated body: {len(data)} of {lengths[done]} bytes")
                    done += 1
                    yield data

        try:
            yield from self.calls.stream(get, "GET", path, terms=terms)
        except Exception as exc:
            if classify(exc) is Kind.BAD_RANGE:  # the object is shorter than when it was opened
                raise Changed(f"{self.calls.url(path)} changed at the source while open") from exc
            raise self.calls.translate(exc, path) from exc

    # --- helpers -----------------------------------------------------------------------------

    def _renew(self) -> None:
        """The source is back: no connection opened before carries a request (one opened while
        the store was down, or idle through it, may be bound to nothing that answers). The GET
        engine's idle ones close now and those in use when handed back; boto3's idle ones
        close now (its pools are made again on the next call)."""
        self.engine.renew()
        self.client.close()

    def _list_page(
        self, prefix: str, token: str | None, delimiter: str | None = "/", max_keys: int = 1000
    ) -> dict[str, Any]:
        return parse_page(self.engine.list_page(prefix, token, delimiter, max_keys))

    def _page_entries(self, page: dict[str, Any], prefix: str) -> Iterator[ObjectInfo]:
        """One page's directories and objects, merged back into key order."""
        entries: list[tuple[str, ObjectInfo]] = []
        for common in page.get("CommonPrefixes", ()):
            name = common["Prefix"][len(prefix) :].rstrip("/")
            if is_valid_name(name) and "/" not in name:
                entries.append((common["Prefix"], _dir_info(name)))
        for obj in page.get("Contents", ()):
            key = obj["Key"]
            name = key[len(prefix) :]
            if key == prefix or not is_valid_name(name):  # the directory's own marker object
                continue
            entries.append((key, _listed(name, obj)))
        entries.sort(key=lambda pair: pair[0])
        for _, info in entries:
            yield info


def _client(
    session: boto3.session.Session,
    config: Config,
    verify: bool | str,
    endpoint_url: str | None,
    path_style: bool | None,
) -> Any:
    """The boto3 S3 client; path-style addressing by default where an endpoint is given."""
    path = path_style if path_style is not None else bool(endpoint_url)
    addressing = Config(s3={"addressing_style": "path" if path else "auto"})
    try:
        return session.client(
            "s3", endpoint_url=endpoint_url, config=config.merge(addressing), verify=verify
        )
    except ValueError as exc:  # botocore rejects a malformed endpoint URL here
        raise UsageError(f"bad endpoint URL {endpoint_url!r}: {exc}") from exc


def _is_aws(endpoint_url: str) -> bool:
    """Whether an endpoint is AWS's own S3 (where bucket names are global)."""
    host = urlsplit(endpoint_url).hostname or ""
    return host.endswith((".amazonaws.com", ".amazonaws.com.cn"))


def _aws_endpoint(region: str) -> str:
    return f"https://s3.{region}.amazonaws.com"


def _if_match(version: str | None) -> str | None:
    """The precondition a read of `version` carries: always one, so no caller (a peer asking
    an owner included) can read another version than it names. An ETag as S3 gives it
    (quoted); anything else quoted, so it matches no object whose ETag differs (an object
    whose version is an mtime and size, which S3 objects never are, is then refused 412)."""
    if version is None:
        return None
    return version if version.startswith(('"', 'W/"')) else f'"{version}"'


def _dir_info(name: str) -> ObjectInfo:
    return ObjectInfo(name=name, size=0, mtime=0.0, etag=None, is_dir=True)


def _object_info(name: str, size: int, modified: datetime, etag: str | None) -> ObjectInfo:
    """An object as the entry `name`, from what a HEAD or a listing said of it."""
    return ObjectInfo(name=name, size=size, mtime=modified.timestamp(), etag=etag, is_dir=False)


def _listed(name: str, obj: dict[str, Any]) -> ObjectInfo:
    """A listing page's `Contents` entry as the entry `name`."""
    return _object_info(name, obj["Size"], obj["LastModified"], obj.get("ETag"))


# What S3Backend declares, checked by mypy.
_S3: type[Writing] = S3Backend
_S3_RUNS: type[BlockRunReader] = S3Backend
_S3_TREES: type[TreeLister] = S3Backend
