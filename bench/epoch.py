"""The training-epoch scenario: a dataset read whole, file by file, as a data loader reads it.

`read_epoch` reads every file of the training set in a seeded shuffled order with 8 threads
(a data loader's workers), each file whole, and returns files/s. `store_files_per_s` is what
the store itself gives for the same files over the same path (the delay proxy, when there is
one): many plain parallel GETs with keep-alive connections and nothing else, the figure an
epoch is compared with.
"""

from __future__ import annotations

import http.client
import os
import random
import threading
import time
import urllib.parse

from bench.data import Dataset, client
from bench.leftovers import in_threads
from bench.servers import Server

WORKERS = 8  # a typical DataLoader num_workers
STORE_CLIENTS = 64  # enough GETs in flight to hide a 20 ms round trip at ~3,000 files/s
_READ_CHUNK = 1 << 20


def shuffled(keys: list[str], seed: int) -> list[str]:
    order = list(keys)
    random.Random(seed).shuffle(order)
    return order


def read_epoch(mountpoint: str, keys: list[str], size: int, seed: int) -> float:
    """Read each file whole in a shuffled order (`seed`) with `WORKERS` threads; files/s."""
    order = [os.path.join(mountpoint, key) for key in shuffled(keys, seed)]

    def read_whole(path: str) -> None:
        got = 0
        with open(path, "rb", buffering=0) as f:
            while chunk := f.read(_READ_CHUNK):
                got += len(chunk)
        if got != size:
            raise RuntimeError(f"{path}: read {got} bytes of {size}")

    started = time.perf_counter()
    in_threads(WORKERS, read_whole, order)
    return len(order) / (time.perf_counter() - started)


def store_files_per_s(server: Server, dataset: Dataset, clients: int = STORE_CLIENTS) -> float:
    """GETs of every training file, `clients` at a time on keep-alive connections; files/s.

    Presigned URLs (signed before the clock starts) and http.client: the least client work
    per request, so the figure is the store's and the path's, not a client library's.
    """
    s3 = client(server)
    targets = [
        urllib.parse.urlsplit(
            s3.generate_presigned_url(
                "get_object", Params={"Bucket": dataset.bucket, "Key": key}, ExpiresIn=3600
            )
        )
        for key in shuffled(dataset.epoch_keys, seed=7)
    ]
    endpoint = urllib.parse.urlsplit(server.endpoint_url)
    host, port = endpoint.hostname or "127.0.0.1", endpoint.port or 80
    local = threading.local()
    opened: list[http.client.HTTPConnection] = []

    def get(target: urllib.parse.SplitResult) -> None:
        connection: http.client.HTTPConnection | None = getattr(local, "connection", None)
        if connection is None:
            connection = local.connection = http.client.HTTPConnection(host, port, timeout=60)
            opened.append(connection)
        connection.request("GET", f"{target.path}?{target.query}")
        response = connection.getresponse()
        body = response.read()
        if response.status != 200 or len(body) != dataset.sizes.epoch_size:
            raise RuntimeError(f"GET {target.path}: {response.status}, {len(body)} bytes")

    started = time.perf_counter()
    in_threads(clients, get, targets)
    elapsed = time.perf_counter() - started
    for connection in opened:
        connection.close()
    return len(targets) / elapsed
