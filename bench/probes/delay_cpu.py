"""The delay proxy's own CPU per GiB forwarded (pffs.testing.delay), with no store or mount.

One upstream (a thread of this process) answers each connection with `--size` bytes of a file
sent with sendfile (the page cache's pages: no copy of its own), the proxy runs as the bench
runs it (`python -m pffs.testing.delay`, a process of its own) at `--rtt-ms`, and a reader
pulls the bytes through it with 1 MiB `recv_into`s. Per stream: MB/s and the proxy's CPU per
GiB from /proc (user and system).

    python -m bench.probes.delay_cpu --size 1G --rtt-ms 20 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

from bench.systems import cpu_seconds
from pffs.sizes import parse_size


def _serve(listener: socket.socket, path: str, size: int) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:  # the listener closed: the probe is over
            return
        with client, open(path, "rb") as f:
            client.recv(16)  # the reader's one request
            sent = 0
            while sent < size:
                sent += os.sendfile(client.fileno(), f.fileno(), sent, size - sent)


def _stream(port: int, size: int) -> float:
    """Read `size` bytes through the proxy; the seconds it took."""
    buffer = bytearray(1 << 20)
    with socket.create_connection(("127.0.0.1", port)) as reader:
        started = time.perf_counter()
        reader.sendall(b"go")
        got = 0
        while got < size:
            count = reader.recv_into(buffer)
            if not count:
                sys.exit(f"delay_cpu: the stream ended after {got} of {size} bytes")
            got += count
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1G", help="bytes per stream (1G)")
    parser.add_argument("--rtt-ms", type=float, default=20.0, help="the proxy's round trip (20)")
    parser.add_argument("--rounds", type=int, default=3, help="streams, one after another")
    args = parser.parse_args()
    size = parse_size(args.size)
    with tempfile.NamedTemporaryFile(dir="/var/tmp", prefix="delay-cpu-") as data:
        data.write(os.urandom(size))
        data.flush()
        listener = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=_serve, args=(listener, data.name, size), daemon=True).start()
        upstream = f"127.0.0.1:{listener.getsockname()[1]}"
        argv = [sys.executable, "-m", "pffs.testing.delay", "--upstream", upstream]
        proxy = subprocess.Popen(
            [*argv, "--rtt-ms", str(args.rtt_ms)], stdout=subprocess.PIPE, text=True
        )
        try:
            assert proxy.stdout is not None
            port = int(proxy.stdout.readline())
            gib = size / (1 << 30)
            for round_ in range(args.rounds):
                before = cpu_seconds(proxy.pid) or 0.0
                seconds = _stream(port, size)
                cpu = (cpu_seconds(proxy.pid) or 0.0) - before
                print(
                    f"round {round_ + 1}: {size / seconds / 1e6:6.0f} MB/s,"
                    f" proxy {cpu / gib:4.2f} CPU-s/GiB",
                    flush=True,
                )
        finally:
            proxy.terminate()
            proxy.wait()
            listener.close()


if __name__ == "__main__":
    main()
