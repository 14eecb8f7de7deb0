"""The log file rotates (pffs/logfile.py): past its bound, x.log becomes x.log.1 and so on up to
the backups kept, each file 0600 and none much past the bound; `reopen` lets go of a file
logrotate moved away; a link planted at a rotated name is replaced, never written through;
a rotation that cannot be done is said once and loses no line. Real files in a temp dir."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from pffs.logfile import PrivateLogFile, reopen_log_files
from pffs.logs import LineFormatter

NOBODY = 65534


def _logger(handler: logging.Handler, name: str) -> logging.Logger:
    handler.setFormatter(LineFormatter())
    logger = logging.getLogger(f"test.logfile.{name}")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_rotates_past_its_bound_keeping_the_backups(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "mnt.log"
    handler = PrivateLogFile(str(path), max_bytes=4096, backups=3)
    logger = _logger(handler, "rotate")
    for n in range(400):  # about 80 bytes a line: 32 KiB, eight files' worth
        logger.info("line %04d %s", n, "x" * 30)
    handler.close()
    files = [path, *(Path(f"{path}.{n}") for n in (1, 2, 3))]
    assert sorted(p.name for p in path.parent.iterdir()) == sorted(p.name for p in files)
    for file in files:
        assert stat.S_IMODE(file.stat().st_mode) == 0o600
        assert 0 < file.stat().st_size <= 4096
    # Oldest to newest, without a gap: the newest lines survive, the oldest are dropped.
    kept = [line for file in reversed(files) for line in _lines(file)]
    numbers = [int(line.split("line ")[1].split()[0]) for line in kept]
    assert numbers == list(range(numbers[0], 400))
    assert numbers[0] > 0


def test_reopen_lets_go_of_the_file_logrotate_moved(tmp_path: Path) -> None:
    path = tmp_path / "mnt.log"
    handler = PrivateLogFile(str(path))
    logger = _logger(handler, "reopen")
    root = logging.getLogger()
    logger.info("before")
    os.rename(path, f"{path}.1")  # logrotate's move
    logger.info("still to the moved file")
    root.addHandler(handler)  # as a mount's handler is the root's
    try:
        assert reopen_log_files()
    finally:
        root.removeHandler(handler)
    logger.info("after")
    handler.close()
    assert [line.split(": ", 1)[1] for line in _lines(Path(f"{path}.1"))] == [
        "before",
        "still to the moved file",
    ]
    assert [line.split(": ", 1)[1] for line in _lines(path)] == ["after"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_nothing_to_reopen_without_a_log_file() -> None:
    assert not reopen_log_files(logging.getLogger("test.logfile.none"))


@pytest.mark.skipif(os.geteuid() != 0, reason="a link of another user needs lchown")
def test_a_link_planted_at_a_rotated_name_is_replaced_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "passwd"
    victim.write_text("root:x:0:0\n")
    path = tmp_path / "mnt.log"
    for name in (f"{path}.1", f"{path}.2"):
        os.symlink(victim, name)
        os.lchown(name, NOBODY, NOBODY)
    handler = PrivateLogFile(str(path), max_bytes=1024, backups=2)
    logger = _logger(handler, "planted")
    for n in range(60):
        logger.info("line %d %s", n, "y" * 40)
    handler.close()
    assert victim.read_text() == "root:x:0:0\n"
    for name in (f"{path}.1", f"{path}.2"):
        assert not os.path.islink(name) and os.path.getsize(name) <= 1024


def test_a_rotation_that_cannot_be_done_is_said_once_and_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "mnt.log"
    handler = PrivateLogFile(str(path), max_bytes=1024, backups=1)
    logger = _logger(handler, "stuck")
    os.mkdir(f"{path}.1")  # rename(2) of a file over a directory fails
    (tmp_path / "mnt.log.1" / "x").write_text("not empty")
    for n in range(60):
        logger.info("line %d", n)
    handler.close()
    lines = _lines(path)
    assert sum("cannot be rotated" in line for line in lines) == 1
    assert [line for line in lines if "line " in line][-1].endswith("line 59")
    assert len([line for line in lines if ": line " in line]) == 60
