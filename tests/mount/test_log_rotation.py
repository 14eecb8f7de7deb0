"""A daemon's log file and logrotate (pffs/logfile.py): after the file is moved away, SIGHUP
makes the daemon open its path again, its log lines and its stdout and stderr (where a
traceback goes) with it, and the mount goes on serving: SIGHUP no longer unmounts a mount
that writes a log file. A real `pffs mount` of moto's S3 server."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.waiting import eventually

pytestmark = pytest.mark.mount


def _daemon_writing(log: Path) -> int:
    """The pid of the pffs daemon whose stderr is `log`."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            writes_it = os.readlink(f"/proc/{entry}/fd/2") == str(log)
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if writes_it and b"_daemon" in cmdline:
            return int(entry)
    raise AssertionError(f"no daemon writes {log}")


def _wait_for(path: Path, text: str, times: int = 1) -> str:
    """`path`'s text once it says `text` `times` times."""

    def said() -> str | None:
        content = path.read_text() if path.exists() else ""
        return content if content.count(text) >= times else None

    content = eventually(said, 10, f"{text!r} {times} times in {path}")
    assert content is not None
    return content


def test_sighup_reopens_the_log_file_logrotate_moved(s3, bucket: str, mount_s3, tmp_path) -> None:
    s3.put_object(Bucket=bucket, Key="a.txt", Body=b"hello")
    log = tmp_path / "mnt.log"
    with mount_s3(f"s3://{bucket}") as mnt:
        daemon = _daemon_writing(log)
        moved = tmp_path / "mnt.log.1"
        os.rename(log, moved)  # logrotate's move
        os.kill(daemon, signal.SIGHUP)
        _wait_for(log, "received SIGHUP: the log file is opened again")
        assert (mnt / "a.txt").read_bytes() == b"hello"  # still serving
        assert os.readlink(f"/proc/{daemon}/fd/2") == str(log)
        assert os.readlink(f"/proc/{daemon}/fd/1") == str(log)
        assert "received SIGHUP" not in moved.read_text()
        assert (log.stat().st_mode & 0o777) == 0o600
        os.kill(daemon, signal.SIGHUP)  # again, without a move: the same file, appended
        content = _wait_for(log, "opened again", times=2)
        assert content.count("opened again") == 2
        assert (mnt / "a.txt").read_bytes() == b"hello"
