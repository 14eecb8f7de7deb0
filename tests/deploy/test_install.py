"""The README's plain install, done: the wheel built from the repository, installed with pip
into a fresh virtual environment (not the editable install the tests run from), gives a `pffs`
that mounts a `file://` tree through the kernel, reads it back and unmounts.

The fresh environment gets pffs's dependencies the way a user's pip would: from the configured
index and pip's cache (about 15 s here; a first run compiles pyfuse3 against libfuse3).
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from pffs.mounting.kernel import find_mount, wait_unmounted
from pffs.version import __version__

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str | Path, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    # The environment without the outer venv's traces, and run from outside the repository,
    # so that nothing but the fresh environment's own site-packages can provide `pffs`.
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    # pip's own cache, not the tests' scratch XDG_CACHE_HOME (tests/conftest.py): there pyfuse3
    # would be compiled again from its sdist on every run.
    env["PIP_CACHE_DIR"] = os.environ.get("PIP_CACHE_DIR") or os.path.expanduser("~/.cache/pip")
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"  # no question to the index about pip itself
    result = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, f"{args}: {result.stdout}{result.stderr}"
    return result


def _wheel_sources() -> set[str]:
    """What the wheel must hold: every module of pffs, backends/ and csi/ under pffs's name,
    and the CSI stubs' proto and type file."""
    where = {"pffs": "pffs", "backends": "pffs/backends", "csi": "pffs/csi"}
    wanted = set()
    for folder, package in where.items():
        for path in (ROOT / folder).rglob("*"):
            if "__pycache__" in path.parts or path.suffix not in (".py", ".proto", ".pyi"):
                continue
            wanted.add(f"{package}/{path.relative_to(ROOT / folder).as_posix()}")
    return wanted


@pytest.mark.slow
@pytest.mark.mount
def test_the_wheel_installs_into_a_fresh_venv_and_mounts(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    # The build backend comes from this venv (--no-build-isolation): the same wheel, without
    # fetching setuptools again.
    build = ("wheel", "-q", "--no-deps", "--no-build-isolation", "-w", dist, ROOT)
    _run(sys.executable, "-m", "pip", *build, cwd=tmp_path)
    [wheel] = dist.glob("pffs-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = _wheel_sources() - names
    assert not missing, f"the wheel lacks {sorted(missing)}"

    env_dir = tmp_path / "venv"
    # A bare environment, filled by this venv's pip (--python): a pip of its own would take
    # longer to put in (ensurepip) than pffs. --no-compile: the bytecode of every dependency
    # (botocore's thousands of modules) is no part of what is checked; what runs below
    # compiles what it imports.
    venv.create(env_dir, with_pip=False)
    bin_dir = env_dir / "bin"
    install = ("install", "-q", "--no-compile", wheel)
    _run(sys.executable, "-m", "pip", "--python", bin_dir / "python", *install, cwd=tmp_path)
    where = _run(bin_dir / "python", "-c", "import pffs; print(pffs.__file__)", cwd=tmp_path)
    assert Path(where.stdout.strip()).is_relative_to(env_dir), where.stdout
    version = _run(bin_dir / "pffs", "--version", cwd=tmp_path)
    assert __version__ in version.stdout
    # The parts beside the mount import from the wheel too: the CSI driver and its stubs.
    _run(bin_dir / "python", "-c", "import pffs.csi.server, pffs.backends.s3", cwd=tmp_path)

    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "a.txt").write_bytes(b"from the wheel\n")
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    options = ("--cache-dir", tmp_path / "cache")
    _run(bin_dir / "pffs", "mount", f"file://{tree}", mountpoint, *options, cwd=tmp_path)
    try:
        entry = find_mount(str(mountpoint))
        assert entry is not None and entry.fstype == "fuse.pffs", entry
        assert (mountpoint / "sub" / "a.txt").read_bytes() == b"from the wheel\n"
    finally:
        _run(bin_dir / "pffs", "umount", mountpoint, cwd=tmp_path)
    assert wait_unmounted(str(mountpoint))
