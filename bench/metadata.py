"""Metadata at scale: the tree of tiny objects, `ls -lR` of it, and stat after a listing.

The tree (`tree/dNNN/oNNNNNN`, 1 byte each, in `TREE_DIRS` directories) is created once per
bench session and server with many parallel PUTs on kept-alive connections, unsigned where
the server takes that (moto and s3rver do), else presigned: creating 100,000 objects through
boto3 would take most of the session. `ls_recursive` lists it cold with `ls -lR` and the
mount's RSS growth per entry; `stat_after_listing` stats every file of a directory after an
`ls -l` of it, at once or after a wait.
"""

from __future__ import annotations

import http.client
import os
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable

from bench.data import Dataset, client
from bench.leftovers import in_threads
from bench.servers import Server
from bench.systems import rss_bytes

TREE_DIRS = 100
# One object directly in tree/: s3rver 3 leaves a prefix that holds only sub-prefixes out of a
# delimiter listing of its parent (its walk never descends below a common prefix), so without
# it tree/ would not show at the top of the bucket. `ls -lR` lists it as one more file.
TREE_MARKER = "tree/about"
# A peer that asks the store once per entry, in turn, takes a round trip per file (rclone at
# 20 ms: about 50 minutes for 100,000); past this limit the figure says so instead.
LS_RECURSIVE_LIMIT_S = 900.0
PUT_CLIENTS = 32  # the servers here answer a PUT in about a millisecond; keep them all busy


def tree_names(count: int, dirs: int = TREE_DIRS) -> list[str]:
    """`count` keys spread evenly over `dirs` directories of tree/, and `TREE_MARKER`."""
    return [f"tree/d{index % dirs:03d}/o{index:06d}" for index in range(count)] + [TREE_MARKER]


def put_tiny_objects(server: Server, bucket: str, keys: list[str], body: bytes = b"t") -> None:
    """PUT `body` at every key, `PUT_CLIENTS` at a time on kept-alive connections."""
    endpoint = urllib.parse.urlsplit(server.endpoint_url)
    host, port = endpoint.hostname or "127.0.0.1", endpoint.port or 80
    local = threading.local()

    def unsigned(key: str) -> str:
        return f"/{bucket}/{urllib.parse.quote(key)}"

    def presigned(key: str) -> str:
        url = s3.generate_presigned_url(
            "put_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=3600
        )
        parts = urllib.parse.urlsplit(url)
        return f"{parts.path}?{parts.query}"

    def put(target: Callable[[str], str], key: str) -> int:
        connection: http.client.HTTPConnection | None = getattr(local, "connection", None)
        if connection is None:
            connection = local.connection = http.client.HTTPConnection(host, port, timeout=60)
        connection.request("PUT", target(key), body=body)
        response = connection.getresponse()
        response.read()
        return response.status

    s3 = client(server)
    # A store that wants every request signed says so at the first PUT.
    target = unsigned if put(unsigned, keys[0]) == 200 else presigned
    if target is presigned and put(presigned, keys[0]) != 200:
        raise RuntimeError(f"{server.name}: PUT {keys[0]} failed even when signed")

    def put_one(key: str) -> None:
        status = put(target, key)
        if status != 200:
            raise RuntimeError(f"{server.name}: PUT {key}: HTTP {status}")

    in_threads(PUT_CLIENTS, put_one, keys[1:])


def create_tree(server: Server, dataset: Dataset) -> None:
    """Put the tree's objects in the store and check that a listing shows every one."""
    if not dataset.sizes.tree_files:
        return
    keys = tree_names(dataset.sizes.tree_files)
    put_tiny_objects(server, dataset.bucket, keys)
    pages = client(server).get_paginator("list_objects_v2")
    listed = sum(
        len(page.get("Contents", []))
        for page in pages.paginate(Bucket=dataset.bucket, Prefix="tree/")
    )
    if listed != len(keys):
        raise RuntimeError(f"{server.name}: {listed} objects under tree/, expected {len(keys)}")


def ls_recursive(
    directory: str, files: int, dirs: int, pid: int | None
) -> tuple[float, float | None]:
    """`ls -lR` of `directory`: seconds, and the mount's RSS growth per entry listed (bytes)."""
    before = rss_bytes(pid)
    started = time.perf_counter()
    try:
        result = subprocess.run(
            ["ls", "-lR", directory],
            capture_output=True,
            text=True,
            check=False,
            timeout=LS_RECURSIVE_LIMIT_S,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"ls -lR took over {LS_RECURSIVE_LIMIT_S:g} s") from None
    elapsed = time.perf_counter() - started
    after = rss_bytes(pid)
    if result.returncode != 0:
        problem = (result.stderr.strip().splitlines() or ["no message"])[0]
        raise RuntimeError(f"ls -lR failed ({result.returncode}): {problem}")
    listed = sum(1 for line in result.stdout.splitlines() if line.startswith("-"))
    if listed != files:
        raise RuntimeError(f"ls -lR listed {listed} files of {files}")
    if before is None or after is None:
        return elapsed, None
    return elapsed, (after - before) / (files + dirs)


def list_long(directory: str, expected: int) -> None:
    """`ls -l` of a directory, checked to list every entry."""
    result = subprocess.run(["ls", "-l", directory], capture_output=True, text=True, check=True)
    listed = len(result.stdout.splitlines()) - 1  # the "total" line
    if listed != expected:
        raise RuntimeError(f"ls listed {listed} of {expected}")


def stat_all(paths: list[str]) -> float:
    """`os.stat` of every path in turn; stats/s."""
    started = time.perf_counter()
    for path in paths:
        os.stat(path)
    return len(paths) / (time.perf_counter() - started)


def stat_after_listing(
    directory: str, paths: list[str], wait: float, forget: Callable[[], object] | None = None
) -> float:
    """`ls -l` of `directory`, `wait` seconds (then `forget`, when given), stat of each path."""
    list_long(directory, len(paths))
    if wait:
        time.sleep(wait)
    if forget is not None:
        forget()
    return stat_all(paths)
