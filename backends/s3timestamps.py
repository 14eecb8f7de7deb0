"""Timestamps of S3 responses parsed cheaply: for listing pages (pffs.backends.s3listing) and
for the boto3 session S3Backend uses (a HEAD's Last-Modified, on every stat).

botocore parses every timestamp with dateutil's general parser, about a fifth of a HEAD's client
CPU. S3 sends two forms only: ISO 8601 in XML bodies (`2026-11-23T14:34:38.000Z`) and RFC 1123
in headers (`Mon, 23 Nov 2026 14:34:38 GMT`). Both have fast parsers in the standard library;
anything else, or a time without a zone, goes to botocore's own parser, so the answers are the
same datetimes botocore would give.
"""

from __future__ import annotations

import datetime
import email.utils
from typing import Any

from botocore import parsers


def parse_timestamp(value: str) -> datetime.datetime:
    """A timestamp of an S3 response, as botocore's default parser returns it."""
    try:
        parsed = datetime.datetime.fromisoformat(value)
    except (TypeError, ValueError):
        try:
            parsed = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return botocore_parse(value)
    if parsed.tzinfo is None:  # botocore decides what a time without a zone means
        return botocore_parse(value)
    return parsed


def botocore_parse(value: str) -> datetime.datetime:
    result: datetime.datetime = parsers.DEFAULT_TIMESTAMP_PARSER(value)
    return result


def use_fast_timestamps(botocore_session: Any) -> None:
    """Make clients created from now on by `botocore_session` parse timestamps this way,
    through botocore's public knob for it (its response parser factory's defaults, as the AWS
    CLI sets them); other sessions in the process keep botocore's parser."""
    factory = botocore_session.get_component("response_parser_factory")
    factory.set_parser_defaults(timestamp_parser=parse_timestamp)
