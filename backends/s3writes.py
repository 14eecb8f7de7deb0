"""What an S3 backend writes: PUTs, multipart uploads, deletes, directory markers and renames.

The VFS stages data in a local file and drives uploads (pffs.fs.writes): small objects in one
PUT, large ones in parts it sends in parallel, each with a permit of the source's flow. S3 has
no rename: a rename copies, then deletes the original once every copy exists, so a failure
half-way loses nothing (a directory is every object under it, one by one; not atomic). Every PUT
and part carries its Content-MD5, the one body check every S3 server makes.

S3Backend owns one S3Writes, its `writer`: the two share the boto3 client, the GET engine (for
the listings of a rename) and the S3Calls every call goes through (retries, metrics, error
mapping), so a write fails the same way a read does.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

from pffs.backends.base import MultipartBackend, ObjectInfo, PartLimits
from pffs.backends.s3get import LeanGetEngine
from pffs.backends.s3listing import parse_page
from pffs.errors import Changed, NotFound
from pffs.retry import RetryTerms

T = TypeVar("T")

# The largest object one CopyObject request may copy (S3's limit).
COPY_LIMIT = 5 << 30
# S3's rules for the parts of an upload: at least 5 MiB but the last, at most 5 GiB, 10,000.
PART_LIMITS = PartLimits(min_size=5 << 20, max_size=5 << 30, max_count=10_000)


class Calls(Protocol):
    """What the writes use of their backend's S3Calls (pffs.backends.s3, which imports this
    module): a call made, retried and its failure translated; a HEAD; a path's URL."""

    def do(
        self, fn: Callable[[], T], what: str, path: str, terms: RetryTerms | None = None
    ) -> T: ...

    def head(
        self, client: Any, bucket: str, key: str, path: str, terms: RetryTerms | None = None
    ) -> dict[str, Any] | None: ...

    def url(self, path: str) -> str: ...


