"""Options renamed when "prefetch" stopped naming two things (README, "Renamed in this
release"): the old names still set the new settings, each with a one-line notice on stderr;
the new names print nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from pffs.cli.fluidconfig import read_document, translated
from pffs.cli.options import build_parser, mount_config
from tests.fluid_controller import fluid_config

OLD_AND_NEW = [
    ("--prefetch-max", "--readahead-max", "8M"),
    ("--dataset-prefetch", "--preload", "off"),
    ("--dataset-prefetch-budget", "--preload-budget", "16M"),
]


def settings(*options: str) -> tuple[int, bool, int]:
    args = build_parser().parse_args(["mount", "s3://bucket", "/mnt/unused", *options])
    config = mount_config(args)
    return config.cache.readahead_max, config.dataset.enabled, config.dataset.budget


@pytest.mark.parametrize(("old", "new", "value"), OLD_AND_NEW)
def test_an_old_option_sets_the_new_setting_with_a_notice(
    old: str, new: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert settings(new, value) == settings(old, value)
    assert capsys.readouterr().err == f"pffs: {old} is deprecated and will be removed, use {new}\n"


def test_the_new_options_print_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert settings("--readahead-max", "8M", "--preload", "off", "--preload-budget", "16M") == (
        8 << 20,
        False,
        16 << 20,
    )
    assert capsys.readouterr().err == ""


def test_old_names_are_not_in_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["mount", "--help"])
    shown = capsys.readouterr().out
    assert "--readahead-max" in shown and "--preload-budget" in shown
    assert "prefetch" not in shown


def test_an_old_fluid_option_key_works_with_a_notice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = {"mounts": [{"mountPoint": "s3://bucket-a", "name": "a"}]}
    runtime = {"prefetch-max": "8M", "dataset-prefetch": "off"}
    path = tmp_path / "config.json"
    path.write_text(fluid_config(dataset, "/runtime-mnt/x", tmp_path, runtime))
    with translated(read_document(str(path)), {}, str(path)) as config:
        assert config.cache.readahead_max == 8 << 20 and not config.dataset.enabled
    notices = sorted(capsys.readouterr().err.splitlines())
    assert notices == [
        "pffs: runtimeOptions.dataset-prefetch is deprecated and will be removed, use preload",
        "pffs: runtimeOptions.prefetch-max is deprecated and will be removed, use readahead-max",
    ]
