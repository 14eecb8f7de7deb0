"""The metadata TTL options: each TTL alone, all three at once, and `indefinite`."""

from __future__ import annotations

import pytest

from pffs.cli import options
from pffs.config import INDEFINITE_TTL, MetaConfig


def meta(*flags: str) -> MetaConfig:
    args = options.build_parser().parse_args(["mount", "s3://bucket", "/mnt/x", *flags])
    return options.mount_config(args).meta


def test_defaults() -> None:
    assert meta() == MetaConfig()


def test_metadata_ttl_sets_three_and_each_option_overrides_it() -> None:
    config = meta("--metadata-ttl", "indefinite", "--attr-ttl", "2")
    assert config.attr_ttl == 2.0
    assert config.entry_ttl == config.dir_ttl == INDEFINITE_TTL
    assert config.negative_ttl == MetaConfig.negative_ttl  # absent names are not assumed stable
    assert meta("--metadata-ttl", "30").dir_ttl == 30.0


@pytest.mark.parametrize("bad", ["forever", "-1", "nan"])
def test_a_bad_ttl_is_refused(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        meta("--metadata-ttl", bad)
    assert exited.value.code == 2
    assert f"{bad!r} is not a number of seconds" in capsys.readouterr().err
