"""Credentials as values (pffs.credentials): the check of each value, the credentials file read
as values, and a config that carries keys without showing or recording them."""

from __future__ import annotations

import json
import logging

import pytest

from pffs.config import (
    FuseConfig,
    MountConfig,
    SourceConfig,
    TableEntry,
    from_json,
    to_json,
)
from pffs.credentials import Credentials, credentials_text, parse_credentials, value_problem
from pffs.errors import UsageError
from pffs.logs import LineFormatter


@pytest.mark.parametrize("value", ["a\nb", "a\rb", "a\x00b", "a\x7fb", "a\x85b", "\t", ""])
def test_what_cannot_be_a_credential(value: str) -> None:
    assert value_problem(value) is not None
    with pytest.raises(UsageError):
        Credentials(value, "secret-key")


def test_a_file_is_read_as_values_and_written_back_the_same() -> None:
    keys = Credentials("AKIA", "s3cr3t/+=%x", "to#ken;")
    assert parse_credentials(credentials_text(keys), "f") == keys
    text = "[other]\naws_access_key_id = B\naws_secret_access_key = C\nregion = x\n"
    assert parse_credentials(text, "f") == Credentials("B", "C")  # the only section
    assert parse_credentials(text + "[default]\n" + text[8:], "f", "other").access_key_id == "B"
    with pytest.raises(UsageError, match=r"^f: no \[default\] section"):
        parse_credentials(text + "[third]\n", "f")
    with pytest.raises(UsageError, match=r"^f is not a credentials file"):
        parse_credentials("aws_access_key_id = A\n", "f")


def test_a_config_shows_and_records_no_secret(caplog: pytest.LogCaptureFixture) -> None:
    keys = Credentials("AKIAVISIBLE", "the-secret-key", "the-session-token")
    source = SourceConfig(url="s3://bucket-a", credentials=keys)
    config = MountConfig(table=(TableEntry("", source),), fuse=FuseConfig(mountpoint="/mnt"))
    assert "the-secret" not in repr(config) and "the-session" not in repr(config)
    recorded = to_json(config)  # the registry's record on disk
    assert "the-secret" not in recorded and "AKIAVISIBLE" not in recorded
    assert json.loads(recorded)["table"][0]["source"]["credentials"] is None
    handed = from_json(to_json(config, with_credentials=True))  # the pipe to the daemon
    assert handed.table == (TableEntry("", source),)
    record = logging.LogRecord(
        "t", logging.ERROR, "", 0, "signed with %s", ("the-secret-key",), None
    )
    assert "the-secret-key" not in LineFormatter().format(record)  # masked in any log line
