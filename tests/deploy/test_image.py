"""The image recipe and the systemd unit, checked against the code: the Dockerfile's COPY
sources exist and survive .dockerignore, the build context makes a wheel holding the whole CLI
(with the demo extra the image installs), and the unit's commands are pffs command lines.

No Docker here: the image itself is not built.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from pffs.cli import options

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

# --- the Dockerfile ------------------------------------------------------------------------------


def _dockerfile() -> list[list[str]]:
    """The Dockerfile's instructions as word lists (continuations joined, comments dropped)."""
    text = (DEPLOY / "Dockerfile").read_text()
    text = re.sub(r"^\s*#.*\n", "", text, flags=re.M).replace("\\\n", " ")
    return [line.split() for line in text.splitlines() if line.strip()]


def _ignored(path: str) -> bool:
    """Whether .dockerignore keeps `path` out of the build context (last match wins)."""
    ignored = False
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        pattern = line.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        top = path.split("/")[0]
        if fnmatch.fnmatch(path, pattern) or fnmatch.fnmatch(top, pattern):
            ignored = not negate
    return ignored


def copied_sources() -> list[str]:
    sources = []
    for words in _dockerfile():
        if words[0] == "COPY" and not any(w.startswith("--from") for w in words):
            sources += words[1:-1]
    return sources


def test_dockerfile_copies_what_exists_and_runs_pffs_under_tini() -> None:
    instructions = _dockerfile()
    bases = [w[1] for w in instructions if w[0] == "FROM"]
    assert bases == ["${PYTHON_IMAGE}", "${PYTHON_IMAGE}"]
    [arg] = [w[1] for w in instructions if w[0] == "ARG"]
    assert re.fullmatch(r"PYTHON_IMAGE=python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", arg)
    sources = copied_sources()
    assert {"pyproject.toml", "README.md", "pffs", "backends", "csi"} <= set(sources)
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not _ignored(source), f".dockerignore drops {source}"
    assert _ignored("tests") and _ignored("bench") and _ignored(".venv")
    [entrypoint] = [w for w in instructions if w[0] == "ENTRYPOINT"]
    assert json.loads(" ".join(entrypoint[1:])) == ["/usr/bin/tini", "--", "pffs"]
    assert PROJECT["scripts"]["pffs"] == "pffs.cli.main:main"
    assert PROJECT["scripts"]["mount.pffs"] == "pffs.cli.mounthelper:main"
    [user] = [w[1] for w in instructions if w[0] == "USER"]
    assert not user.startswith("0") and user != "root"
    apt = " ".join(" ".join(w) for w in instructions if "apt-get" in w)
    assert "fuse3" in apt and "tini" in apt


@pytest.mark.slow
def test_the_build_context_makes_a_wheel_with_the_whole_cli(tmp_path: Path) -> None:
    """What the Dockerfile copies is enough for `pip install`: the wheel built from only those
    files has every module the CLI imports (the image build itself needs Docker)."""
    context = tmp_path / "context"
    context.mkdir()
    for source in copied_sources():
        src = ROOT / source
        if src.is_dir():
            shutil.copytree(src, context / source, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, context / source)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            str(context),
        ],
        check=True,
        capture_output=True,
    )
    [wheel] = (tmp_path / "dist").glob("pffs-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in (
        "pffs/cli/main.py",
        "pffs/cli/mounthelper.py",
        "pffs/csi/server.py",
        "pffs/csi/affinity/extender.py",
        "pffs/backends/s3.py",
        "pffs/csi/proto/csi_pb2.py",
        "pffs/csi/proto/csi_pb2_grpc.py",
    ):
        assert module in names, module
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "mount.pffs = pffs.cli.mounthelper:main" in text and "pffs = pffs.cli.main:main" in text
    # `pffs demo` in the image: the Dockerfile installs the demo extra, which brings moto.
    metadata = next(n for n in names if n.endswith("METADATA"))
    requires = zipfile.ZipFile(wheel).read(metadata).decode()
    assert "Provides-Extra: demo" in requires
    assert any(
        line.startswith("Requires-Dist: moto[server]") and 'extra == "demo"' in line
        for line in requires.splitlines()
    ), requires
    run_lines = [" ".join(words) for words in _dockerfile() if words[0] == "RUN"]
    assert any("pip install --no-cache-dir '/src[demo]'" in line for line in run_lines), run_lines


def test_systemd_unit_runs_a_pffs_command_line() -> None:
    """deploy/systemd/pffs@.service: ExecStart and ExecStop are pffs command lines (%i = x)."""
    unit = (DEPLOY / "systemd" / "pffs@.service").read_text().replace("\\\n", " ")
    lines = dict(
        line.split("=", 1) for line in unit.splitlines() if re.match(r"^Exec(Start|Stop)=", line)
    )
    start = lines["ExecStart"].replace("%i", "x").split()
    assert start[0].endswith("/pffs")
    args = options.build_parser().parse_args(start[1:])
    assert args.command == "mount" and args.foreground and args.config == "/etc/pffs/x.toml"
    assert args.mountpoint == "/mnt/x" and args.source is None
    # allow_other, but no other user reads the data until the admin says who may.
    assert args.allow_other and (args.file_mode, args.dir_mode) == (0o640, 0o750)
    assert "--uid" not in start and "--gid" not in start  # root:root
    stop = lines["ExecStop"].lstrip("-").replace("%i", "x").split()
    assert options.build_parser().parse_args(stop[1:]).mountpoint == "/mnt/x"
