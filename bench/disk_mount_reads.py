"""Random 4 KiB reads through a real mount, served by the disk tier (a quick check, not the suite).

Puts a 64 MiB object in an in-process moto server, reads it once through `pffs mount` (the
disk tier fills), unmounts, drops the page cache (as root) and mounts again with a memory tier
of two blocks, then runs fio: 4 KiB random reads, psync, one job, for a few seconds. With
`--direct`, fio opens the file O_DIRECT so that every read reaches pffs (no kernel page cache).

    .venv/bin/python -m bench.disk_mount_reads --seconds 5
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import boto3

from pffs.testing.servers import DUMMY_CREDENTIALS, MotoServer

MIB = 1 << 20


def _pffs(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "pffs", *args], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        sys.exit(f"disk_mount_reads: pffs {args[0]} failed: {result.stderr.strip()}")
    return result.stdout


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _drop_page_cache() -> None:
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3")
    except OSError:
        print("disk_mount_reads: not root, the page cache was not dropped", file=sys.stderr)


def _fio(path: Path, seconds: float, direct: bool) -> tuple[float, int]:
    command = [
        *("fio", "--name=randread", f"--filename={path}", "--rw=randread", "--bs=4k"),
        *("--ioengine=psync", "--numjobs=1", f"--runtime={seconds}", "--time_based"),
        *("--readonly", f"--direct={int(direct)}", "--output-format=json"),
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    read = json.loads(result.stdout)["jobs"][0]["read"]
    return float(read["iops"]), int(read["total_ios"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    os.environ.update(DUMMY_CREDENTIALS)  # moto takes any; the mounts inherit them
    data = os.urandom(64 * MIB)
    with MotoServer() as server, tempfile.TemporaryDirectory(dir="/var/tmp") as root:
        s3 = boto3.client("s3", endpoint_url=server.endpoint_url)
        s3.create_bucket(Bucket="data")
        s3.put_object(Bucket="data", Key="big.bin", Body=data)
        mnt = Path(root) / "mnt"
        mnt.mkdir()
        options = (
            *("--endpoint-url", server.endpoint_url, "--cache-dir", f"{root}/cache"),
            *("--cache-memory", "8M", "--log-file", f"{root}/mount.log"),
        )
        _pffs("mount", "s3://data", str(mnt), *options)
        try:
            if (mnt / "big.bin").read_bytes() != data:
                sys.exit("disk_mount_reads: the first read gave wrong bytes")
        finally:
            _pffs("umount", str(mnt))
        for direct in (False, True):
            _drop_page_cache()
            pid = int(
                _pffs("mount", "s3://data", str(mnt), *options).split("(pid ")[1].split(",")[0]
            )
            try:
                cpu = _cpu_seconds(pid)
                iops, reads = _fio(mnt / "big.bin", args.seconds, direct)
                cpu = _cpu_seconds(pid) - cpu
            finally:
                _pffs("umount", str(mnt))
            mode = "O_DIRECT (every read reaches pffs)" if direct else "buffered"
            print(
                f"fio randread 4k psync, {mode}: {iops:,.0f} IOPS,"
                f" pffs CPU {cpu / reads * 1e6:.0f} us per read"
            )


if __name__ == "__main__":
    main()
