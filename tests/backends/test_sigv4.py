"""pffs's SigV4 signer signs exactly as botocore's S3SigV4Auth does, header for header."""

from __future__ import annotations

import calendar
import hmac
import time
from urllib.parse import urlsplit

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import ReadOnlyCredentials

from pffs.backends.sigv4 import SigV4Signer, _Hmac, host_header

SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
CASES = [
    ("http://127.0.0.1:45999/bucket/train/t%2001.bin", {"Range": "bytes=0-102399"}),
    ("https://bucket.s3.eu-west-1.amazonaws.com/a/b~c", {"Range": "bytes=5-9", "If-Match": '"e"'}),
    ("https://s3.amazonaws.com:443/bucket/k", {}),
    ("http://minio:80/bucket/k", {"Range": "bytes=0-0"}),
    (
        "http://[::1]:9000/bucket?list-type=2&prefix=d%2F&delimiter=%2F&encoding-type=url",
        {},
    ),
    ("http://h:9000/b?prefix=&list-type=2&continuation-token=a%2Bb%3D%3D", {}),
]


@pytest.mark.parametrize(("url", "headers"), CASES)
@pytest.mark.parametrize("token", [None, "session-token/+="])
def test_same_headers_as_botocore(url: str, headers: dict[str, str], token: str | None) -> None:
    theirs_request = AWSRequest(method="GET", url=url, headers=dict(headers))
    frozen = ReadOnlyCredentials("AKIDEXAMPLE", SECRET, token)
    S3SigV4Auth(frozen, "s3", "eu-west-1").add_auth(theirs_request)
    theirs = dict(theirs_request.headers.items())
    # Signed at the second botocore took.
    now = calendar.timegm(time.strptime(theirs["X-Amz-Date"], "%Y%m%dT%H%M%SZ"))
    parts = urlsplit(url)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    ours = SigV4Signer().sign(frozen, "eu-west-1", host_header(url), target, headers, now)
    assert ours == theirs


def test_the_date_follows_the_clock() -> None:
    signer = SigV4Signer()
    credentials = ReadOnlyCredentials("AKID", SECRET, None)
    dates = [signer.sign(credentials, "us-east-1", "h", "/b/k", {}, now)["X-Amz-Date"]
             for now in (0, 0.5, 1, 86_399.9, 86_400)]  # fmt: skip
    assert dates == [
        "19700101T000000Z", "19700101T000000Z", "19700101T000001Z", "19700101T235959Z",
        "19700102T000000Z",
    ]  # fmt: skip


def test_the_signing_key_follows_the_day_region_and_secret() -> None:
    signer = SigV4Signer()

    def authorization(secret: str, region: str, now: float) -> str:
        credentials = ReadOnlyCredentials("AKID", secret, None)
        return signer.sign(credentials, region, "h", "/b/k", {}, now)["Authorization"]

    first = authorization(SECRET, "us-east-1", 0)
    assert authorization(SECRET, "us-east-1", 0) == first
    assert authorization(SECRET, "us-east-1", 86_400) != first
    assert authorization(SECRET, "us-west-2", 0) != first
    assert authorization(SECRET + "x", "us-east-1", 0) != first


@pytest.mark.parametrize("message", [b"", b"AWS4-HMAC-SHA256\n20261123T000000Z", b"x" * 200])
@pytest.mark.parametrize("key_size", [32, 64, 100])
def test_the_kept_hmac_is_hmac_sha256(message: bytes, key_size: int) -> None:
    key = bytes(range(key_size))
    assert _Hmac(key).hexdigest(message) == hmac.new(key, message, "sha256").hexdigest()
