"""What an S3 backend writes: PUTs, multipart uploads, deletes, directory markers and renames.

The VFS stages data in a local file and drives uploads (pffs.fs.writes): small objects in one
PUT, large ones in parts it sends in parallel under the backend's limiter. S3 has no rename:
a rename copies, then deletes the original once every copy exists, so a failure half-way loses
nothing (a directory is every object under it, one by one; not atomic).

Every call goes through the backend's `do` (its retries, metrics and error mapping), so a
write fails the same way a read does.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

from pffs.backends.base import ObjectInfo

T = TypeVar("T")
# The largest object one CopyObject request may copy (S3's limit).
COPY_LIMIT = 5 << 30


class Do(Protocol):
    """A backend call with its retries, whose failure is translated into a pffs error."""

    def __call__(self, fn: Callable[[], T], what: str, path: str) -> T: ...


class S3Writes:
    """The writing half of S3Backend, for one bucket and prefix (see the module doc)."""

    def __init__(
        self,
        client: Any,  # boto3's S3 client (no type hints)
        bucket: str,
        prefix: str,
        do: Do,
        stat: Callable[[str], ObjectInfo],
        list_page: Callable[..., dict[str, Any]],
    ) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix
        self._do = do
        self._stat = stat
        self._list_page = list_page  # (prefix, token, delimiter=...) -> a parsed LIST page

    def put(self, path: str, local_path: str) -> ObjectInfo:
        def send() -> dict[str, Any]:
            with open(local_path, "rb") as body:  # reopened per attempt: a retry resends it all
                answer: dict[str, Any] = self.client.put_object(
                    Bucket=self.bucket, Key=self.prefix + path, Body=body
                )
                return answer

        response = self._do(send, "PUT", path)
        return _written(path, os.path.getsize(local_path), response["ETag"])

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
        return _written(path, size, response["ETag"])

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
        """Copy then delete: not atomic; a directory is every object under it, one by one."""
        info = self._stat(old)
        if not info.is_dir:
            self._copy(old, new, info.size)
            self.delete(old)
            return
        moved: list[str] = []
        for key, size in self._keys_under(self.prefix + old + "/"):
            target = new + "/" + key[len(self.prefix + old) + 1 :]
            self._copy(key[len(self.prefix) :], target, size)
            moved.append(key)
        for key in moved:  # deleted only once every copy exists: a failure loses nothing
            self.delete(key[len(self.prefix) :])

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
            every_key = functools.partial(self._list_page, prefix, token, delimiter=None)
            page = self._do(every_key, "LIST", "")
            for obj in page.get("Contents", ()):
                yield obj["Key"], obj["Size"]
            if not page.get("IsTruncated"):
                return
            token = page.get("NextContinuationToken")


def _written(path: str, size: int, etag: str) -> ObjectInfo:
    return ObjectInfo(path.rsplit("/", 1)[-1], size, time.time(), etag, is_dir=False)
