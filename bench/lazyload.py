"""A lazy checkpoint load: `safe_open` of a safetensors file and a few of its tensors.

vLLM, transformers and diffusers open a checkpoint with safetensors' `safe_open`, which
memory-maps the file and touches only the tensors asked for: a pipeline stage, a LoRA merge or
a sharded server reads a few layers of a large file, through page faults (the kernel's
read-around and readahead of a mapping), not through read(2). The file here holds
`lazy_tensors` float32 tensors of TENSOR_SIZE bytes each, random bytes (64, 512 MiB, in the
full run); the scenario opens it and takes PICKED of them in a seeded random order, every
tensor's bytes checked against the digest of what was uploaded. The figure is the seconds of
the whole, from `safe_open` to the last tensor (numpy and safetensors imported before the
clock starts). On pffs the bytes it fetched from the store are read from its own counters
(`.pffs/stats`), as a multiple of the tensors' bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import struct
import time
from collections.abc import Callable

MIB = 1 << 20
TENSOR_SIZE = 8 * MIB
PICKED = 6
# In a directory of its own, as bench.largeobjects.CHECKPOINT_KEY says why.
KEY = "lazy/model/checkpoint.safetensors"


def tensor_names(count: int) -> list[str]:
    return [f"layers.{i:02d}.weight" for i in range(count)]


def write_checkpoint(path: str, count: int) -> dict[str, str]:
    """A safetensors file of `count` float32 tensors of random bytes at `path`; the sha256 of
    each tensor's bytes by name."""
    return write_safetensors(path, tensor_names(count), TENSOR_SIZE, os.urandom)


def safetensors_header(names: list[str], size: int) -> bytes:
    """The JSON header of float32 tensors of `size` bytes each, named `names`, in that order."""
    header: dict[str, object] = {
        name: {"dtype": "F32", "shape": [size // 4], "data_offsets": [i * size, (i + 1) * size]}
        for i, name in enumerate(names)
    }
    return json.dumps(header, separators=(",", ":")).encode()


def write_safetensors(
    path: str, names: list[str], size: int, random_bytes: Callable[[int], bytes]
) -> dict[str, str]:
    """A safetensors file of float32 tensors of `size` bytes each, named `names`, their bytes
    from `random_bytes`; the sha256 of each by name. Written as the format says (an 8-byte
    little-endian header length, the JSON header, the data), one tensor in memory at a time."""
    encoded = safetensors_header(names, size)
    digests = {}
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)) + encoded)
        for name in names:
            data = random_bytes(size)
            digests[name] = hashlib.sha256(data).hexdigest()
            f.write(data)
    return digests


def picked(count: int, seed: int = 1) -> list[str]:
    """The tensors a lazy load takes, in its order."""
    return random.Random(seed).sample(tensor_names(count), min(PICKED, count))


def lazy_load(path: str, digests: dict[str, str], seed: int = 1) -> float:
    """`safe_open` and PICKED tensors: seconds, every tensor's bytes checked."""
    import numpy  # noqa: F401  (imported before the clock: safe_open imports it otherwise)
    from safetensors import safe_open

    names = picked(len(digests), seed)
    arrays = []
    started = time.perf_counter()
    with safe_open(path, framework="np") as checkpoint:
        for name in names:
            arrays.append(checkpoint.get_tensor(name))
    elapsed = time.perf_counter() - started
    for name, array in zip(names, arrays, strict=True):
        if hashlib.sha256(array.tobytes()).hexdigest() != digests[name]:
            raise RuntimeError(f"{path}: tensor {name} is not the bytes uploaded")
    return elapsed


def fetched_bytes(mountpoint: str) -> float | None:
    """Bytes of object data the mount received from its stores (pffs's counters), or None for
    a mount without them."""
    try:
        with open(os.path.join(mountpoint, ".pffs", "stats"), "rb") as f:
            metrics = json.load(f)["metrics"]
    except OSError:
        return None
    samples = metrics.get("pffs_backend_received_bytes_total", {}).get("samples", [])
    return sum(float(sample["value"]) for sample in samples)
