"""Private directories and log files (pffs/privatefiles.py) never chmod or write through a
symlink another user planted; the user's own (or root's) symlink is followed, as an admin's
`/var/cache/pffs -> /nvme/pffs` is. (`pffs mount --log-file` at a planted link, as a process:
tests/commands/test_refusals.py.)"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from pffs.privatefiles import open_private_log, private_dir

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a link of another user needs lchown")
NOBODY = 65534


def _planted(link: Path, target: Path) -> None:
    link.symlink_to(target)
    os.lchown(link, NOBODY, NOBODY)


@needs_root
def test_another_users_link_is_neither_chmodded_nor_written(tmp_path: Path) -> None:
    victim_dir = tmp_path / "etc"
    victim_dir.mkdir(mode=0o755)
    victim_file = tmp_path / "passwd"
    victim_file.write_text("root:x:0:0\n")
    victim_file.chmod(0o644)
    _planted(tmp_path / "cache", victim_dir)
    _planted(tmp_path / "pffs.log", victim_file)
    with pytest.raises(OSError, match="another user"):
        private_dir(str(tmp_path / "cache"))
    with pytest.raises(OSError, match="another user"):
        open_private_log(str(tmp_path / "pffs.log"))
    assert stat.S_IMODE(victim_dir.stat().st_mode) == 0o755
    assert stat.S_IMODE(victim_file.stat().st_mode) == 0o644
    assert victim_file.read_text() == "root:x:0:0\n"


def test_own_links_are_followed_and_new_ones_made_private(tmp_path: Path) -> None:
    real = tmp_path / "nvme"
    real.mkdir(mode=0o755)
    (tmp_path / "cache").symlink_to(real)  # the admin's own
    private_dir(str(tmp_path / "cache"))
    assert stat.S_IMODE(real.stat().st_mode) == 0o700
    private_dir(str(tmp_path / "new" / "staging"))
    assert stat.S_IMODE((tmp_path / "new" / "staging").stat().st_mode) == 0o700
    log = tmp_path / "x.log"
    log.write_text("old\n")
    log.chmod(0o644)
    fd = open_private_log(str(log))
    os.write(fd, b"new\n")
    os.close(fd)
    assert log.read_text() == "old\nnew\n" and stat.S_IMODE(log.stat().st_mode) == 0o600
    (tmp_path / "dir.log").mkdir()
    with pytest.raises(OSError):
        open_private_log(str(tmp_path / "dir.log"))
