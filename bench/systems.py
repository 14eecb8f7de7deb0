"""The systems under test, each mounted over the same bucket: pffs, s3fs-fuse and rclone.

Each mount gets fresh, empty cache directories, so every repetition starts cold. Peers are
installed from Debian when missing (as root); one that cannot be started is reported with the
reason, never dropped silently.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time

from bench.leftovers import track_mount
from bench.leftovers import unmount as unmount  # where the bench's scripts have imported it
from bench.servers import Server, Unavailable
from pffs.cli.options import build_parser, metadata_config
from pffs.mounting.kernel import find_mount

# libfuse's entry and attribute timeouts when a file system sets none (s3fs sets none).
LIBFUSE_DEFAULT_TTL = 1.0


def _apt_install(package: str) -> None:
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise Unavailable(f"{package} is not installed (and installing it needs root and apt-get)")
    subprocess.run(["apt-get", "install", "-y", "-qq", package], capture_output=True, check=False)


def _require(command: str, package: str) -> str:
    found = shutil.which(command)
    if found is None:
        _apt_install(package)
        found = shutil.which(command)
    if found is None:
        raise Unavailable(f"{command} could not be installed from Debian ({package})")
    return found


def _wait_mounted(mountpoint: str, proc: subprocess.Popen[bytes] | None, what: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        entry = find_mount(mountpoint)
        if entry is not None:
            try:
                os.listdir(mountpoint)
                return
            except OSError:
                pass
        if proc is not None and proc.poll() not in (None, 0):
            break
        time.sleep(0.1)
    raise Unavailable(f"{what} did not come up at {mountpoint}")


def mount_system(
    system: System, server: Server, bucket: str, mountpoint: str, cache_dir: str
) -> int | None:
    """Mount `system`, recorded first so that a stopped bench unmounts it; the pid of the
    process serving it, when known."""
    track_mount(mountpoint)
    return system.mount(server, bucket, mountpoint, cache_dir) or mount_pid(mountpoint)


def mount_pid(mountpoint: str) -> int | None:
    """The process serving a mount: the one whose command line names the mountpoint."""
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if os.fsencode(mountpoint) in argv and b"fusermount3" not in argv[0]:
            return int(name)
    return None


def status_kib(pid: int | None, field: str) -> int | None:
    """A figure of /proc/PID/status in KiB (`VmRSS`, `VmHWM`), or None."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def peak_rss_mib(pid: int | None) -> float | None:
    """The process's peak resident set (VmHWM), in MiB."""
    kib = status_kib(pid, "VmHWM")
    return None if kib is None else kib / 1024


def rss_bytes(pid: int | None) -> int | None:
    """The process's resident set now (VmRSS), in bytes."""
    kib = status_kib(pid, "VmRSS")
    return None if kib is None else kib * 1024


def reset_peak_rss(pid: int | None) -> bool:
    """Restart VmHWM from the current RSS (Linux's clear_refs "5"), to measure one phase."""
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def machine_cpu_seconds() -> tuple[float, float]:
    """CPU time every core of the machine has been busy so far, and of it the time a hypervisor
    took (steal), from /proc/stat's first line: over a wall interval, busy / wall is the cores
    kept busy, whichever processes used them."""
    with open("/proc/stat") as f:
        fields = [int(value) for value in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is inside user already)
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq + steal) / tick, steal / tick


def cpu_seconds(
    pid: int | None, thread: int | None = None, system_only: bool = False
) -> float | None:
    """CPU time a process has used so far (/proc/PID/stat, its threads included), or one of its
    threads (/proc/PID/task/TID/stat): user + system, or system only. None once it is gone."""
    if pid is None:
        return None
    path = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    try:
        with open(path) as f:
            # Fields after the command name (which may hold spaces): utime, stime are 14, 15.
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    user = 0 if system_only else int(fields[11])
    return (user + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class System:
    name = "?"

    def check(self) -> None:
        """Raise Unavailable when this system cannot run here."""

    def mount(self, server: Server, bucket: str, mountpoint: str, cache_dir: str) -> int | None:
        """Mount; return the serving process's pid when known."""
        raise NotImplementedError

    def kernel_ttl(self) -> float:
        """How long the kernel trusts this mount's entries and attributes, in seconds."""
        return LIBFUSE_DEFAULT_TTL


class Pffs(System):
    name = "pffs"

    def __init__(self, options: list[str]) -> None:
        self.options = options

    def _parsed(self) -> argparse.Namespace:
        # pffs's own parser reads the options, so the figures follow its defaults and flags.
        return build_parser().parse_args(["mount", "s3://bucket", "/mnt", *self.options])

    def kernel_ttl(self) -> float:
        meta = metadata_config(self._parsed())
        return max(meta.attr_ttl, meta.entry_ttl)

    def mount(self, server: Server, bucket: str, mountpoint: str, cache_dir: str) -> int | None:
        argv = [sys.executable, "-m", "pffs", "mount", f"s3://{bucket}", mountpoint]
        argv += ["--endpoint-url", server.endpoint_url, "--cache-dir", cache_dir]
        argv += ["--log-file", os.path.join(cache_dir, "..", "pffs.log"), *self.options]
        result = subprocess.run(argv, env=server.env(), capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise Unavailable(f"pffs mount failed: {result.stderr.strip()}")
        match = re.search(r"\(pid (\d+),", result.stdout)
        return int(match.group(1)) if match else None


class S3fs(System):
    name = "s3fs"

    def check(self) -> None:
        _require("s3fs", "s3fs")

    def mount(self, server: Server, bucket: str, mountpoint: str, cache_dir: str) -> int | None:
        passwd = os.path.join(cache_dir, "..", "s3fs-passwd")
        with open(os.open(passwd, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(f"{server.access_key}:{server.secret_key}\n")
        argv = [
            "s3fs", bucket, mountpoint,
            "-o", f"url={server.endpoint_url}", "-o", "use_path_request_style",
            "-o", f"passwd_file={passwd}", "-o", f"use_cache={cache_dir}",
        ]  # fmt: skip
        result = subprocess.run(argv, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise Unavailable(f"s3fs failed: {result.stderr.strip()}")
        _wait_mounted(mountpoint, None, "s3fs")
        return None


class Rclone(System):
    name = "rclone"

    def check(self) -> None:
        _require("rclone", "rclone")

    def mount(self, server: Server, bucket: str, mountpoint: str, cache_dir: str) -> int | None:
        env = server.env()
        # Debian's rclone refuses a custom CA bundle for plain-HTTP endpoints; none is needed.
        env.pop("AWS_CA_BUNDLE", None)
        env.update(
            RCLONE_S3_PROVIDER="Other",
            RCLONE_S3_ENDPOINT=server.endpoint_url,
            RCLONE_S3_ACCESS_KEY_ID=server.access_key,
            RCLONE_S3_SECRET_ACCESS_KEY=server.secret_key,
            RCLONE_CONFIG="/dev/null",
        )
        argv = [
            "rclone", "mount", f":s3:{bucket}", mountpoint, "--vfs-cache-mode", "full",
            "--cache-dir", cache_dir, "--daemon",
        ]  # fmt: skip
        result = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise Unavailable(f"rclone mount failed: {result.stderr.strip()[-300:]}")
        _wait_mounted(mountpoint, None, "rclone")
        return None

    def kernel_ttl(self) -> float:
        return 1.0  # rclone mount's --attr-timeout default (its own directory cache: 5 min)
