"""The preload socket `.pffs/preload.sock` on real mounts: every way of unmounting works while
it is bound (`pffs umount`, umount(8) as Fluid's preStop runs it, SIGTERM of the daemon, the
CSI driver's fusermount3 with a read-only bind beside it), and the daemon exits after each; a
mount still bound elsewhere keeps serving; no other special file can be made; a killed daemon's
mount is remounted with a new socket. Mounts of a `file://` tree, as root (open_tree and bind
mounts need CAP_SYS_ADMIN)."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pffs.jobs import preload_order
from pffs.mounting.kernel import wait_unmounted
from tests.conftest import run_pffs, unmount_quietly
from tests.mount.test_crash_and_disk import kill_daemon
from tests.waiting import eventually

pytestmark = [
    pytest.mark.mount,
    pytest.mark.skipif(os.geteuid() != 0, reason="open_tree and bind mounts need root"),
]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    (root / "train").mkdir(parents=True)
    for i in range(4):
        (root / "train" / f"{i}.bin").write_bytes(bytes([i]) * 4096)
    return root


@pytest.fixture
def mount(tmp_path: Path, tree: Path) -> Iterator[Callable[..., tuple[Path, int]]]:
    """`pffs mount` of the tree (the daemon way): (mountpoint, daemon pid). Whatever a test
    leaves is taken down at the end."""
    made: list[tuple[Path, int]] = []

    def _mount(name: str = "mnt", *options: str) -> tuple[Path, int]:
        mnt = tmp_path / name
        with contextlib.suppress(FileExistsError):  # also a dead mount, which stat() refuses
            mnt.mkdir()
        log = tmp_path / f"{name}.log"
        result = run_pffs(
            "mount", f"file://{tree}", str(mnt), "--cache-dir", "none", "--log-file", str(log),
            *options,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr + log.read_text()
        match = re.search(r"\(pid (\d+),", result.stdout)
        assert match, result.stdout
        made.append((mnt, int(match.group(1))))
        assert stat.S_ISSOCK(os.stat(mnt / ".pffs" / "preload.sock").st_mode)
        return made[-1]

    yield _mount
    for mnt, pid in made:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
        unmount_quietly(mnt)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def _exited(pid: int, timeout: float = 15.0) -> bool:
    try:
        eventually(lambda: not _alive(pid), timeout, f"pid {pid} gone")
    except AssertionError:
        return False
    return True


def _bind_read_only(mnt: Path, at: Path) -> None:
    at.mkdir()
    subprocess.run(["mount", "--bind", "-o", "ro", str(mnt), str(at)], check=True)


UNMOUNTS: dict[str, Callable[[Path, int], None]] = {
    "pffs umount": lambda mnt, pid: _ok(run_pffs("umount", str(mnt))),
    # Fluid's default preStop, and what a user types.
    "umount": lambda mnt, pid: _ok(subprocess.run(["umount", str(mnt)], capture_output=True)),
    "SIGTERM": lambda mnt, pid: os.kill(pid, signal.SIGTERM),
}


def _ok(result: subprocess.CompletedProcess) -> None:  # type: ignore[type-arg]
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("how", list(UNMOUNTS))
def test_each_unmount_works_with_the_socket_bound(mount, tmp_path: Path, how: str) -> None:
    mnt, pid = mount()
    assert preload_order(str(mnt), ["train/0.bin", "train/9.bin"]) == ["train/9.bin: no such file"]
    UNMOUNTS[how](mnt, pid)
    assert wait_unmounted(str(mnt), timeout=10)
    assert _exited(pid), f"the daemon outlived {how}"
    assert not os.listdir(mnt)


def test_a_csi_style_unmount_with_a_read_only_bind(mount, tmp_path: Path) -> None:
    """As csi/volumes.py does it: a read-only bind at the pod's target takes the list; at
    unpublish the bind goes, then fusermount3 -u (not lazy) of the mount."""
    staging, pid = mount("staging", "--read-only")
    target = tmp_path / "target"
    _bind_read_only(staging, target)
    assert preload_order(str(target), ["train/1.bin", "x"]) == ["x: no such file"]
    subprocess.run(["umount", str(target)], check=True)
    _ok(subprocess.run(["fusermount3", "-u", str(staging)], capture_output=True))
    assert wait_unmounted(str(staging), timeout=10)
    assert _exited(pid)


def test_a_bind_left_keeps_the_mount_and_its_socket(mount, tmp_path: Path) -> None:
    """The mount unmounted where it was made, a bind of it elsewhere: the bind still serves,
    lists included; the daemon ends with the bind."""
    mnt, pid = mount()
    bind = tmp_path / "bind"
    _bind_read_only(mnt, bind)
    _ok(run_pffs("umount", str(mnt)))
    time.sleep(0.5)  # the daemon has seen the mount table change
    assert _alive(pid)
    assert preload_order(str(bind), ["train/2.bin"]) == []
    assert (bind / "train" / "2.bin").read_bytes() == bytes([2]) * 4096
    subprocess.run(["umount", str(bind)], check=True)
    assert _exited(pid)


def test_no_other_special_file_can_be_made(mount) -> None:
    mnt, _ = mount()
    refused = {
        "a fifo in the tree": lambda: os.mkfifo(mnt / "fifo"),
        "a socket in the tree": lambda: _bind(mnt / "x.sock"),
        "a socket in .pffs": lambda: _bind(mnt / ".pffs" / "other.sock"),
        "a fifo at the socket's name": lambda: os.mkfifo(mnt / ".pffs" / "preload.sock"),
        "a second socket at its name": lambda: _bind(mnt / ".pffs" / "preload.sock"),
        "the socket removed": lambda: os.unlink(mnt / ".pffs" / "preload.sock"),
    }
    errnos = {}
    for what, make in refused.items():
        with pytest.raises(OSError) as failed:
            make()
        errnos[what] = failed.value.errno
    assert errnos == {
        "a fifo in the tree": errno.EOPNOTSUPP,
        "a socket in the tree": errno.EOPNOTSUPP,
        "a socket in .pffs": errno.EROFS,
        "a fifo at the socket's name": errno.EEXIST,
        "a second socket at its name": errno.EADDRINUSE,
        "the socket removed": errno.EROFS,
    }
    assert sorted(os.listdir(mnt / ".pffs")) == ["preload", "preload.sock", "stats"]
    assert preload_order(str(mnt), ["train/3.bin"]) == []


def _bind(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))


def test_a_killed_daemons_mount_is_remounted_with_a_new_socket(mount) -> None:
    # The root's attributes lapse in a second: the kernel answers stat() from them after the
    # daemon is gone, and the next mount asks stat() whether the mount is dead.
    mnt, pid = mount("mnt", "--attr-ttl", "1")
    kill_daemon(pid, mnt)
    mnt, pid = mount()  # clears the dead mount
    assert preload_order(str(mnt), ["train/0.bin", "train/none"]) == ["train/none: no such file"]
    _ok(run_pffs("umount", str(mnt)))
    assert _exited(pid)
