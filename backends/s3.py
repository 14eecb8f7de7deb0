"""S3 and S3-compatible stores through boto3 (`s3://bucket[/prefix]`).

Directories are key prefixes: a listing uses the '/' delimiter, so common prefixes become
directories whether or not a "dir/" marker object exists. When a key is both an object and a
prefix ("a" and "a/b"), the directory wins and the object is hidden, as in mountpoint-s3.

Retries are ours (pffs.retry), not botocore's, so every backend behaves alike; botocore's own are
switched off. Credentials come only from boto3's default chain.

Object reads (read_range, read_blocks) and listings (of a directory, of the keys under a
renamed one, and the check that a prefix is a directory) go through the lean GET engine of
s3get.py, which costs far less CPU per request than boto3 (listing pages are parsed
by s3listing.py); it raises the exceptions boto3 would, so one
mapping here (codes to pffs errors, what is transient) and one retry loop serve every call.
Writes (PUTs, multipart uploads, deletes, renames) are s3writes.py's, through the same loop.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

import boto3
import botocore.exceptions
from botocore.config import Config

from pffs import metrics
from pffs.backends.base import (
    BlockRunReader,
    Capabilities,
    MultipartBackend,
    ObjectInfo,
    is_valid_name,
)
from pffs.backends.s3errors import (
    DENIED_CODES,
    NOT_FOUND_CODES,
    error_code,
    is_transient,
    translate,
)
from pffs.backends.s3get import LeanGetEngine
from pffs.backends.s3listing import parse_page
from pffs.backends.s3timestamps import use_fast_timestamps
from pffs.backends.s3writes import S3Writes
from pffs.config import DatasetConfig, RetryConfig, SourceConfig
from pffs.errors import (
    Changed,
    NotFound,
    PermissionDenied,
    PffsError,
    Transient,
    UsageError,
)
from pffs.retry import call_with_retry

T = TypeVar("T")
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


class S3Backend:
    """A bucket, or a prefix inside one."""

    capabilities = Capabilities(writes=True, multipart=True, block_runs=True)

    def __init__(self, source: SourceConfig) -> None:
        self.bucket, self.prefix = parse_s3_url(source.url)
        self.endpoint_url = source.endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None
        self.source_id = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        if self.endpoint_url:
            self.source_id += f"@{self.endpoint_url}"
        self.max_concurrency = source.max_concurrency
        self.retry_policy: RetryConfig = source.retry
        self.retries = 0  # transient failures retried, for stats

        session = boto3.session.Session(profile_name=source.profile)
        use_fast_timestamps(session._session)  # a listing page's CPU: a third of botocore's
        region = source.region or session.region_name or "us-east-1"
        path_style = source.path_style if source.path_style is not None else bool(self.endpoint_url)
        config = Config(
            region_name=region,
            connect_timeout=source.connect_timeout,
            read_timeout=source.read_timeout,
            # Our retry helper decides; botocore retrying underneath would multiply attempts.
            retries={"total_max_attempts": 1},
            max_pool_connections=max(10, source.max_concurrency + 4),
            s3={"addressing_style": "path" if path_style else "auto"},
        )
        try:
            self.client = session.client("s3", endpoint_url=self.endpoint_url, config=config)
        except ValueError as exc:  # botocore rejects a malformed endpoint URL here
            raise UsageError(f"bad endpoint URL {self.endpoint_url!r}: {exc}") from exc
        # Object reads go through the lean engine (a third of boto3's CPU per GET), configured
        # from the same session and client; every other call stays on boto3.
        self._reads = LeanGetEngine(
            self.client,
            session.get_credentials(),
            self.bucket,
            path_style,
            # Idle connections kept: as many as GETs may be in flight, the source's own and
            # dataset prefetch's (its own limiter). A smaller pool closes the extra ones after
            # each burst and connects anew (86 connects per 1,000 GETs of a cold epoch).
            config.max_pool_connections + DatasetConfig.max_concurrency,
            source.connect_timeout,
            source.read_timeout,
            # On AWS itself a bucket of another region is followed there, as boto3 does.
            regional_endpoint=None if self.endpoint_url else _aws_endpoint,
        )
        self._writes = S3Writes(
            self.client, self.bucket, self.prefix, self._do, self.stat, self._list_page
        )

    # --- the protocol ------------------------------------------------------------------------

    def check(self) -> None:
        where = f"bucket {self.bucket!r}" + (
            f" at {self.endpoint_url}" if self.endpoint_url else ""
        )
        try:
            self._call(
                lambda: self.client.head_bucket(Bucket=self.bucket), "HEAD bucket", quick=True
            )
            self._call(
                lambda: self.client.list_objects_v2(
                    Bucket=self.bucket, Prefix=self.prefix, Delimiter="/", MaxKeys=1
                ),
                "LIST",
                quick=True,
            )
        except botocore.exceptions.ClientError as exc:
            code = error_code(exc)
            if code in NOT_FOUND_CODES:
                raise NotFound(f"{where} does not exist") from exc
            if code in DENIED_CODES:
                raise PermissionDenied(
                    f"access to {where} denied ({code}): check the credentials "
                    "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or ~/.aws)"
                ) from exc
            raise self._translate(exc, "") from exc
        except Exception as exc:
            raise self._translate(exc, "") from exc

    def stat(self, path: str) -> ObjectInfo:
        name = path.rsplit("/", 1)[-1]
        if not path:
            return ObjectInfo(name="", size=0, mtime=0.0, etag=None, is_dir=True)
        key = self.prefix + path
        try:
            head = self._call(
                lambda: self.client.head_object(Bucket=self.bucket, Key=key), "HEAD", path=path
            )
            return ObjectInfo(
                name=name,
                size=head["ContentLength"],
                mtime=head["LastModified"].timestamp(),
                etag=head.get("ETag"),
                is_dir=False,
            )
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) not in NOT_FOUND_CODES:
                raise self._translate(exc, path) from exc
        except Exception as exc:
            raise self._translate(exc, path) from exc
        # Not an object: a directory if anything lives under "key/" (marker object or not).
        try:
            first = functools.partial(self._list_page, key + "/", None, max_keys=1)
            page = self._call(first, "LIST", path=path)
        except Exception as exc:
            raise self._translate(exc, path) from exc
        if page.get("KeyCount", 0) > 0 or page.get("Contents") or page.get("CommonPrefixes"):
            return ObjectInfo(name=name, size=0, mtime=0.0, etag=None, is_dir=True)
        raise NotFound(f"{self._url(path)} does not exist")

    def list(self, path: str) -> Iterator[ObjectInfo]:
        prefix = self.prefix + (path + "/" if path else "")
        token: str | None = None
        while True:
            try:
                # Through the lean engine: botocore's parsing of a page costs 3-5x the CPU.
                page = self._call(
                    functools.partial(self._list_page, prefix, token), "LIST", path=path
                )
            except Exception as exc:
                raise self._translate(exc, path) from exc
            yield from self._page_entries(page, prefix)
            if not page.get("IsTruncated"):
                return
            token = page.get("NextContinuationToken")

    def read_range(self, path: str, start: int, length: int, version: str | None) -> bytes:
        if length <= 0:
            return b""

        def get() -> bytes:
            with self._reads.get(self.prefix + path, start, length, _if_match(version)) as body:
                data = body.read(length)
                expected = body.content_length
            # min: a store that ignores Range sends a whole object (from 0), read in part.
            if expected is not None and len(data) != min(expected, length):
                # A body cut short by the network: retryable, never served.
                raise Transient(f"truncated body: {len(data)} of {expected} bytes")
            return data

        try:
            return self._get(get, path)
        except _RangeNotSatisfiable:
            return b""

    def read_blocks(
        self,
        path: str,
        start: int,
        lengths: Sequence[int],
        version: str | None,
        deliver: Callable[[int, bytes], None],
    ) -> None:
        """Consecutive blocks from `start` in one GET, each handed to `deliver(index, bytes)`
        as soon as its bytes are in; a retry asks only for the blocks not yet delivered.

        One 16 MiB GET instead of four 4 MiB ones: the per-request cost (signing, parsing,
        the server's own) is paid once, which on a small machine is what limits a cold read.
        """
        done = 0

        def get() -> None:
            nonlocal done
            first = start + sum(lengths[:done])
            key, size = self.prefix + path, sum(lengths[done:])
            with self._reads.get(key, first, size, _if_match(version)) as body:
                while done < len(lengths):
                    data = body.read(lengths[done])
                    if len(data) != lengths[done]:
                        raise Transient(f"truncated body: {len(data)} of {lengths[done]} bytes")
                    metrics.count_backend_bytes(self.source_id, "GET", len(data))
                    deliver(done, data)
                    done += 1

        try:
            self._get(get, path)
        except _RangeNotSatisfiable as exc:  # the object is shorter than when it was opened
            raise Changed(f"{self._url(path)} changed at the source while open") from exc

    def _get(self, get: Callable[[], T], path: str) -> T:
        """A GET with retries and its errors translated (a changed object is Changed)."""
        try:
            return self._call(get, "GET", path=path)
        except botocore.exceptions.ClientError as exc:
            code = error_code(exc)
            if code in ("InvalidRange", "416"):
                raise _RangeNotSatisfiable from exc
            if code in ("PreconditionFailed", "412"):
                raise Changed(f"{self._url(path)} changed at the source while open") from exc
            raise self._translate(exc, path) from exc
        except Exception as exc:
            raise self._translate(exc, path) from exc

    # --- writing (s3writes.py) ----------------------------------------------------------------

    def put(self, path: str, local_path: str) -> ObjectInfo:
        return self._writes.put(path, local_path)

    def begin_upload(self, path: str) -> str:
        return self._writes.begin_upload(path)

    def upload_part(
        self, path: str, upload_id: str, number: int, local_path: str, offset: int, length: int
    ) -> str:
        return self._writes.upload_part(path, upload_id, number, local_path, offset, length)

    def finish_upload(
        self, path: str, upload_id: str, etags: Sequence[str], size: int
    ) -> ObjectInfo:
        return self._writes.finish_upload(path, upload_id, etags, size)

    def abort_upload(self, path: str, upload_id: str) -> None:
        self._writes.abort_upload(path, upload_id)

    def delete(self, path: str) -> None:
        self._writes.delete(path)

    def make_dir(self, path: str) -> ObjectInfo:
        return self._writes.make_dir(path)

    def remove_dir(self, path: str) -> None:
        self._writes.remove_dir(path)

    def rename(self, old: str, new: str) -> None:
        self._writes.rename(old, new)

    def _do(self, fn: Callable[[], T], what: str, path: str) -> T:
        """A call with retries whose failure is translated into a pffs error."""
        try:
            return self._call(fn, what, path=path)
        except Exception as exc:
            raise self._translate(exc, path) from exc

    # --- helpers -----------------------------------------------------------------------------

    def _list_page(
        self, prefix: str, token: str | None, delimiter: str | None = "/", max_keys: int = 1000
    ) -> dict[str, Any]:
        return parse_page(self._reads.list_page(prefix, token, delimiter, max_keys))

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
            info = ObjectInfo(
                name=name,
                size=obj["Size"],
                mtime=obj["LastModified"].timestamp(),
                etag=obj.get("ETag"),
                is_dir=False,
            )
            entries.append((key, info))
        entries.sort(key=lambda pair: pair[0])
        for _, info in entries:
            yield info

    def _call(self, fn: Callable[[], T], what: str, quick: bool = False, path: str = "") -> T:
        policy = self.retry_policy
        if quick:  # the mount's preflight check must answer within seconds, not a minute
            policy = RetryConfig(attempts=2, base_delay=0.1, max_delay=0.5, total_timeout=5.0)
        # Counted, timed and logged when slow by pffs.metrics (one request, retries included).
        with metrics.BackendRequest(self.source_id, what, path, self._count_retry) as request:
            result: T = request.received(
                call_with_retry(
                    fn,
                    is_transient=is_transient,
                    policy=policy,
                    what=f"{what} {self.source_id}",
                    on_retry=request.retried,
                )
            )
        return result

    def _count_retry(self, _exc: BaseException) -> None:
        self.retries += 1

    def _translate(self, exc: BaseException, path: str) -> PffsError:
        return translate(exc, self._url(path))

    def _url(self, path: str) -> str:
        return f"s3://{self.bucket}/{self.prefix}{path}"


class _RangeNotSatisfiable(Exception):
    """A GET's range starts past the object's end (416)."""


def _aws_endpoint(region: str) -> str:
    return f"https://s3.{region}.amazonaws.com"


def _if_match(version: str | None) -> str | None:
    """The precondition a read carries: only real ETags (quoted) pin a version; a local
    store's mtime+size version is no ETag."""
    return version if version and version.startswith('"') else None


def _dir_info(name: str) -> ObjectInfo:
    return ObjectInfo(name=name, size=0, mtime=0.0, etag=None, is_dir=True)


# What S3Backend declares, checked by mypy.
_S3: type[MultipartBackend] = S3Backend
_S3_RUNS: type[BlockRunReader] = S3Backend
