"""Security: credentials stay out of argv, logs and readable files; cache and staging files are
private; allow_other only when asked; a source cannot be left through `..` or symlinks."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from pathlib import Path

import pytest

from pffs.backends import open_backend
from pffs.config import SourceConfig
from pffs.errors import PermissionDenied
from pffs.mounting.registry import registry_path
from tests.conftest import mounted

SECRET = "pffs-secret-Zq81xV0"


def mount_options(mountpoint: Path) -> set[str]:
    with open("/proc/self/mounts", encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            if fields[1] == str(mountpoint):
                return set(fields[3].split(","))
    raise AssertionError(f"{mountpoint} is not mounted")


def private_tree(root: Path) -> list[str]:
    """Every file or directory under `root` that others could read or enter."""
    exposed = []
    for directory, _dirs, files in os.walk(root):
        for name in [directory, *(os.path.join(directory, f) for f in files)]:
            try:
                mode = os.lstat(name).st_mode
            except FileNotFoundError:  # a staging file retired while the tree was walked
                continue
            if stat.S_IMODE(mode) & 0o077:
                exposed.append(f"{name} {stat.filemode(mode)}")
    return exposed


@pytest.mark.mount
def test_credentials_and_private_files(s3, bucket, moto, tmp_path, monkeypatch) -> None:
    s3.put_object(Bucket=bucket, Key="data.bin", Body=os.urandom(5 << 20))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)  # moto accepts any secret
    monkeypatch.setenv("AWS_SESSION_TOKEN", SECRET + "-token")
    cache, mnt = tmp_path / "cache", tmp_path / "mnt"
    options = ("--endpoint-url", moto.endpoint_url, "--cache-dir", str(cache))
    os.umask(0o022)  # the user's usual umask: pffs must not rely on a stricter one
    with mounted(f"s3://{bucket}", mnt, *options, "--debug") as m:
        assert (m / "data.bin").read_bytes()
        with open(m / "new.bin", "wb") as f:  # a staging file exists while this is open
            f.write(b"written")
            f.flush()
            assert private_tree(cache) == []
            staged = list((cache / "staging").iterdir())
            assert staged and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in staged)
        assert stat.S_IMODE(cache.stat().st_mode) == 0o700
        assert private_tree(cache) == []
        assert "allow_other" not in mount_options(m)
        daemons = [
            pid
            for pid in os.listdir("/proc")
            if pid.isdigit() and _cmdline(pid).startswith("python") and "_daemon" in _cmdline(pid)
        ]
        assert daemons, "no pffs daemon found"
        assert all(SECRET not in _cmdline(pid) for pid in daemons)
        record = Path(registry_path(str(mnt)))
        assert SECRET not in record.read_text()
        assert stat.S_IMODE(record.stat().st_mode) == 0o600
    log = tmp_path / "mnt.log"
    assert SECRET not in log.read_text() and "DEBUG" in log.read_text()
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").rsplit("/", 1)[-1]
    except OSError:
        return ""


@pytest.mark.mount
def test_allow_other_only_when_asked(s3, bucket, mount_s3) -> None:
    with mount_s3(f"s3://{bucket}", "--allow-other") as mnt:
        assert "allow_other" in mount_options(mnt)


@pytest.fixture
def tree_with_escapes(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "inside.txt").write_text("fine")
    (tmp_path / "secret.txt").write_text("secret")
    (tmp_path / "secret-dir").mkdir()
    (tmp_path / "secret-dir" / "key").write_text("secret")
    (root / "out-file").symlink_to(tmp_path / "secret.txt")
    (root / "out-dir").symlink_to(tmp_path / "secret-dir")
    (root / "in-link").symlink_to(root / "sub" / "inside.txt")
    return root


@pytest.mark.parametrize("scheme", ["file", "arrow+file"])
def test_backend_cannot_escape_its_root(tree_with_escapes: Path, scheme: str) -> None:
    """arrow+file follows a symlink that stays inside; file:// follows none (its walk beneath
    the root refuses every symlink: backends/beneath.py)."""
    backend = open_backend(SourceConfig(url=f"{scheme}://{tree_with_escapes}"))
    escapes = ["out-file", "out-dir/key", "../secret.txt", "sub/../../secret.txt"]
    if scheme == "file":
        assert sorted(info.name for info in backend.list("")) == ["sub"]
        escapes.append("in-link")
    else:
        assert sorted(info.name for info in backend.list("")) == ["in-link", "sub"]
        assert backend.read_range("in-link", 0, 4, None) == b"fine"
    for path in escapes:
        with pytest.raises(PermissionDenied):
            backend.read_range(path, 0, 6, None)
        with pytest.raises(PermissionDenied):
            backend.stat(path)
    with pytest.raises(PermissionDenied):
        list(backend.list("out-dir"))


@pytest.mark.mount
@pytest.mark.parametrize("scheme", ["file", "arrow+file"])
def test_mount_cannot_escape_its_root(tree_with_escapes: Path, tmp_path: Path, scheme: str) -> None:
    with mounted(f"{scheme}://{tree_with_escapes}", tmp_path / "mnt", "--cache-dir", "none") as m:
        if scheme == "file":  # no symlink followed, none listed
            assert sorted(os.listdir(m)) == ["sub"]
        else:
            assert sorted(os.listdir(m)) == ["in-link", "sub"]
            assert (m / "in-link").read_text() == "fine"
        assert (m / "sub" / ".." / "sub" / "inside.txt").read_text() == "fine"
        for name in ("out-file", "out-dir"):
            with pytest.raises(OSError) as refused:
                os.stat(m / name)
            assert refused.value.errno in (errno.EACCES, errno.ENOENT)


@pytest.mark.mount
@pytest.mark.skipif(os.geteuid() != 0, reason="the race matters under a mount run by root")
def test_a_component_swapped_for_a_symlink_never_lets_a_write_out(tmp_path: Path) -> None:
    """A root-run file:// mount over a tree another user could write to: while a thread swaps
    `dir` for a symlink to a directory outside the root and back, in a loop, files written
    through the mount into `dir` never land outside (backends/beneath.py)."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "dir").mkdir(parents=True)
    outside.mkdir()
    stop = threading.Event()

    def swap() -> None:
        real, aside = root / "dir", root / "dir.aside"
        while not stop.is_set():
            os.rename(real, aside)
            os.symlink(outside, real)
            os.unlink(real)
            os.rename(aside, real)

    with mounted(f"file://{root}", tmp_path / "mnt", "--cache-dir", "none") as mnt:
        swapper = threading.Thread(target=swap)
        swapper.start()
        try:
            for i in range(300):
                # Refused where the store met a symlink on the way: never written outside.
                with contextlib.suppress(OSError):
                    (mnt / "dir" / f"f{i}").write_bytes(b"x" * 4096)
        finally:
            stop.set()
            swapper.join()
        assert os.listdir(outside) == []
        # Which writes landed inside depends on the swap's timing (and the mount may remember
        # `dir` as missing for a while); the mount still writes inside its root.
        (mnt / "after").write_bytes(b"y" * 4096)
        assert (root / "after").read_bytes() == b"y" * 4096
