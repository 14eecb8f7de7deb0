"""file:// paths opened beneath the root without a race (backends/beneath.py), with openat2 and
with the walk by hand that stands in for it on older kernels: no symlink followed, on the way
or last; no `..`; and a directory swapped for a symlink to outside while the local backend
writes, lists, renames and deletes (a thread swapping it in a loop) never lets anything land
outside the root."""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pffs.backends import beneath
from pffs.backends.local import LocalBackend
from pffs.config import SourceConfig
from pffs.errors import PffsError


@pytest.fixture(params=["openat2", "walk"])
def how(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "walk":
        monkeypatch.setattr(beneath, "have_openat2", False)
    else:
        fd = os.open("/", os.O_PATH)
        try:
            os.close(beneath.open_beneath(fd, "tmp", os.O_PATH))
        finally:
            os.close(fd)
        if not beneath.have_openat2:
            pytest.skip("this kernel has no openat2")
    yield request.param


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "dir").mkdir(parents=True)
    (root / "dir" / "file").write_text("inside")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "file").write_text("outside")
    (root / "link-dir").symlink_to(tmp_path / "outside")
    (root / "link-file").symlink_to(root / "dir" / "file")  # inside, still not followed
    return root


def _open(root: Path, path: str, flags: int) -> int:
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    try:
        return beneath.open_beneath(fd, path, flags)
    finally:
        os.close(fd)


@pytest.mark.parametrize("flags", [os.O_RDONLY, os.O_PATH])
def test_no_symlink_and_no_dotdot_is_followed(tree: Path, how: str, flags: int) -> None:
    fd = _open(tree, "dir/file", flags)
    os.close(fd)
    for path, code in [
        ("link-dir/file", errno.ELOOP),
        ("link-file", errno.ELOOP),
        ("dir/../../outside/file", errno.EXDEV),
        ("/etc/passwd", errno.EXDEV),
    ]:
        with pytest.raises(OSError) as refused:
            _open(tree, path, flags)
        assert refused.value.errno == code, path


def test_a_swapped_directory_never_lets_a_write_out(tmp_path: Path, tree: Path, how: str) -> None:
    """`dir` is swapped for a symlink to `outside2` and back in a loop while the backend
    writes, makes directories, renames and deletes under it: `outside2` stays empty."""
    outside = tmp_path / "outside2"
    outside.mkdir()
    backend = LocalBackend(SourceConfig(url=f"file://{tree}"))
    staged = tmp_path / "staged"
    staged.write_bytes(b"x" * 1000)
    stop = threading.Event()

    def swap() -> None:
        real, link = tree / "dir", tree / "dir.real"
        while not stop.is_set():
            os.rename(real, link)
            os.symlink(outside, real)
            os.unlink(real)
            os.rename(link, real)

    swapper = threading.Thread(target=swap)
    swapper.start()
    try:
        for i in range(2000):
            with contextlib.suppress(PffsError):
                backend.put(f"dir/f{i}", str(staged))
            with contextlib.suppress(PffsError):
                backend.make_dir(f"dir/d{i}")
            with contextlib.suppress(PffsError):
                backend.rename(f"dir/f{i}", f"dir/g{i}")
            with contextlib.suppress(PffsError):
                list(backend.list("dir"))
    finally:
        stop.set()
        swapper.join()
    assert os.listdir(outside) == []
    # Which writes landed inside depends on the swap's timing; once it stops, one does.
    backend.put("dir/after", str(staged))
    assert (tree / "dir" / "after").read_bytes() == staged.read_bytes()
