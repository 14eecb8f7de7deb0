"""ListObjectsV2 bodies parsed as boto3 parses them: encoded or plain keys, namespaces, pages."""

from __future__ import annotations

import datetime

from pffs.backends.s3listing import parse_page

S3_NS = ' xmlns="http://s3.amazonaws.com/doc/2006-03-01/"'


def body(entries: str, namespace: str = S3_NS, extra: str = "") -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult{namespace}><Name>b</Name>'
        f"<Prefix>d/</Prefix><MaxKeys>1000</MaxKeys>{extra}{entries}</ListBucketResult>"
    ).encode()


OBJECT = (
    "<Contents><Key>{key}</Key><LastModified>2026-11-23T14:34:38.000Z</LastModified>"
    "<ETag>&quot;abc&quot;</ETag><Size>7</Size><StorageClass>STANDARD</StorageClass></Contents>"
)


def test_an_encoded_page_with_a_continuation() -> None:
    entries = OBJECT.format(key="d%2Fa+b%2B%25.txt") + (
        "<CommonPrefixes><Prefix>d%2Fsub%2F</Prefix></CommonPrefixes>"
    )
    extra = (
        "<EncodingType>url</EncodingType><IsTruncated>true</IsTruncated>"
        "<NextContinuationToken>next+page</NextContinuationToken>"
    )
    page = parse_page(body(entries, extra=extra))
    assert page["IsTruncated"] is True
    assert page["NextContinuationToken"] == "next+page"  # tokens are never decoded
    (obj,) = page["Contents"]
    assert obj["Key"] == "d/a b+%.txt"
    assert obj["Size"] == 7 and obj["ETag"] == '"abc"'
    assert obj["LastModified"] == datetime.datetime(2026, 11, 23, 14, 34, 38, tzinfo=datetime.UTC)
    assert page["CommonPrefixes"] == [{"Prefix": "d/sub/"}]


def test_a_store_that_sends_keys_plain_and_no_namespace() -> None:
    page = parse_page(body(OBJECT.format(key="d/a+b%.txt"), namespace="", extra=""))
    assert page["IsTruncated"] is False and "NextContinuationToken" not in page
    assert [obj["Key"] for obj in page["Contents"]] == ["d/a+b%.txt"]
    assert page["CommonPrefixes"] == []


def test_an_empty_page() -> None:
    page = parse_page(body("", extra="<KeyCount>0</KeyCount><IsTruncated>false</IsTruncated>"))
    assert page["Contents"] == [] and page["CommonPrefixes"] == [] and not page["IsTruncated"]
    assert page["KeyCount"] == 0