class S3Writes:
    """The writes to one bucket and prefix (see the module doc)."""

    def __init__(
        self,
        client: Any,  # boto3's S3 client (no type hints)
        engine: LeanGetEngine,
        calls: Calls,
        bucket: str,
        prefix: str,
    ) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix
        self._engine = engine
        self._calls = calls
        self._do = calls.do

    def put(self, path: str, local_path: str) -> ObjectInfo:
        digest = _file_md5(local_path)

        def send() -> dict[str, Any]:
            with open(local_path, "rb") as body:  # reopened per attempt: a retry resends it all
                answer: dict[str, Any] = self.client.put_object(
                    Bucket=self.bucket, Key=self.prefix + path, Body=body, ContentMD5=digest
                )
                return answer

        response = self._do(send, "PUT", path)
        return _written(path, os.path.getsize(local_path), response["ETag"])

    def put_new(self, path: str, body: bytes) -> bool:
        """PUT `body` as `path` unless an object is there (`If-None-Match: *`): whether it was
        written. A store that ignores the condition (s3rver) writes it anyway: True."""
        digest = base64.b64encode(hashlib.md5(body, usedforsecurity=False).digest()).decode()
        key = self.prefix + path

        def send() -> None:
            self.client.put_object(
                Bucket=self.bucket, Key=key, Body=body, ContentMD5=digest, IfNoneMatch="*"
            )

        try:
            self._do(send, "PUT", path)
        except Changed:  # 412: the object is there
            return False
        return True

    def begin_upload(self, path: str) -> str:
        response = self._do(
            lambda: self.client.create_multipart_upload(Bucket=self.bucket, Key=self.prefix + path),
            "CreateMultipartUpload",
            path,
        )
        return str(response["UploadId"])

    def upload_part(
        self, path: str, upload_id: str, number: int, local_path: str, offset: int, length: int
    ) -> str:
        with open(local_path, "rb") as f:
            data = os.pread(f.fileno(), length, offset)
        response = self._do(
            lambda: self.client.upload_part(
                Bucket=self.bucket,
                Key=self.prefix + path,
                UploadId=upload_id,
                PartNumber=number,
                Body=data,
                ContentMD5=_md5(data),
            ),
            f"UploadPart {number}",
            path,
        )
        return str(response["ETag"])

    def finish_upload(
        self, path: str, upload_id: str, etags: Sequence[str], size: int
    ) -> ObjectInfo:
        parts = [{"PartNumber": n, "ETag": etag} for n, etag in enumerate(etags, 1)]
        response = self._do(
            lambda: self.client.complete_multipart_upload(
                Bucket=self.bucket,
                Key=self.prefix + path,
                UploadId=upload_id,
                MultipartUpload={"Parts": parts},
            ),
            "CompleteMultipartUpload",
            path,
        )
        # RGW 16 answers the completion with an empty <ETag></ETag>; the object's ETag is then
        # S3's rule for multipart objects, made from the parts' ETags, as stat will see it.
        return _written(path, size, response.get("ETag") or multipart_etag(etags))

    def abort_upload(self, path: str, upload_id: str) -> None:
        self._do(
            lambda: self.client.abort_multipart_upload(
                Bucket=self.bucket, Key=self.prefix + path, UploadId=upload_id
            ),
            "AbortMultipartUpload",
            path,
        )

    def delete(self, path: str) -> None:
        key = self.prefix + path
        self._do(lambda: self.client.delete_object(Bucket=self.bucket, Key=key), "DELETE", path)

    def make_dir(self, path: str) -> ObjectInfo:
        # A "dir/" marker object: the directory exists, empty, as S3 consoles make it.
        key = self.prefix + path + "/"
        self._do(lambda: self.client.put_object(Bucket=self.bucket, Key=key, Body=b""), "PUT", path)
        return ObjectInfo(path.rsplit("/", 1)[-1], 0, time.time(), None, is_dir=True)

    def remove_dir(self, path: str) -> None:
        self.delete(path + "/")  # its marker, if any; the VFS checked it is empty

    def rename(self, old: str, new: str) -> None:
        """Copy then delete: not atomic; a directory is every object under it, one by one.
        An object at `old` is what moves, as stat sees it, even where keys live under it too."""
        size = self._object_size(old)
        if size is not None:
            self._copy(old, new, size)
            self.delete(old)
            return
        moved: list[str] = []
        for key, size in self._keys_under(self.prefix + old + "/"):
            target = new + "/" + key[len(self.prefix + old) + 1 :]
            self._copy(key[len(self.prefix) :], target, size)
            moved.append(key)
        if not moved:
            raise NotFound(f"{self._calls.url(old)} does not exist")
        for key in moved:  # deleted only once every copy exists: a failure loses nothing
            self.delete(key[len(self.prefix) :])

    def _object_size(self, path: str) -> int | None:
        """The size of the object at `path`, or None where there is none."""
        head = self._calls.head(self.client, self.bucket, self.prefix + path, path)
        return None if head is None else int(head["ContentLength"])

    def _copy(self, old: str, new: str, size: int) -> None:
        source = {"Bucket": self.bucket, "Key": self.prefix + old}
        if size <= COPY_LIMIT:
            self._do(
                lambda: self.client.copy_object(
                    Bucket=self.bucket, Key=self.prefix + new, CopySource=source
                ),
                "COPY",
                old,
            )
        else:  # beyond one CopyObject's 5 GiB: boto3's managed copy in parts
            self._do(lambda: self.client.copy(source, self.bucket, self.prefix + new), "COPY", old)

    def _keys_under(self, prefix: str) -> Iterator[tuple[str, int]]:
        token: str | None = None
        while True:
            every_key = functools.partial(_parsed_page, self._engine, prefix, token)
            page = self._do(every_key, "LIST", "")
            for obj in page.get("Contents", ()):
                yield obj["Key"], obj["Size"]
            if not page.get("IsTruncated"):
                return
            token = page.get("NextContinuationToken")


def _parsed_page(engine: LeanGetEngine, prefix: str, token: str | None) -> dict[str, Any]:
    """One page of every key under `prefix` (no delimiter), parsed."""
    return parse_page(engine.list_page(prefix, token, None))


def _md5(data: bytes) -> str:
    """The Content-MD5 header of a body: every S3 server verifies it, RGW 16 included, which
    ignores the x-amz-checksum-* headers boto3 sends by default (a wrong one is stored)."""
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()


def _file_md5(path: str) -> str:
    """The Content-MD5 header of a file's bytes, read in 1 MiB pieces."""
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return base64.b64encode(digest.digest()).decode()


def multipart_etag(part_etags: Sequence[str]) -> str | None:
    """S3's ETag of an object uploaded in parts: the MD5 of the parts' binary MD5s, a dash and
    how many parts. None where a part's ETag is no MD5 (encrypted with a KMS key on AWS): the
    object's version is then its mtime and size until it is next stat'ed."""
    digests = []
    for etag in part_etags:
        hexed = etag.strip('"')
        if not _MD5_HEX.fullmatch(hexed):
            return None
        digests.append(bytes.fromhex(hexed))
    combined = hashlib.md5(b"".join(digests), usedforsecurity=False).hexdigest()
    return f'"{combined}-{len(digests)}"'


_MD5_HEX = re.compile("[0-9a-f]{32}")


def _written(path: str, size: int, etag: str | None) -> ObjectInfo:
    return ObjectInfo(path.rsplit("/", 1)[-1], size, time.time(), etag, is_dir=False)


# What S3Writes takes, checked by mypy.
_WRITES: type[MultipartBackend] = S3Writes
