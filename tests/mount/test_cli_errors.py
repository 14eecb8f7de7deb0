"""Bad input: each is one line on stderr, a non-zero exit, within seconds, and no mount left."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

import pffs
from pffs.config import FuseConfig, SourceConfig, single_source
from pffs.errors import PffsError
from pffs.mounting.kernel import find_mount
from pffs.testing.servers import MotoServer
from tests.conftest import run_pffs

pytestmark = pytest.mark.mount


def assert_one_line_error(args: tuple[str, ...], code: int, fragment: str, **kwargs) -> None:
    started = time.monotonic()
    result = run_pffs(*args, timeout=30, **kwargs)
    elapsed = time.monotonic() - started
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code, (result.returncode, result.stderr)
    assert len(lines) == 1 and lines[0].startswith("pffs: "), result.stderr
    assert fragment in lines[0], lines[0]
    assert "Traceback" not in result.stderr
    assert elapsed < 15, f"took {elapsed:.1f}s"


@pytest.fixture
def empty_dir(tmp_path: Path) -> Path:
    path = tmp_path / "mnt"
    path.mkdir()
    return path


def test_unknown_scheme(empty_dir: Path) -> None:
    assert_one_line_error(("mount", "gopher://x", str(empty_dir)), 2, "unknown scheme gopher://")


def test_malformed_url(empty_dir: Path) -> None:
    assert_one_line_error(("mount", "s3://Bad_Bucket!", str(empty_dir)), 2, "malformed URL")
    assert_one_line_error(("mount", "no-scheme-at-all", str(empty_dir)), 2, "has no scheme")


def test_bad_option(empty_dir: Path) -> None:
    assert_one_line_error(("mount", "s3://b", str(empty_dir), "--file-mode", "9z"), 2, "octal")


def test_missing_bucket(moto: MotoServer, empty_dir: Path) -> None:
    args = ("mount", "s3://no-such-bucket", str(empty_dir), "--endpoint-url", moto.endpoint_url)
    assert_one_line_error(args, 3, "bucket 'no-such-bucket' at http://127.0.0.1")
    assert find_mount(str(empty_dir)) is None


def test_wrong_credentials(empty_dir: Path) -> None:
    # A second moto server that checks credentials (moto accepts any unless told otherwise).
    with MotoServer(env={"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as strict:
        args = ("mount", "s3://some-bucket", str(empty_dir), "--endpoint-url", strict.endpoint_url)
        assert_one_line_error(args, 4, "denied")


def test_unreachable_endpoint(empty_dir: Path) -> None:
    args = ("mount", "s3://bucket", str(empty_dir), "--endpoint-url", "http://127.0.0.1:9")
    assert_one_line_error(args, 5, "cannot reach")


def test_missing_mountpoint(bucket: str, moto: MotoServer, tmp_path: Path) -> None:
    args = ("mount", f"s3://{bucket}", str(tmp_path / "nope"), "--endpoint-url", moto.endpoint_url)
    assert_one_line_error(args, 6, "does not exist")


def test_mountpoint_not_a_directory(bucket: str, moto: MotoServer, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    args = ("mount", f"s3://{bucket}", str(tmp_path / "file"), "--endpoint-url", moto.endpoint_url)
    assert_one_line_error(args, 6, "not a directory")


def test_non_empty_mountpoint(bucket: str, moto: MotoServer, empty_dir: Path) -> None:
    (empty_dir / "something").write_text("x")
    args = ("mount", f"s3://{bucket}", str(empty_dir), "--endpoint-url", moto.endpoint_url)
    assert_one_line_error(args, 6, "not empty")


def test_umount_of_something_not_mounted(empty_dir: Path) -> None:
    assert_one_line_error(("umount", str(empty_dir)), 6, "is not mounted")


# --- gaps filled for issue #10 (reliability) -------------------------------------------------


def test_conflicting_and_invalid_options(tmp_path: Path, empty_dir: Path) -> None:
    config = tmp_path / "t.toml"
    config.write_text('[[mount]]\npath = "/a"\nsource = "file:///tmp"\n')
    assert_one_line_error(
        ("mount", "s3://bucket", str(empty_dir), "--config", str(config)), 2, "not both"
    )
    assert_one_line_error(("mount", "s3://bucket", str(empty_dir), "--retries", "many"), 2, "many")
    args = ("mount", "s3://bucket", str(empty_dir), "--request-timeout", "30")
    assert_one_line_error((*args, "--retry-timeout", "5"), 2, "--retry-timeout")
    assert_one_line_error(
        ("mount", "s3://bucket", str(empty_dir), "--request-timeout", "0"), 2, "0"
    )
    assert_one_line_error(("mount", str(empty_dir)), 2, "nothing to mount")


def test_malformed_config_file(tmp_path: Path, empty_dir: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("[[mount]\npath = ")
    assert_one_line_error(("mount", str(empty_dir), "--config", str(broken)), 2, str(broken))
    unknown = tmp_path / "unknown.toml"
    unknown.write_text('[[mount]]\npath = "/a"\nsource = "file:///tmp"\ncolour = "blue"\n')
    assert_one_line_error(("mount", str(empty_dir), "--config", str(unknown)), 2, "colour")


def test_unwritable_cache_dir(
    bucket: str, moto: MotoServer, tmp_path: Path, empty_dir: Path
) -> None:
    (tmp_path / "a-file").write_text("x")
    args = ("mount", f"s3://{bucket}", str(empty_dir), "--endpoint-url", moto.endpoint_url)
    cache = tmp_path / "a-file" / "cache"  # under a regular file: unusable even for root
    assert_one_line_error((*args, "--cache-dir", str(cache)), 8, "cache directory")
    assert find_mount(str(empty_dir)) is None


def test_busy_mountpoint(bucket: str, moto: MotoServer, empty_dir: Path) -> None:
    args = ("mount", f"s3://{bucket}", str(empty_dir), "--endpoint-url", moto.endpoint_url)
    assert run_pffs(*args).returncode == 0
    try:
        assert_one_line_error(args, 6, "already a pffs mount")
    finally:
        assert run_pffs("umount", str(empty_dir)).returncode == 0


def test_exit_codes_are_distinct_per_kind_of_problem() -> None:
    from pffs import errors

    codes = {
        cls.exit_code
        for cls in (
            errors.UsageError,
            errors.NotFound,
            errors.PermissionDenied,
            errors.Transient,
            errors.MountpointError,
            errors.MountFailed,
            errors.CacheDirError,
        )
    }
    assert len(codes) == 7 and 0 not in codes


def test_debug_shows_the_traceback(empty_dir: Path) -> None:
    result = run_pffs("--debug", "mount", "gopher://x", str(empty_dir), timeout=30)
    assert result.returncode == 2
    assert "Traceback" in result.stderr and "unknown scheme" in result.stderr


def test_version() -> None:
    result = run_pffs("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"pffs {pffs.__version__}"


def test_demo_without_moto_says_what_to_install() -> None:
    """Without moto (the image before it had the demo extra): one line, exit 2."""
    blocked = "import sys; sys.modules['moto'] = sys.modules['moto.server'] = None; "
    run = "from pffs.cli.main import main; raise SystemExit(main(['demo']))"
    result = subprocess.run(
        [sys.executable, "-c", blocked + run], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        "pffs: pffs demo runs moto's S3 server, which is not installed: pip install 'pffs[demo]'"
    )


def test_mount_called_twice_in_one_process(tmp_path: Path) -> None:
    """pffs.mount is the function on every call (a submodule once shadowed it after the first)."""
    (tmp_path / "mnt").mkdir()
    fuse = FuseConfig(mountpoint=str(tmp_path / "mnt"))
    config = single_source(SourceConfig(url=f"file://{tmp_path}/missing"), fuse)
    for _ in range(2):
        with pytest.raises(PffsError, match="missing"):
            pffs.mount(config, foreground=True)
