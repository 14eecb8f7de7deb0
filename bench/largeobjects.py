"""Large objects read whole: a checkpoint load and WebDataset-style shards.

A checkpoint load reads one large file front to back in 8 MiB reads (torch.load of a file, a
safetensors file copied to the GPU). Shards are many large files read whole, each in 1 MiB
reads, by a few readers taking the next file of a shuffled list (WebDataset's tar shards with
`shardshuffle`, one reader per DataLoader worker). Both report MB/s of the whole read, the page
cache dropped before by the caller, every byte checked against the digest of what was uploaded.
"""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time
from collections.abc import Sequence

MIB = 1 << 20
CHECKPOINT_READ = 8 * MIB
SHARD_READ = 1 * MIB
SHARD_READERS = 4


# The checkpoint's key, two levels down under a top directory of its own (as the shards' and the
# lazy checkpoint's): pffs's dataset preload takes three files opened within its trigger window
# in one directory, or in sibling directories, for a dataset and loads the rest of it (with the
# siblings' parent, one level down), so scenarios' objects side by side, or in sibling
# directories, would load each other ahead while one is timed, and count in its bytes fetched.
CHECKPOINT_KEY = "checkpoint/full/checkpoint.bin"


def shard_keys(count: int) -> list[str]:
    """The shards' keys: one directory, as a WebDataset's tar files are laid out."""
    return [f"shards/tar/shard-{i:04d}.tar" for i in range(count)]


def read_whole(path: str, chunk: int) -> tuple[int, str]:
    """Bytes read and their sha256, reading `path` in `chunk`-sized reads into one buffer."""
    digest = hashlib.sha256()
    buffer = bytearray(chunk)
    view = memoryview(buffer)
    total = 0
    with open(path, "rb", buffering=0) as f:
        while count := f.readinto(buffer):
            digest.update(view[:count])
            total += count
    return total, digest.hexdigest()


def checkpoint_load(path: str, size: int, sha256: str) -> float:
    """One large file read front to back in 8 MiB reads: MB/s."""
    started = time.perf_counter()
    total, digest = read_whole(path, CHECKPOINT_READ)
    elapsed = time.perf_counter() - started
    if total != size or digest != sha256:
        raise RuntimeError(f"{path}: {total} bytes read, or not the bytes uploaded")
    return total / elapsed / 1e6


def read_shards(paths: Sequence[str], sha256: dict[str, str], seed: int) -> float:
    """Every shard read whole by SHARD_READERS readers in a shuffled order: MB/s."""
    order = list(paths)
    random.Random(seed).shuffle(order)
    lock = threading.Lock()
    totals: list[int] = []
    errors: list[str] = []

    def reader() -> None:
        while True:
            with lock:
                if not order or errors:
                    return
                path = order.pop()
            try:
                total, digest = read_whole(path, SHARD_READ)
            except OSError as exc:
                errors.append(f"{path}: {exc}")
                return
            if digest != sha256[os.path.basename(path)]:
                errors.append(f"{path}: not the bytes uploaded")
                return
            with lock:
                totals.append(total)

    threads = [threading.Thread(target=reader) for _ in range(SHARD_READERS)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise RuntimeError(errors[0])
    return sum(totals) / elapsed / 1e6
