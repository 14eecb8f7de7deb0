"""`python -m bench.proxy_cost`: what the delay proxy itself costs, in throughput and CPU.

One stream of `--size` bytes from a socket server (a thread of this process, 4 MiB sends) to a
reader (1 MiB `recv_into`), first directly, then through a delay proxy running as its own
process (`python -m pffs.testing.delay`, as the bench runs it) at each `--rtt-ms`. For the
proxy it reports MB/s and its CPU-seconds per GiB (utime + stime from /proc/PID/stat, and the
user part alone: the Python work). Short by design: 2 GiB takes a few seconds per row.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time

from bench.systems import cpu_seconds
from pffs.sizes import parse_size

GIB = 1 << 30
_SEND = 4 << 20


def serve_streams(listener: socket.socket, size: int) -> None:
    """Send `size` bytes on every accepted connection, then close it (a daemon thread)."""
    payload = memoryview(b"\0" * _SEND)
    while True:
        try:
            connection, _ = listener.accept()
        except OSError:
            return
        with connection:
            left = size
            while left:
                left -= connection.send(payload[: min(left, _SEND)])


def read_stream(port: int, size: int) -> float:
    """Read one whole stream from 127.0.0.1:`port`; MB/s."""
    buffer = bytearray(1 << 20)
    got = 0
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        while n := sock.recv_into(buffer):
            got += n
    if got != size:
        raise RuntimeError(f"read {got} bytes of {size}")
    return size / (time.perf_counter() - started) / 1e6


def user_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[11]) / os.sysconf("SC_CLK_TCK")


def through_proxy(upstream_port: int, size: int, rtt_ms: float) -> tuple[float, float, float]:
    """MB/s through a proxy process, and its CPU-seconds and user-seconds per GiB."""
    argv = [sys.executable, "-m", "pffs.testing.delay", "--rtt-ms", str(rtt_ms)]
    proc = subprocess.Popen(
        [*argv, "--upstream", f"127.0.0.1:{upstream_port}"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        cpu_before, user_before = cpu_seconds(proc.pid), user_seconds(proc.pid)
        mbs = read_stream(port, size)
        cpu_after, user_after = cpu_seconds(proc.pid), user_seconds(proc.pid)
    finally:
        proc.terminate()
        proc.wait()
    assert cpu_before is not None and cpu_after is not None
    gib = size / GIB
    return mbs, (cpu_after - cpu_before) / gib, (user_after - user_before) / gib


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.proxy_cost", description=__doc__)
    parser.add_argument("--size", default="2G", help="bytes per stream (2G)")
    parser.add_argument("--rtt-ms", default="0,20", help="proxy round trips to try (0,20)")
    args = parser.parse_args(argv)
    size = parse_size(args.size)
    try:
        rtts = [float(part) for part in args.rtt_ms.split(",")]
    except ValueError:
        parser.error(f"--rtt-ms: expected numbers like 0,20, got {args.rtt_ms!r}")
    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=serve_streams, args=(listener, size), daemon=True).start()
    port = listener.getsockname()[1]
    print("| path | MB/s | proxy CPU-s per GiB | of which user |")
    print("|---|---|---|---|")
    print(f"| direct | {read_stream(port, size):,.0f} | - | - |")
    for rtt in rtts:
        mbs, cpu, user = through_proxy(port, size, rtt)
        print(f"| proxy, {rtt:g} ms | {mbs:,.0f} | {cpu:.2f} | {user:.2f} |")
    listener.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
