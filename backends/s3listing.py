"""ListObjectsV2 pages parsed from their XML, without botocore's parser.

botocore walks a response's whole shape model and parses each field through its hooks, several
times the CPU of ElementTree and a loop over a large page. The result has the shape boto3 gives
(`Contents` with `Key`, `Size`, `LastModified` as a datetime and `ETag`; `CommonPrefixes` with
`Prefix`; `IsTruncated`; `KeyCount`; `NextContinuationToken`), the fields S3Backend reads. Keys
and prefixes are URL-decoded when the store says it encoded them (`EncodingType` url), as boto3
does; a store that ignores the request for encoding sends them plain.
"""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from typing import Any
from urllib.parse import unquote_plus

from pffs.backends.s3timestamps import parse_timestamp


def parse_page(body: bytes) -> dict[str, Any]:
    """One ListObjectsV2 response body as boto3 would return it (the fields S3Backend reads)."""
    root = ElementTree.fromstring(body)
    contents: list[dict[str, str]] = []
    prefixes: list[str] = []
    page: dict[str, Any] = {}
    for element in root:
        tag = _local(element.tag)
        if tag == "Contents":
            contents.append({_local(field.tag): field.text or "" for field in element})
        elif tag == "CommonPrefixes":
            prefixes.extend(field.text or "" for field in element if _local(field.tag) == "Prefix")
        else:
            page[tag] = element.text
    decode = unquote_plus if page.get("EncodingType") == "url" else _plain
    page["IsTruncated"] = page.get("IsTruncated") == "true"
    if "KeyCount" in page:
        page["KeyCount"] = int(page["KeyCount"] or 0)
    page["Contents"] = [
        {
            "Key": decode(entry["Key"]),
            "Size": int(entry["Size"]),
            "LastModified": parse_timestamp(entry["LastModified"]),
            "ETag": entry.get("ETag"),
        }
        for entry in contents
    ]
    page["CommonPrefixes"] = [{"Prefix": decode(prefix)} for prefix in prefixes]
    return page


def _local(tag: str) -> str:
    """An element's name without its XML namespace (S3's, or none from some stores)."""
    return tag.rpartition("}")[2]


def _plain(text: str) -> str:
    return text
