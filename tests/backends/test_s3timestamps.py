"""The fast timestamp parser gives the datetimes botocore's own parser gives, for every form."""

from __future__ import annotations

import pytest
from botocore import parsers

from pffs.backends.s3timestamps import parse_timestamp

FORMS = [
    "2026-11-23T14:34:38.000Z",  # ListObjectsV2's LastModified
    "2026-11-23T14:34:38Z",
    "2026-11-23T14:34:38.123456+02:00",
    "Mon, 23 Nov 2026 14:34:38 GMT",  # the Last-Modified header
    "Mon, 23 Nov 2026 14:34:38 +0100",
    "1700000000",  # epoch seconds, as some stores send
    "2026-11-23T14:34:38",  # no zone: botocore decides
    "Mon, 23 Nov 2026 14:34:38 -0000",  # "unknown zone" in RFC 2822: botocore decides
]


@pytest.mark.parametrize("value", FORMS)
def test_same_datetime_as_botocore(value: str) -> None:
    ours, theirs = parse_timestamp(value), parsers.DEFAULT_TIMESTAMP_PARSER(value)
    assert ours == theirs and ours.utcoffset() == theirs.utcoffset()


def test_what_botocore_refuses_is_refused() -> None:
    with pytest.raises(ValueError):
        parse_timestamp("not a time")
