"""A bad volume attribute fails NodePublishVolume over real gRPC with INVALID_ARGUMENT naming
the attribute, before any mount process starts: each attribute is read by its option's parser
(pffs.optiontable, pffs.optionvalues) at the call, as `pffs mount` would read it. The driver is
the real `pffs csi` process (tests/csi/csi_driver.py); no store is needed, nothing is mounted."""

from __future__ import annotations

import os

import grpc
import pytest

from pffs.optiontable import OPTIONS, Option
from pffs.optionvalues import BadValue
from tests.csi.csi_driver import Driver, mount_daemons, status_of

pytestmark = [pytest.mark.mount]

# Attributes whose option takes any text: the store reads them (an endpoint, a region).
FREE_TEXT = {"endpoint", "region"}
NOT_VALUES = ("lots", "-1", "maybe")


def refused_text(option: Option) -> str:
    """A text the option's parser refuses (its form)."""
    for text in NOT_VALUES:
        try:
            option.parse(text)
        except BadValue:
            return text
    raise AssertionError(f"{option.name} takes every text")


CSI_ROWS = [option for option in OPTIONS if option.csi and option.csi not in FREE_TEXT]
CASES = [
    # The form of every attribute with a parser that can refuse, from the table.
    *((str(option.csi), refused_text(option), "") for option in CSI_ROWS),
    # Ranges: the parser's, and the one check across two attributes.
    ("blockSize", "128M", "is not a block size from 64K to 64M"),
    ("cacheMemory", "4M", "must hold at least two blocks of blockSize"),
]


def test_a_bad_attribute_fails_publish_with_its_name_before_any_mount(driver: Driver) -> None:
    assert {case[0] for case in CASES} == {o.csi for o in CSI_ROWS}  # every row is tried
    for number, (key, text, complaint) in enumerate(CASES):
        target = driver.target(f"pod-{number}")
        context = {"source": "s3://bucket/data", key: text}
        with pytest.raises(grpc.RpcError) as refused:
            driver.publish(f"vol-{number}", target, context)
        assert status_of(refused.value) == grpc.StatusCode.INVALID_ARGUMENT, key
        message = refused.value.details()
        assert message.startswith(f"{key}="), message
        assert complaint in message
        if not complaint:  # the form: the parser's own words, the text first
            assert message.startswith(f"{key}={text!r} is not"), message
        assert not target.exists()
    # Nothing was started: no volume recorded, no mount log, no daemon, no mount command.
    assert os.listdir(driver.state_dir / "volumes") == []
    assert os.listdir(driver.state_dir / "log") == []
    assert mount_daemons(str(driver.state_dir)) == []
    assert "starting pffs mount" not in driver.log()
