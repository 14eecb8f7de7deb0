"""A lazy checkpoint load through a real mount: safetensors' `safe_open` memory-maps the file and
copies a few tensors out of it (page faults, the kernel's read-around and readahead), and pffs
fetches little more than those tensors from the store (#39)."""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import boto3
import pytest

from pffs.testing.faults import FaultProxy
from pffs.testing.servers import MotoServer
from tests.conftest import mounted

np = pytest.importorskip("numpy")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

pytestmark = [pytest.mark.mount]
MIB = 1 << 20
TENSORS = 12
TENSOR_BYTES = 8 * MIB  # a layer of a large model; four blocks of pffs's default size
PICKED = 3
# Bytes fetched at most, as a multiple of the tensors read, by the mount's kernel readahead.
# At the default 4 MiB the kernel alone asks for about twice a tensor (read-around and
# readahead at its ends), at 2 MiB about 1.5 times. pffs adds the blocks of the header's read
# from offset 0, a whole-file reader's start (8 MiB, here for three tensors; its streams ask
# nothing past a region's last READ, pffs.fs.regions): 2.625x and 1.875x in 9 runs of 10
# before that reach was cut, 2.125x at 2 MiB in one (not traced: a tensor faulted before the
# disk tier's key filter is first read, on a fresh mount under load, goes through blocks, not
# spans, the likely cause).
MOST_FETCHED = {"4M": 3.0, "2M": 2.25}


# In a process of its own: safetensors holds the GIL while it faults the mapping in, and the
# counting proxy's threads live in this one.
LOAD = """
import hashlib, json, sys
from safetensors import safe_open
with safe_open(sys.argv[1], framework="np") as checkpoint:
    out = {"keys": sorted(checkpoint.keys())}
    for name in sys.argv[2:]:
        out[name] = hashlib.sha256(checkpoint.get_tensor(name).tobytes()).hexdigest()
print(json.dumps(out))
"""


def lazy_load(path: Path, names: list[str]) -> dict[str, Any]:
    """`safe_open` of `path` and the tensors `names`: the file's tensor names ("keys") and the
    sha256 of each tensor read."""
    result = subprocess.run(
        [sys.executable, "-c", LOAD, str(path), *names],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    loaded: dict[str, Any] = json.loads(result.stdout)
    return loaded


@pytest.fixture(scope="module")
def checkpoint(moto: MotoServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The checkpoint in moto's bucket "weights", made and uploaded once for every readahead
    (96 MiB): the sha256 of each tensor, by name."""
    rng = np.random.default_rng(5)
    tensors = {
        f"layers.{i:02d}.weight": rng.standard_normal(TENSOR_BYTES // 4, dtype=np.float32)
        for i in range(TENSORS)
    }
    local = tmp_path_factory.mktemp("checkpoint") / "model.safetensors"
    safetensors_numpy.save_file(tensors, str(local))
    s3 = boto3.client("s3", endpoint_url=moto.endpoint_url)
    s3.create_bucket(Bucket="weights")
    s3.put_object(Bucket="weights", Key="model.safetensors", Body=local.read_bytes())
    local.unlink()
    return {name: hashlib.sha256(tensor.tobytes()).hexdigest() for name, tensor in tensors.items()}


@pytest.mark.parametrize("readahead", sorted(MOST_FETCHED))
def test_a_lazy_load_fetches_the_tensors_read_and_little_more(
    moto: MotoServer, checkpoint: dict[str, str], tmp_path: Path, readahead: str
) -> None:
    picked = random.Random(3).sample(sorted(checkpoint), PICKED)
    with FaultProxy(moto.port) as store:  # no faults: it counts the bytes of object GETs
        options = (
            *("--endpoint-url", store.endpoint_url, "--cache-dir", str(tmp_path / "cache")),
            *("--kernel-readahead", readahead),
        )
        with mounted("s3://weights", tmp_path / "mnt", *options) as mnt:
            loaded = lazy_load(mnt / "model.safetensors", picked)
            fetched = store.body_bytes
    assert loaded["keys"] == sorted(checkpoint)
    for name in picked:
        assert loaded[name] == checkpoint[name], name
    assert 0 < fetched <= MOST_FETCHED[readahead] * PICKED * TENSOR_BYTES, fetched / (
        PICKED * TENSOR_BYTES
    )
