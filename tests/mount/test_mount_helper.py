"""mount.pffs: mount(8)'s helper, so `mount -t fuse.pffs` and fstab lines mount pffs.

The real tests run mount(8) itself against a moto bucket, in a private mount namespace
(`unshare -m`), where /usr/sbin or /usr/local/bin get a bind-mounted copy with the helper added:
so mount(8) finds it exactly as on a machine where it is installed, and this machine's own
/sbin is never changed. They need root, unshare and /dev/fuse, and skip with the reason
otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pffs.cli import main as cli
from pffs.cli import mounthelper, options
from pffs.testing.servers import MotoServer
from tests.conftest import fuse_available

VENV_BIN = Path(sys.executable).parent


def _pffs_mount_args(argv: list[str]):
    """`argv` parsed by pffs's own parser (what `pffs mount` would run with)."""
    return options.build_parser().parse_args(argv)


def test_options_become_pffs_mount_options() -> None:
    options = mounthelper.split_options(
        "defaults,rw,_netdev,noauto,nofail,x-systemd.automount,x-systemd.idle-timeout=60,"
        "nodev,nosuid,dev,suid,endpoint_url=http://127.0.0.1:9000,region=eu-west-1,"
        'cache_size=10G,cache-memory=256M,allow_other,uid=1000,gid=1000,file_mode=640,ro,debug,comment="a,b"'
    )
    argv = mounthelper.translate("s3://bucket/data", "/mnt/data", options)
    args = _pffs_mount_args(argv)
    assert args.command == "mount" and args.debug
    assert (args.source, args.mountpoint) == ("s3://bucket/data", "/mnt/data")
    assert args.endpoint_url == "http://127.0.0.1:9000" and args.region == "eu-west-1"
    assert args.cache_size == 10 << 30 and args.cache_memory == 256 << 20
    assert args.allow_other and args.read_only
    assert (args.uid, args.gid, args.file_mode) == (1000, 1000, 0o640)
    assert not args.foreground  # mount(8) waits for the helper: the daemon must detach


def test_every_pffs_mount_option_can_be_given_with_o() -> None:
    """Each long option of `pffs mount` (but --help/--foreground/--config) has an -o name,
    and giving it changes what `pffs mount` is started with."""
    defaults = _pffs_mount_args(["mount", "s3://b", "/mnt"])
    # a size, a count, a mode, seconds or a ratio, a string, a log level, an on/off switch, an
    # address, a member list, a shared tier
    samples = ["8M", "3", "600", "0.5", "x", "warning", "off", ":9567", "dns://g.local:7070"]
    samples.append("s3://near/blocks")
    options = mounthelper.mount_options()
    assert {"endpoint_url", "cache_size", "read_only", "allow_other", "no_path_style"} <= set(
        options
    )
    for name, option in options.items():
        candidates = [f"{name}={v}" for v in samples] if option.takes_value else [name]
        changed = []
        for given in candidates:
            argv = mounthelper.translate("s3://b", "/mnt", [given])
            try:
                args = _pffs_mount_args(argv)
            except SystemExit:  # the sample does not fit this option's type
                continue
            changed.append(getattr(args, option.dest) != getattr(defaults, option.dest))
        assert any(changed), name


