"""The libraries users read through: Parquet, safetensors, Arrow files by mmap, tar shards.

Most users touch their data through a library, not through read() calls of their own: Ray Data
and pandas read Parquet with pyarrow (ranged reads at the offsets of the file's footer),
transformers and vLLM load weights with safetensors (page faults of a mapping), Hugging Face
`datasets` keeps a dataset as Arrow IPC streams it memory-maps and reads by random rows, and
WebDataset reads tar shards front to back with `tarfile`. Each pattern here is the library's
own calls on files of its own (seeded, so every run and system reads the same bytes):

- parquet columns: `pq.read_table(path, columns=2 of 20)` of each file, 4 files at a time;
- parquet scan: `pq.read_table(path)` of each file of another set, 4 at a time;
- safetensors lazy: `safe_open` (mmap) and PICKED tensors of a checkpoint;
- safetensors full: every tensor of another checkpoint through `safe_open`, as
  `safetensors.torch.load_file` does (its numpy `load_file` reads the file with one read());
- arrow batches: `pa.ipc.open_stream(pa.memory_map(path)).read_all()`, then seeded batches of
  random rows, each row a one-row slice of its record batch and the batch a table of those
  slices, as `datasets` gathers rows after a shuffle (its own library is not installed: the
  same pyarrow calls). Not `Table.take`: that copies every chunk of the table into one array
  first (pyarrow 26), 256 MiB per batch, seconds of the client's CPU that no file system moves;
- tar: shards read by 4 readers taking the next of a shuffled list, each through
  `tarfile.open(fileobj=open(path, "rb"), mode="r|*")` and every member read, as WebDataset does.

Every pattern checks what it read, once its clock has stopped. The whole runs in a mount of
its own per system (empty caches), through a counting proxy (bench.counting), so the bytes the
store sent during each pattern are counted alike for every system; the page cache is dropped
before each. The figures:
seconds of each pattern, and the bytes fetched over the bytes the client needed of the file
(`read_bytes`): the footers and chosen column chunks of a projection, the header and tensors of
a lazy load, the taken rows' values, the whole file for a scan or a full load.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import random
import shutil
import struct
import tarfile
import tempfile
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from bench import lazyload

MIB = 1 << 20
READERS = 4  # files read at once: a loader's workers
PICKED = 6  # tensors of the lazy load
PROJECTED = ["c03", "c11"]  # 2 of the 20 columns
COLUMNS = [f"c{i:02d}" for i in range(20)]
# Each pattern's objects under a top directory of its own, one level down: pffs's dataset
# preload takes opens in one directory or in sibling directories for one dataset
# (bench.largeobjects.CHECKPOINT_KEY says more), so no pattern loads another's files ahead.
COLUMNS_DIR = "clients-columns/parquet"
SCAN_DIR = "clients-scan/parquet"
LAZY_KEY = "clients-lazy/model/model.safetensors"
FULL_KEY = "clients-full/model/model.safetensors"
ARROW_KEY = "clients-arrow/train/data-00000-of-00001.arrow"
TAR_DIR = "clients-tar/shards"
TOPS = ["clients-columns", "clients-scan", "clients-lazy", "clients-full", "clients-arrow"]
TOPS += ["clients-tar"]
# The pattern's figures: f"clients_{name}_s" and f"clients_{name}_fetched_x".
PATTERNS = ["parquet_columns", "parquet_scan", "safetensors_lazy", "safetensors_full"]
PATTERNS += ["arrow_batches", "tar"]
# After a pattern, the store's bytes are read until this long passes with none (a system may
# go on fetching, as a preload does, and that is the pattern's cost too).
QUIET_S = 0.5
QUIET_LIMIT_S = 30.0


def seconds_key(pattern: str) -> str:
    return f"clients_{pattern}_s"


def fetched_key(pattern: str) -> str:
    return f"clients_{pattern}_fetched_x"


@dataclass(frozen=True)
class ClientSizes:
    parquet_files: int  # per set (columns, scan)
    parquet_rows: int  # per file, 20 int64 columns, 4 row groups
    tensors: int  # per checkpoint (lazy, full)
    tensor_size: int
    arrow_rows: int
    arrow_row_size: int  # bytes of each row's binary value (an encoded image's)
    arrow_batches: int
    arrow_batch_rows: int
    tar_shards: int
    tar_samples: int  # per shard
    tar_sample_size: int  # bytes of each sample's payload (about)

    @staticmethod
    def full() -> ClientSizes:
        # About 36 MiB per Parquet file (286 MiB a set), 512 MiB per checkpoint, a 256 MiB
        # Arrow file of which 32 MiB of rows are taken, 8 shards of about 32 MiB.
        return ClientSizes(parquet_files=8, parquet_rows=200_000, tensors=64,
                           tensor_size=8 * MIB, arrow_rows=16_384, arrow_row_size=16_384,
                           arrow_batches=64, arrow_batch_rows=32, tar_shards=8,
                           tar_samples=320, tar_sample_size=100 * 1024)  # fmt: skip

    @staticmethod
    def quick() -> ClientSizes:
        return ClientSizes(parquet_files=4, parquet_rows=16_000, tensors=16,
                           tensor_size=1 * MIB, arrow_rows=2048, arrow_row_size=8192,
                           arrow_batches=16, arrow_batch_rows=16, tar_shards=4,
                           tar_samples=40, tar_sample_size=50 * 1024)  # fmt: skip


@dataclass
class ClientData:
    """What the patterns read and how each checks it."""

    sizes: ClientSizes
    columns_keys: list[str] = field(default_factory=list)
    scan_keys: list[str] = field(default_factory=list)
    column_sums: dict[str, dict[str, int]] = field(default_factory=dict)  # key -> column -> sum
    projection_bytes: int = 0  # footers and the chosen columns' chunks, all files
    scan_bytes: int = 0
    lazy_sha256: dict[str, str] = field(default_factory=dict)
    lazy_read_bytes: int = 0
    full_sha256: dict[str, str] = field(default_factory=dict)
    full_bytes: int = 0
    arrow_bytes: int = 0  # the taken rows' values
    arrow_file_bytes: int = 0
    tar_keys: list[str] = field(default_factory=list)
    tar_sha256: dict[str, str] = field(default_factory=dict)  # shard name -> its members'
    tar_bytes: int = 0


# --- generating -------------------------------------------------------------------------


def write_parquet(path: str, rows: int, seed: int) -> dict[str, int]:
    """20 int64 columns of seeded random values in 4 row groups; each column's sum."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    arrays = {name: rng.integers(0, 1 << 40, rows, dtype=np.int64) for name in COLUMNS}
    pq.write_table(pa.table(arrays), path, row_group_size=-(-rows // 4))
    return {name: int(values.sum()) for name, values in arrays.items()}


def projection_bytes(path: str) -> int:
    """The bytes a projection of PROJECTED needs: the footer and those columns' chunks."""
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    with open(path, "rb") as f:
        f.seek(-8, os.SEEK_END)
        footer = int(struct.unpack("<I", f.read(4))[0]) + 8
    wanted = 0
    for group in range(meta.num_row_groups):
        row_group = meta.row_group(group)
        for column in range(row_group.num_columns):
            chunk = row_group.column(column)
            if chunk.path_in_schema in PROJECTED:
                wanted += int(chunk.total_compressed_size)
    return footer + wanted


def tensor_names(count: int) -> list[str]:
    return [f"model.layers.{i:02d}.weight" for i in range(count)]


def write_safetensors(path: str, count: int, size: int, seed: int) -> dict[str, str]:
    """A safetensors file of `count` float32 tensors of seeded random bytes; each sha256."""
    names, random_bytes = tensor_names(count), random.Random(seed).randbytes
    return lazyload.write_safetensors(path, names, size, random_bytes)


def header_bytes(count: int, size: int) -> int:
    """A safetensors file's header, its length field included (the lazy load reads it)."""
    return 8 + len(lazyload.safetensors_header(tensor_names(count), size))


def write_arrow(path: str, rows: int, row_size: int, seed: int) -> None:
    """An Arrow IPC stream as `datasets` writes one: batches of 1,000 rows of an index, a
    seeded binary value (an encoded image) and the value's crc32."""
    import pyarrow as pa

    rng = random.Random(seed)
    schema = pa.schema([("idx", pa.int64()), ("image", pa.binary()), ("crc", pa.int64())])
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for start in range(0, rows, 1000):
            idx = list(range(start, min(rows, start + 1000)))
            images = [rng.randbytes(row_size) for _ in idx]
            crcs = [zlib.crc32(image) for image in images]
            writer.write_batch(pa.record_batch([idx, images, crcs], schema=schema))


def write_tar(path: str, samples: int, size: int, seed: int) -> str:
    """A WebDataset shard: per sample a .jpg of seeded bytes (sizes vary by up to a quarter)
    and a .cls; the sha256 of every member's bytes in order."""
    rng = random.Random(seed)
    digest = hashlib.sha256()
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for sample in range(samples):
            image = rng.randbytes(size - rng.randrange(size // 4))
            label = str(rng.randrange(1000)).encode()
            for suffix, payload in ((".jpg", image), (".cls", label)):
                info = tarfile.TarInfo(f"sample{sample:06d}{suffix}")
                info.size, info.mtime = len(payload), 0
                tar.addfile(info, io.BytesIO(payload))
                digest.update(payload)
    return digest.hexdigest()


def parquet_key(directory: str, n: int) -> str:
    """The key of a Parquet set's `n`th file."""
    return f"{directory}/part-{n:05d}.parquet"


def generate(sizes: ClientSizes, workdir: str, put: Callable[[str, str], None]) -> ClientData:
    """Every pattern's files, written in `workdir` one at a time and each given to
    `put(local_path, key)` (an upload), then removed; what the patterns check."""
    data = ClientData(sizes)
    local = os.path.join(workdir, "client-object")

    def upload(key: str) -> int:
        size = os.path.getsize(local)
        put(local, key)
        os.remove(local)
        return size

    sets = ((COLUMNS_DIR, data.columns_keys, 100), (SCAN_DIR, data.scan_keys, 200))
    for directory, keys, seed in sets:
        for n in range(sizes.parquet_files):
            key = parquet_key(directory, n)
            data.column_sums[key] = write_parquet(local, sizes.parquet_rows, seed + n)
            if directory == COLUMNS_DIR:
                data.projection_bytes += projection_bytes(local)
                upload(key)
            else:
                data.scan_bytes += upload(key)
            keys.append(key)
    data.lazy_sha256 = write_safetensors(local, sizes.tensors, sizes.tensor_size, 300)
    upload(LAZY_KEY)
    data.lazy_read_bytes = header_bytes(sizes.tensors, sizes.tensor_size)
    data.lazy_read_bytes += min(PICKED, sizes.tensors) * sizes.tensor_size
    data.full_sha256 = write_safetensors(local, sizes.tensors, sizes.tensor_size, 400)
    data.full_bytes = upload(FULL_KEY)
    write_arrow(local, sizes.arrow_rows, sizes.arrow_row_size, 500)
    data.arrow_file_bytes = upload(ARROW_KEY)
    data.arrow_bytes = sizes.arrow_batches * sizes.arrow_batch_rows * sizes.arrow_row_size
    for n in range(sizes.tar_shards):
        key = f"{TAR_DIR}/shard-{n:06d}.tar"
        data.tar_sha256[os.path.basename(key)] = write_tar(
            local, sizes.tar_samples, sizes.tar_sample_size, 600 + n
        )
        data.tar_bytes += upload(key)
        data.tar_keys.append(key)
    return data


def keys(data: ClientData) -> list[str]:
    """Every object of the patterns (to read once from the store before any system does)."""
    return [*data.columns_keys, *data.scan_keys, LAZY_KEY, FULL_KEY, ARROW_KEY, *data.tar_keys]


# --- the patterns -----------------------------------------------------------------------


Check = Callable[[], None]  # what a pattern read, checked after its clock stopped


def _in_readers(work: Callable[[str], Check], paths: list[str]) -> Check:
    """`work` of each path, READERS at once; the checks of all."""
    with ThreadPoolExecutor(READERS) as pool:
        checks = list(pool.map(work, paths))

    def check() -> None:
        for one in checks:
            one()

    return check


def _check_columns(key: str, table: Any, names: list[str], data: ClientData) -> Check:
    def check() -> None:
        for name in names:
            if table.column(name).to_numpy().sum() != data.column_sums[key][name]:
                raise RuntimeError(f"{key}: column {name} is not what was uploaded")

    return check


def parquet_columns(mnt: str, data: ClientData) -> Check:
    import pyarrow.parquet as pq

    def read(key: str) -> Check:
        table = pq.read_table(os.path.join(mnt, key), columns=PROJECTED)
        return _check_columns(key, table, PROJECTED, data)

    return _in_readers(read, data.columns_keys)


def parquet_scan(mnt: str, data: ClientData) -> Check:
    import pyarrow.parquet as pq

    def read(key: str) -> Check:
        table = pq.read_table(os.path.join(mnt, key))
        return _check_columns(key, table, COLUMNS, data)

    return _in_readers(read, data.scan_keys)


def _check_tensors(
    path: str, names: list[str], arrays: list[Any], digests: dict[str, str]
) -> Check:
    def check() -> None:
        for name, array in zip(names, arrays, strict=True):
            if hashlib.sha256(array.tobytes()).hexdigest() != digests[name]:
                raise RuntimeError(f"{path}: tensor {name} is not the bytes uploaded")

    return check


def picked_tensors(count: int, seed: int = 1) -> list[str]:
    return random.Random(seed).sample(tensor_names(count), min(PICKED, count))


def safetensors_lazy(mnt: str, data: ClientData) -> Check:
    from safetensors import safe_open

    path = os.path.join(mnt, LAZY_KEY)
    names = picked_tensors(data.sizes.tensors)
    with safe_open(path, framework="np") as checkpoint:
        arrays = [checkpoint.get_tensor(name) for name in names]
    return _check_tensors(path, names, arrays, data.lazy_sha256)


def safetensors_full(mnt: str, data: ClientData) -> Check:
    """Every tensor, as `safetensors.torch.load_file` takes them: safe_open, then get_tensor of
    each key in the file's order."""
    from safetensors import safe_open

    path = os.path.join(mnt, FULL_KEY)
    with safe_open(path, framework="np") as checkpoint:
        names = list(checkpoint.keys())
        arrays = [checkpoint.get_tensor(name) for name in names]
    return _check_tensors(path, names, arrays, data.full_sha256)


def arrow_batches(mnt: str, data: ClientData, seed: int = 1) -> Check:
    """`datasets`' way: the stream memory-mapped and read as a table (no copy), then batches
    of random rows gathered from it as its `fast_gather` does (a one-row slice of the record
    batch holding each row, found by the batches' first rows), made Python objects."""
    import bisect

    import pyarrow as pa

    sizes = data.sizes
    rng = random.Random(seed)
    gathered: list[tuple[list[int], dict[str, list[Any]]]] = []
    with pa.memory_map(os.path.join(mnt, ARROW_KEY)) as source:
        table = pa.ipc.open_stream(source).read_all()
        if table.num_rows != sizes.arrow_rows:
            raise RuntimeError(f"{ARROW_KEY}: {table.num_rows} rows, not {sizes.arrow_rows}")
        batches = [batch for batch in table.to_batches() if batch.num_rows]
        firsts = [0]
        for record_batch in batches:
            firsts.append(firsts[-1] + record_batch.num_rows)
        rows: list[Any] = []
        for _ in range(sizes.arrow_batches):
            indices = rng.sample(range(sizes.arrow_rows), sizes.arrow_batch_rows)
            rows = []
            for index in indices:
                which = bisect.bisect_right(firsts, index) - 1
                rows.append(batches[which].slice(index - firsts[which], 1))
            gathered.append((indices, pa.Table.from_batches(rows, schema=table.schema).to_pydict()))
        del table, batches, rows  # the mapping's last users, before it closes

    def check() -> None:  # the rows are Python objects: nothing of the mapping is left
        for indices, batch in gathered:
            for index, got, image, crc in zip(
                indices, batch["idx"], batch["image"], batch["crc"], strict=True
            ):
                if got != index or zlib.crc32(image) != crc:
                    raise RuntimeError(f"{ARROW_KEY}: row {index} is not what was uploaded")

    return check


def tar_shards(mnt: str, data: ClientData, seed: int = 1) -> Check:
    """Shards read by READERS readers, each taking the next of a shuffled list (WebDataset's
    shardshuffle, a reader per DataLoader worker), every member read in the stream."""
    order = list(data.tar_keys)
    random.Random(seed).shuffle(order)

    def read(key: str) -> Check:
        members = []
        with (
            open(os.path.join(mnt, key), "rb") as stream,
            tarfile.open(fileobj=stream, mode="r|*") as tar,
        ):
            for member in tar:
                extracted = tar.extractfile(member)
                if extracted is not None:
                    members.append(extracted.read())

        def check() -> None:
            digest = hashlib.sha256()
            for member_bytes in members:
                digest.update(member_bytes)
            if digest.hexdigest() != data.tar_sha256[os.path.basename(key)]:
                raise RuntimeError(f"{key}: its members are not what was uploaded")

        return check

    return _in_readers(read, order)


def read_bytes(data: ClientData, pattern: str) -> int:
    """The bytes of its files a pattern's client needed."""
    return {
        "parquet_columns": data.projection_bytes,
        "parquet_scan": data.scan_bytes,
        "safetensors_lazy": data.lazy_read_bytes,
        "safetensors_full": data.full_bytes,
        "arrow_batches": data.arrow_bytes,
        "tar": data.tar_bytes,
    }[pattern]


def must_fetch_bytes(data: ClientData, pattern: str) -> int:
    """The bytes any system must fetch from the store for a pattern (its floor's, in
    bench.clientfloor): what the client read, but for the Arrow batches the whole file, which
    `read_all` of the mapped stream has the kernel read whatever system serves it."""
    if pattern == "arrow_batches":
        return data.arrow_file_bytes
    return read_bytes(data, pattern)


# A pattern: reads its files under a root (a mount, or a local copy) as its library does, and
# returns the check of what it read, run once the pattern's clock has stopped: the checks
# (SHA-256 of every tensor, 0.4-0.5 s of the full load's on this machine) are the bench's,
# not the library's, and timed they were a like cost added to every system's time.
Runner = Callable[[str, ClientData], Check]
RUNNERS: dict[str, Runner] = {
    "parquet_columns": parquet_columns,
    "parquet_scan": parquet_scan,
    "safetensors_lazy": safetensors_lazy,
    "safetensors_full": safetensors_full,
    "arrow_batches": arrow_batches,
    "tar": tar_shards,
}


# Scans of the run's Parquet set on local disk before any clock starts (warm_libraries).
WARM_SCANS = 3


@functools.cache
def warm_libraries(sizes: ClientSizes | None = None) -> None:
    """The libraries imported, and each pattern run once over quick-size files on local disk,
    before any clock starts; and the Parquet scan WARM_SCANS times over files of the run's
    `sizes`. Once per process and sizes. A library's first use in a process costs what no later
    use does, which would be charged to whichever system is measured first: pyarrow's first
    Parquet read about 110 ms against 11 ms after; its first two full-size scans 0.9-1.7 CPU-s
    of the client against 0.5-0.6 after (the kernel's time in its allocator's first mappings:
    docs/notes/clients-full-load-window.md). A second at quick sizes, a few more at full."""
    import numpy  # noqa: F401
    import pyarrow.ipc
    import pyarrow.parquet  # noqa: F401
    import safetensors  # noqa: F401

    _warm_patterns()
    if sizes is not None and sizes != ClientSizes.quick():
        _warm_scan(sizes)


def _warm_patterns() -> None:
    """Each pattern once over quick-size files on local disk."""
    with tempfile.TemporaryDirectory(prefix="clients-warm-") as work:
        root = os.path.join(work, "files")

        def copy(local: str, key: str) -> None:
            os.makedirs(os.path.dirname(os.path.join(root, key)), exist_ok=True)
            shutil.copyfile(local, os.path.join(root, key))

        data = generate(ClientSizes.quick(), work, copy)
        for runner in RUNNERS.values():
            runner(root, data)()


def _warm_scan(sizes: ClientSizes) -> None:
    """The Parquet scan WARM_SCANS times over a set of `sizes` on local disk."""
    with tempfile.TemporaryDirectory(prefix="clients-warm-") as work:
        data = ClientData(sizes)
        os.makedirs(os.path.join(work, SCAN_DIR))
        for n in range(sizes.parquet_files):
            key = parquet_key(SCAN_DIR, n)
            data.column_sums[key] = write_parquet(os.path.join(work, key), sizes.parquet_rows, n)
            data.scan_keys.append(key)
        for _ in range(WARM_SCANS):
            parquet_scan(work, data)()


# --- the scenario -----------------------------------------------------------------------


def run(
    mount: Callable[[Any, str, str], int | None],
    unmount: Callable[[str], None],
    drop_caches: Callable[[], bool],
    server: Any,
    data: ClientData,
    workdir: str,
    patterns: list[str],
    on_pattern: Callable[[str], None] | None = None,
) -> dict[str, float | str]:
    """`patterns` on a mount of their own (`mount(server, mountpoint, cache)`) through a
    counting proxy: each one's seconds and bytes fetched over bytes read."""
    from bench.counting import CountingProxy

    warm_libraries(data.sizes)
    base = tempfile.mkdtemp(prefix="clients-", dir=workdir)
    mountpoint, cache = os.path.join(base, "mnt"), os.path.join(base, "cache")
    os.makedirs(mountpoint)
    os.makedirs(cache)
    proxy = CountingProxy(server)
    results: dict[str, float | str] = {}
    try:
        mount(proxy.server, mountpoint, cache)
        try:
            for pattern in patterns:
                if on_pattern is not None:
                    on_pattern(pattern)
                drop_caches()
                proxy.restart_count()
                try:
                    started = time.perf_counter()
                    check = RUNNERS[pattern](mountpoint, data)
                    results[seconds_key(pattern)] = round(time.perf_counter() - started, 3)
                    check()
                    fetched = _bytes_until_quiet(proxy)
                    ratio = fetched / read_bytes(data, pattern)
                    results[fetched_key(pattern)] = round(ratio, 2)
                except Exception as exc:  # reported as the pattern's figure; the others run
                    error = f"error: {str(exc).splitlines()[0][:160]}"
                    results[seconds_key(pattern)] = results[fetched_key(pattern)] = error
        finally:
            unmount(mountpoint)
    finally:
        proxy.stop()
        shutil.rmtree(base, ignore_errors=True)
    return results


def _bytes_until_quiet(proxy: Any) -> int:
    """The store's bytes since the last reading, read again every QUIET_S until one span
    brings none (or QUIET_LIMIT_S passes)."""
    proxy.restart_count()
    total = int(proxy.store_bytes)
    deadline = time.monotonic() + QUIET_LIMIT_S
    while time.monotonic() < deadline:
        time.sleep(QUIET_S)
        proxy.restart_count()
        if not proxy.store_bytes:
            break
        total += int(proxy.store_bytes)
    return total
