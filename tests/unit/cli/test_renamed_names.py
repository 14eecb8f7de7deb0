"""Names changed when "prefetch" stopped naming two things (docs/USAGE.md, "Renamed in this
release"): the old options, the old module and the old preload file still work, each with a
one-line notice (stderr, a DeprecationWarning, a log line); the new names say nothing. The old
command and preload file on a real mount: tests/mount/test_dataset_preload.py."""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

import pytest

from pffs import jobs
from pffs.cli.fluidconfig import read_document, translated
from pffs.cli.fluidpolicy import Policy
from pffs.cli.options import build_parser, mount_config
from pffs.fs.special import HIDDEN_DIR_INO, SpecialFiles
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
    policy = Policy(node_credentials=True)  # the mount has no keys: the node's chain
    config = translated(read_document(str(path)), {}, str(path), policy)
    assert config.cache.readahead_max == 8 << 20 and not config.dataset.enabled
    notices = sorted(capsys.readouterr().err.splitlines())
    assert notices == [
        "pffs: runtimeOptions.dataset-prefetch is deprecated and will be removed, use preload",
        "pffs: runtimeOptions.prefetch-max is deprecated and will be removed, use readahead-max",
    ]


def test_the_former_module_warns_and_gives_the_new_names() -> None:
    sys.modules.pop("pffs.dataset", None)
    with pytest.warns(DeprecationWarning, match="pffs.dataset is deprecated.*use pffs.jobs"):
        former = importlib.import_module("pffs.dataset")
    assert former.PrefetchOrder is former.PreloadOrder is jobs.PreloadOrder
    assert former.prefetch_order is former.preload_order is jobs.preload_order
    assert former.NotAMount is jobs.NotAMount


def test_a_job_hands_its_list_to_the_former_preload_file_of_an_older_mount(
    tmp_path: Path,
) -> None:
    (tmp_path / ".pffs").mkdir()
    (tmp_path / ".pffs" / "prefetch").write_text("")  # an older pffs's mount: no .pffs/preload
    assert jobs.preload_order(str(tmp_path), ["a", "b"]) == ["b"]  # a plain file: no report
    assert (tmp_path / ".pffs" / "prefetch").read_text() == "a\nb\n"


def test_the_former_preload_file_name_is_the_same_file_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    special = SpecialFiles(time.time())
    root = special.dir  # any inode stands for the root here
    assert special.lookup(HIDDEN_DIR_INO, "prefetch", root) is special.preload_file
    assert special.lookup(HIDDEN_DIR_INO, "prefetch", root) is special.preload_file
    assert special.lookup(HIDDEN_DIR_INO, "preload", root) is special.preload_file
    notices = [r.getMessage() for r in caplog.records]
    assert notices == ["/.pffs/prefetch is deprecated and will be removed, use /.pffs/preload"]
    assert [inode.path for inode in special.listed()] == [".pffs/stats", ".pffs/preload"]