def test_mount_table_file_as_source_and_credentials_file(tmp_path: Path) -> None:
    table = tmp_path / "pffs.toml"
    argv = mounthelper.translate(
        str(table), "/mnt/t", ["credentials_file=/etc/pffs/credentials", "profile=data"]
    )
    assert argv[:4] == ["mount", "--config", str(table), "/mnt/t"]
    args = _pffs_mount_args(argv)
    # pffs reads the file's [data] section as values: no AWS_* variable, no botocore profile.
    assert args.profile == "data" and args.credentials_file == "/etc/pffs/credentials"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ("umask=022", "unknown option 'umask'"),
        ("noexec", "'noexec' is not supported"),
        ("endpoint_url", "needs a value"),
        ("allow_other=yes", "takes no value"),
        ("foreground", "unknown option 'foreground'"),
    ],
)
def test_bad_options_fail_with_one_line_and_exit_1(
    options: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert mounthelper.main(["s3://b", "/mnt", "-o", options]) == mounthelper.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("mount.pffs: ") and message in err and err.count("\n") == 1


def test_sloppy_drops_unknown_options_and_fake_only_prints(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = mounthelper.main(["s3://b", "/mnt", "-s", "-f", "-o", "umask=022,noexec,ro"])
    assert code == 0
    assert capsys.readouterr().out == "mount.pffs: pffs mount s3://b /mnt --read-only\n"


def test_other_types_and_bad_calls_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert mounthelper.main(["s3://b", "/mnt", "-t", "fuse.sshfs"]) == 1
    assert mounthelper.main(["s3://b"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert "-t fuse.sshfs" in err[0] and err[1].startswith("mount.pffs: ")


def test_pffs_hands_mount_fuse3_calls_to_the_helper(capsys: pytest.CaptureFixture[str]) -> None:
    """mount.fuse3 runs `pffs SOURCE MOUNTPOINT -o OPTIONS` for type fuse.pffs."""
    assert cli.main(["s3://b", "/mnt", "-o", "umask=1"]) == mounthelper.EXIT_USAGE
    assert "mount.pffs: unknown option 'umask'" in capsys.readouterr().err
    assert not mounthelper.is_helper_call(["mount", "s3://b", "/mnt"])


def test_failed_mount_exits_32(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no-such-dir"
    code = mounthelper.main(["file:///tmp", str(missing), "-o", "cache_dir=none"])
    assert code == mounthelper.EXIT_MOUNT_FAILED
    assert "pffs: " in capsys.readouterr().err


# --- real mounts through mount(8) -----------------------------------------------------------


def _namespace_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "mount(8) of a FUSE file system with helpers needs root here"
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return "unshare or mount (util-linux) is missing"
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        return f"unshare -m fails here: {probe.stderr.decode().strip()}"
    return fuse_available()


requires_mount8 = pytest.mark.skipif(
    _namespace_unavailable() is not None, reason=str(_namespace_unavailable())
)


def _overlay_dir(tmp_path: Path, real_dir: str, extra: dict[str, Path]) -> Path:
    """A copy of `real_dir` as symlinks, plus `extra` (name -> target): to bind over it."""
    overlay = tmp_path / f"overlay{real_dir.replace('/', '-')}"
    overlay.mkdir()
    for entry in os.listdir(real_dir):
        (overlay / entry).symlink_to(os.path.join(real_dir, entry))
    for name, target in extra.items():
        (overlay / name).unlink(missing_ok=True)
        (overlay / name).symlink_to(target)
    return overlay


def _in_private_namespace(script: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-euc", script],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


SCRIPT_TAIL = """
trap 'umount -l "$MNT" 2>/dev/null || true' EXIT
cat "$MNT/train/part-0.txt"
grep " $MNT " /proc/self/mountinfo
ls "$MNT/train" > /dev/null
umount "$MNT"
for i in $(seq 50); do grep -q " $MNT " /proc/self/mountinfo || exit 0; sleep 0.1; done
echo "still mounted" >&2; exit 1
"""


@pytest.fixture
def dataset(moto: MotoServer, s3, bucket: str) -> str:
    s3.put_object(Bucket=bucket, Key="ds/train/part-0.txt", Body=b"hello from the bucket\n")
    return f"s3://{bucket}/ds"


@requires_mount8
@pytest.mark.mount
def test_fstab_line_mounts_through_mount_fuse_pffs(
    dataset: str, moto: MotoServer, tmp_path: Path
) -> None:
    """An fstab line of type fuse.pffs, mounted with `mount MOUNTPOINT` (fstab from -T)."""
    helper = _overlay_dir(tmp_path, "/usr/sbin", {"mount.fuse.pffs": VENV_BIN / "mount.pffs"})
    mnt = tmp_path / "data"
    mnt.mkdir()
    options = (
        f"_netdev,noauto,nofail,x-systemd.automount,x-systemd.idle-timeout=600,ro,"
        f"endpoint_url={moto.endpoint_url},cache_dir={tmp_path / 'cache'},"
        f"log_file={tmp_path / 'mount.log'}"
    )
    fstab = tmp_path / "fstab"
    fstab.write_text(f"# test fstab\n{dataset} {mnt} fuse.pffs {options} 0 0\n")
    script = f"mount --bind {helper} /usr/sbin\nMNT={mnt}\nmount -T {fstab} {mnt}\n"
    # `ro` makes a --read-only mount: pffs refuses writes itself (the kernel's flag would refuse
    # a job's order list too), so the write is answered EROFS by pffs, not by the mount flags.
    script += 'touch "$MNT/train/new" 2>&1 | grep -o "Read-only file system"\n' + SCRIPT_TAIL
    result = _in_private_namespace(script)
    assert result.returncode == 0, result.stderr + _log(tmp_path / "mount.log")
    lines = result.stdout.splitlines()
    assert lines[0] == "Read-only file system"
    assert lines[1] == "hello from the bucket"
    mountinfo = lines[2].split()
    assert mountinfo[mountinfo.index("-") + 1] == "fuse.pffs"
    assert {"nosuid", "nodev"} <= set(mountinfo[5].split(","))  # per-mount options


@requires_mount8
@pytest.mark.mount
def test_mount_t_fuse_pffs_through_mount_fuse3(
    dataset: str, moto: MotoServer, tmp_path: Path
) -> None:
    """`mount -t fuse.pffs` with no mount.fuse.pffs installed: mount(8) falls back to fuse3's
    mount.fuse, which runs `pffs SOURCE MOUNTPOINT -o ...` found on the default PATH."""
    if os.path.exists("/usr/sbin/mount.fuse.pffs") or shutil.which("mount.fuse3") is None:
        pytest.skip("needs fuse3's mount.fuse3 and no mount.fuse.pffs installed on this machine")
    bin_dir = _overlay_dir(tmp_path, "/usr/local/bin", {"pffs": VENV_BIN / "pffs"})
    mnt = tmp_path / "data"
    mnt.mkdir()
    options = f"endpoint_url={moto.endpoint_url},cache_dir=none,log_file={tmp_path / 'mount.log'}"
    script = textwrap.dedent(
        f"""
        mount --bind {bin_dir} /usr/local/bin
        MNT={mnt}
        mount -t fuse.pffs {dataset} {mnt} -o {options}
        """
    )
    result = _in_private_namespace(script + SCRIPT_TAIL)
    assert result.returncode == 0, result.stderr + _log(tmp_path / "mount.log")
    lines = result.stdout.splitlines()
    assert lines[0] == "hello from the bucket"
    mountinfo = lines[1].split()
    assert mountinfo[mountinfo.index("-") + 1] == "fuse.pffs"
    assert "rw" in mountinfo[5].split(",")


def _log(path: Path) -> str:
    try:
        return "\n" + path.read_text()[-3000:]
    except OSError:
        return ""
