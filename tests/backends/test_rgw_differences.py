"""Where Ceph's RADOS Gateway (16, Debian 12's) answers otherwise than AWS S3, and how pffs copes.
Each test first shows the difference through boto3, then pffs's S3 backend over it.

- CompleteMultipartUpload answers `<ETag></ETag>`: pffs makes the ETag from the parts' (S3's
  rule), so a multipart object's version is the one stat sees (cache keys, If-Match pinning).
- x-amz-checksum-crc32, which boto3 sends by default, is not checked (a wrong one is stored);
  Content-MD5 is: pffs sends it with every PUT and part, so a body corrupted in transit is
  refused, not stored.
- Completing an aborted upload is `500 InternalError` ("already in progress"), not AWS's
  `404 NoSuchUpload`: retried as any 500, then a clear error; nothing is written.
- A missing bucket or key: HEAD is a bare 404 (as on AWS), GET names NoSuchBucket/NoSuchKey;
  pffs says "does not exist" either way.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from pffs.backends import open_backend
from pffs.backends.base import multipart, writable
from pffs.backends.s3writes import PART_LIMITS, multipart_etag
from pffs.config import RetryConfig, SourceConfig
from pffs.errors import NotFound, PffsError
from pffs.testing.faults import FaultProxy
from pffs.testing.rgw import RgwCluster


def _backend(endpoint_url: str, bucket: str, *, attempts: int = 5):
    retry = RetryConfig(attempts=attempts, base_delay=0.01, max_delay=0.05)
    return open_backend(SourceConfig(url=f"s3://{bucket}", endpoint_url=endpoint_url, retry=retry))


def _error(call) -> tuple[int, str]:
    with pytest.raises(ClientError) as caught:
        call()
    response = caught.value.response
    return response["ResponseMetadata"]["HTTPStatusCode"], response["Error"]["Code"]


def test_multipart_etag_missing_from_the_completion(
    rgw: RgwCluster, rgw_s3, rgw_bucket: str, tmp_path: Path
) -> None:
    upload = rgw_s3.create_multipart_upload(Bucket=rgw_bucket, Key="raw")["UploadId"]
    part = rgw_s3.upload_part(
        Bucket=rgw_bucket, Key="raw", UploadId=upload, PartNumber=1, Body=b"x" * 100
    )["ETag"]
    done = rgw_s3.complete_multipart_upload(
        Bucket=rgw_bucket,
        Key="raw",
        UploadId=upload,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part}]},
    )
    assert done["ETag"] == ""  # the difference
    assert rgw_s3.head_object(Bucket=rgw_bucket, Key="raw")["ETag"] == multipart_etag([part])

    backend = _backend(rgw.endpoint, rgw_bucket)
    uploader = multipart(backend)
    assert uploader is not None
    data = os.urandom(PART_LIMITS.min_size + 1000)
    (tmp_path / "f").write_bytes(data)
    upload_id = uploader.begin_upload("big")
    etags = [
        uploader.upload_part("big", upload_id, 1, str(tmp_path / "f"), 0, PART_LIMITS.min_size),
        uploader.upload_part("big", upload_id, 2, str(tmp_path / "f"), PART_LIMITS.min_size, 1000),
    ]
    info = uploader.finish_upload("big", upload_id, etags, len(data))
    assert info.version == backend.stat("big").version
    assert info.version.endswith('-2"')  # no MD5 of the content, yet it pins reads
    assert backend.read_range("big", 10, 5, info.version) == data[10:15]


def test_crc32_is_not_checked_but_content_md5_is(rgw: RgwCluster, rgw_s3, rgw_bucket: str) -> None:
    rgw_s3.put_object(Bucket=rgw_bucket, Key="crc", Body=b"data", ChecksumCRC32="AAAAAA==")
    assert rgw_s3.get_object(Bucket=rgw_bucket, Key="crc")["Body"].read() == b"data"  # stored
    bad_md5 = "AAAAAAAAAAAAAAAAAAAAAA=="
    status, code = _error(
        lambda: rgw_s3.put_object(Bucket=rgw_bucket, Key="md5", Body=b"d", ContentMD5=bad_md5)
    )
    assert (status, code) == (400, "BadDigest")


def _puts_and_parts(method: str, path: str, headers: dict[str, str]) -> bool:
    return method == "PUT"


def test_a_body_corrupted_in_transit_is_refused(
    rgw: RgwCluster, rgw_s3, rgw_bucket: str, tmp_path: Path
) -> None:
    """A byte of the body flipped between pffs and the gateway: without Content-MD5 the gateway
    would store it; with it the write fails, and a retry (the VFS's next flush) stores it right."""
    data = os.urandom(100_000)
    (tmp_path / "f").write_bytes(data)
    with FaultProxy(rgw.port, match=_puts_and_parts) as proxy:
        backend = _backend(proxy.endpoint_url, rgw_bucket, attempts=1)
        writer, uploader = writable(backend), multipart(backend)
        assert writer is not None and uploader is not None
        proxy.inject("flip")
        with pytest.raises(PffsError):
            writer.put("obj", str(tmp_path / "f"))
        assert proxy.injected["flip"] == 1
        status, _ = _error(lambda: rgw_s3.head_object(Bucket=rgw_bucket, Key="obj"))
        assert status == 404  # nothing corrupt was stored
        upload_id = uploader.begin_upload("parts")
        proxy.inject("flip")
        with pytest.raises(PffsError):
            uploader.upload_part("parts", upload_id, 1, str(tmp_path / "f"), 0, len(data))
        uploader.abort_upload("parts", upload_id)
        writer.put("obj", str(tmp_path / "f"))
    assert rgw_s3.get_object(Bucket=rgw_bucket, Key="obj")["Body"].read() == data


def test_completing_an_aborted_upload(rgw: RgwCluster, rgw_s3, rgw_bucket: str) -> None:
    upload = rgw_s3.create_multipart_upload(Bucket=rgw_bucket, Key="k")["UploadId"]
    part = rgw_s3.upload_part(Bucket=rgw_bucket, Key="k", UploadId=upload, PartNumber=1, Body=b"x")[
        "ETag"
    ]
    rgw_s3.abort_multipart_upload(Bucket=rgw_bucket, Key="k", UploadId=upload)
    parts = {"Parts": [{"PartNumber": 1, "ETag": part}]}
    status, code = _error(
        lambda: rgw_s3.complete_multipart_upload(
            Bucket=rgw_bucket, Key="k", UploadId=upload, MultipartUpload=parts
        )
    )
    assert (status, code) == (500, "InternalError")  # AWS: 404 NoSuchUpload
    uploader = multipart(_backend(rgw.endpoint, rgw_bucket, attempts=2))
    assert uploader is not None
    with pytest.raises(PffsError, match="InternalError"):
        uploader.finish_upload("k", upload, [part], 1)
    assert _error(lambda: rgw_s3.head_object(Bucket=rgw_bucket, Key="k"))[0] == 404


def test_missing_bucket_and_key(rgw: RgwCluster, rgw_s3, rgw_bucket: str) -> None:
    nowhere = f"no-{uuid.uuid4().hex[:12]}"
    assert _error(lambda: rgw_s3.head_object(Bucket=nowhere, Key="k")) == (404, "404")
    assert _error(lambda: rgw_s3.get_object(Bucket=nowhere, Key="k")) == (404, "NoSuchBucket")
    assert _error(lambda: rgw_s3.get_object(Bucket=rgw_bucket, Key="k")) == (404, "NoSuchKey")
    with pytest.raises(NotFound, match="does not exist"):
        _backend(rgw.endpoint, nowhere).check()
    backend = _backend(rgw.endpoint, rgw_bucket)
    with pytest.raises(NotFound):
        backend.stat("k")
    with pytest.raises(NotFound):
        backend.read_range("k", 0, 10, None)
