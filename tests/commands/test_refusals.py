"""`pffs` run as a process refuses what it must with one line on stderr and its exit status,
and makes nothing first: `pffs fluid` on a refused Dataset or a bad config (exit 2), `pffs
mount` with its log file at a link another user planted. The reasons themselves are checked
in process, in tests/unit (cli/test_fluid_policy.py, cli/test_fluid_config.py,
test_private_files.py); these start `pffs`, so they live outside tests/unit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_pffs
from tests.fluid_controller import fluid_config
from tests.unit.cli.test_fluid_config import TARGET, s3_mount
from tests.unit.cli.test_fluid_policy import s3_dataset, secret_dataset, secrets
from tests.unit.test_private_files import _planted, needs_root

__all__ = ["secrets"]  # the fixture, shared with the in-process tests

REFUSED_IN_A_PROCESS = {
    "outside the secrets": (
        secret_dataset("/proc/self/environ"),
        "mounts[0].options.access-key-id: a secret file must be under",
    ),
    "local": (
        {"mounts": [{"mountPoint": "local:///", "name": "root"}]},
        "mounts[0].mountPoint: local directories are not allowed here",
    ),
    "keyless": (
        {"mounts": [{"mountPoint": "s3://bucket-a", "name": "a"}]},
        "mounts[0]: an S3 mount without keys would use the node's own credentials",
    ),
    "cache-dir": (
        s3_dataset(**{"cache-dir": "/etc"}),
        "mounts[0].options.cache-dir: only the profile sets this option",
    ),
}


@pytest.mark.parametrize("dataset,line", REFUSED_IN_A_PROCESS.values(), ids=REFUSED_IN_A_PROCESS)
def test_pffs_fluid_refuses_with_one_line_and_exit_2(
    tmp_path: Path, secrets: Path, dataset: dict[str, Any], line: str
) -> None:
    path = tmp_path / "config.json"
    path.write_text(fluid_config(dataset, str(tmp_path / "target"), secrets))
    argv = ["fluid", "--config", str(path), "--secrets-dir", str(secrets)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    result = subprocess.run(
        [sys.executable, "-m", "pffs", *argv], capture_output=True, text=True, timeout=60, env=env
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"pffs: {line}") and result.stderr.count("\n") == 1
    assert not (tmp_path / "target").exists(), "refused before anything is made"


def test_bad_config_is_one_line_and_exit_2(tmp_path: Path, secrets: Path) -> None:
    dataset = {"mounts": [s3_mount(options={"readahead-max": "lots"})]}
    path = tmp_path / "config.json"
    path.write_text(fluid_config(dataset, TARGET, secrets))
    for argv in (["fluid", "--config", str(path)], ["fluid", "--check", "--config", "/nope"]):
        result = subprocess.run(
            [sys.executable, "-m", "pffs", *argv], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("pffs: ")


@needs_root
def test_mount_refuses_a_planted_log_file_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "tree").mkdir()
    (tmp_path / "mnt").mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    _planted(tmp_path / "pffs.log", victim)
    result = run_pffs(
        "mount", f"file://{tmp_path / 'tree'}", str(tmp_path / "mnt"),
        "--log-file", str(tmp_path / "pffs.log"), "--cache-dir", "none",
    )  # fmt: skip
    assert result.returncode != 0
    assert "cannot open the log file" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert victim.read_text() == "keep\n"
    assert not os.path.ismount(tmp_path / "mnt")
