"""pffs's SigV4 signer signs exactly as botocore's S3SigV4Auth does, header for header."""

from __future__ import annotations

import calendar
import time

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import ReadOnlyCredentials

from pffs.backends.sigv4 import SigV4Signer

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
    ours = SigV4Signer().sign(frozen, "eu-west-1", url, headers, now)
    assert ours == theirs


def test_the_signing_key_follows_the_day_region_and_secret() -> None:
    signer = SigV4Signer()
    credentials = ReadOnlyCredentials("AKID", SECRET, None)
    url = "http://h/b/k"
    first = signer.sign(credentials, "us-east-1", url, {}, now=0)["Authorization"]
    assert signer.sign(credentials, "us-east-1", url, {}, now=0)["Authorization"] == first
    assert signer.sign(credentials, "us-east-1", url, {}, now=86_400)["Authorization"] != first
    assert signer.sign(credentials, "us-west-2", url, {}, now=0)["Authorization"] != first
    other = ReadOnlyCredentials("AKID", SECRET + "x", None)
    assert signer.sign(other, "us-east-1", url, {}, now=0)["Authorization"] != first
