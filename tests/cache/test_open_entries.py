"""The disk tier's open entries: reads without a lookup, and what must never be served.

An entry kept open is checked on every read: damaged (truncated, a flipped bit) or gone
(evicted, deleted or replaced, by this process or another sharing the directory), it is a miss,
never wrong bytes; and its descriptor is closed. Running out of descriptors shrinks the cache
and reads go on.
"""

from __future__ import annotations

import errno
import os
import random
import resource
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import trio

from pffs.cache import openentries
from pffs.cache.blocks import Background, BlockCache
from pffs.cache.disk import DiskTier, entry_key
from pffs.cache.diskio import DiskIO
from pffs.cache.entries import CHUNK
from pffs.cache.keys import BlockKey
from pffs.cache.stats import CacheStats
from tests.cache.configs import KIB, FetchSource, cache_config

BLOCK = 256 * KIB  # four 64 KiB chunks


def _key(index: int) -> str:
    return entry_key(BlockKey("src", "u", "file", "v1", index), BLOCK)


def _block(index: int) -> bytes:
    return random.Random(index).randbytes(BLOCK)


def _tier(directory: Path, **kwargs: int) -> DiskTier:
    return DiskTier(str(directory), capacity=1 << 30, free_ratio=0.0, compress=False, **kwargs)


def _entry_file(tier: DiskTier, key: str) -> str:
    """The file of the key's open entry (read once first)."""
    entry = tier.open_entries.acquire(key)
    assert entry is not None, "the entry is not held open"
    tier.open_entries.release(entry)
    return entry.path


def _open_cache_files(directory: Path) -> list[str]:
    """What this process's descriptors point to under the cache directory."""
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        link = Path("/proc/self/fd") / fd
        try:
            target = os.readlink(link)
        except OSError:
            continue  # the descriptor listdir itself used, closed since
        if target.startswith(str(directory)) and target.endswith((".val", ".val (deleted)")):
            targets.append(target)
    return targets


def test_a_read_of_an_open_entry_needs_no_index_lookup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = _tier(tmp_path)
    data = _block(0)
    assert tier.put(_key(0), data, "src")
    assert tier.get_range(_key(0), 10, 4 * KIB).data == data[10 : 10 + 4 * KIB]
    assert len(tier.open_entries) == 1

    def no_lookups(*args: object, **kwargs: object) -> object:
        raise AssertionError("the index was asked")

    monkeypatch.setattr(tier._cache, "get", no_lookups)
    monkeypatch.setattr(tier.index, "lookup", no_lookups)
    for start in (0, CHUNK - 100, 3 * CHUNK, BLOCK - 4 * KIB):
        assert tier.get_range(_key(0), start, 4 * KIB).data == data[start : start + 4 * KIB]
    assert tier.get(_key(0)).data == data
    tier.close()
    assert _open_cache_files(tmp_path) == []


def test_an_entry_truncated_while_held_is_a_miss_and_dropped(tmp_path: Path) -> None:
    tier = _tier(tmp_path)
    data = _block(1)
    assert tier.put(_key(1), data, "src")
    assert tier.get_range(_key(1), 0, 100).data == data[:100]
    path = _entry_file(tier, _key(1))
    os.truncate(path, 4096 + 2 * CHUNK)  # a crash or a full disk cut the file short
    found = tier.get_range(_key(1), 3 * CHUNK, 4 * KIB)
    assert (found.data, found.corrupt) == (None, True)
    assert _key(1) not in tier  # deleted from the index: the next read fetches it again
    assert len(tier.open_entries) == 0
    assert _open_cache_files(tmp_path) == []
    tier.close()


def test_an_entry_with_a_damaged_header_is_refused_at_open(tmp_path: Path) -> None:
    tier = _tier(tmp_path)
    data = _block(9)
    assert tier.put(_key(9), data, "src")
    [path] = [str(p) for p in tmp_path.rglob("*.val")]
    with open(path, "r+b") as f:  # a bit of the key digest: the entry looks like another key's
        f.seek(13)  # magic, flags, length and chunk size come first
        flipped = f.read(1)[0] ^ 1
        f.seek(13)
        f.write(bytes([flipped]))
    found = tier.get_range(_key(9), 0, 10)
    assert (found.data, found.corrupt) == (None, True)
    assert _key(9) not in tier and len(tier.open_entries) == 0
    assert _open_cache_files(tmp_path) == []
    tier.close()


@pytest.mark.parametrize("read_before", [True, False], ids=["verified-chunk", "fresh-chunk"])
def test_a_bit_flipped_while_held_is_a_miss_and_dropped(tmp_path: Path, read_before: bool) -> None:
    """A chunk read (and verified) before its bit flipped is checked again: bits rot on disk
    after a read, and reach a reader once the page cache has let them go."""
    tier = _tier(tmp_path)
    data = _block(2)
    assert tier.put(_key(2), data, "src")
    target = 2 * CHUNK + 1234
    assert tier.get_range(_key(2), target if read_before else 0, 10).data is not None
    path = _entry_file(tier, _key(2))
    with open(path, "r+b") as f:  # another descriptor, as bit rot or another process would
        payload_offset = 4096
        f.seek(payload_offset + target)
        flipped = f.read(1)[0] ^ 0x10
        f.seek(payload_offset + target)
        f.write(bytes([flipped]))
    found = tier.get_range(_key(2), target - 100, 200)
    assert (found.data, found.corrupt) == (None, True)
    assert _key(2) not in tier
    assert _open_cache_files(tmp_path) == []
    tier.close()


_OTHER_PROCESS = """
import sys
from pffs.cache.disk import DiskTier
tier = DiskTier(sys.argv[1], capacity=1 << 30, free_ratio=0.0, compress=False)
if sys.argv[2] == "delete":
    tier.delete(sys.argv[3])
else:  # replace: the same block stored again, in a new file
    assert tier.put(sys.argv[3], tier.get(sys.argv[3]).data, "src")
tier.close()
"""


def _in_other_process(directory: Path, action: str, key: str) -> None:
    subprocess.run([sys.executable, "-c", _OTHER_PROCESS, str(directory), action, key], check=True)


def test_an_entry_another_process_deletes_is_a_miss_and_closed(tmp_path: Path) -> None:
    tier = _tier(tmp_path)
    data = _block(3)
    assert tier.put(_key(3), data, "src")
    assert tier.get_range(_key(3), 0, 100).data == data[:100]
    assert len(_open_cache_files(tmp_path)) == 1
    _in_other_process(tmp_path, "delete", _key(3))
    found = tier.get_range(_key(3), 0, 100)
    assert (found.data, found.corrupt) == (None, False)  # gone, not damaged
    assert _open_cache_files(tmp_path) == []
    tier.close()


def test_an_entry_another_process_replaces_is_read_from_its_new_file(tmp_path: Path) -> None:
    tier = _tier(tmp_path)
    data = _block(4)
    assert tier.put(_key(4), data, "src")
    assert tier.get_range(_key(4), 0, 100).data == data[:100]
    old = _entry_file(tier, _key(4))
    _in_other_process(tmp_path, "replace", _key(4))
    assert tier.get_range(_key(4), CHUNK, 100).data == data[CHUNK : CHUNK + 100]
    new = _entry_file(tier, _key(4))
    assert new != old and not os.path.exists(old)
    assert _open_cache_files(tmp_path) == [new]  # the old file's descriptor was closed
    tier.close()


def test_eviction_and_delete_close_what_they_remove(tmp_path: Path) -> None:
    # Room for a few entries: storing more evicts the oldest (diskcache culls on set, its
    # database counted in the volume too).
    tier = DiskTier(str(tmp_path), capacity=8 * BLOCK, free_ratio=0.0, compress=False)
    for index in range(20):
        assert tier.put(_key(index), _block(index), "src")
        assert tier.get_range(_key(index), 0, 10).data in (None, _block(index)[:10])
    kept = [index for index in range(20) if _key(index) in tier]
    assert 0 < len(kept) < 20
    held = _open_cache_files(tmp_path)
    assert not [path for path in held if path.endswith("(deleted)")]
    assert 0 < len(held) == len(tier.open_entries) <= len(kept)
    tier.delete(_key(kept[0]))
    assert len(_open_cache_files(tmp_path)) == len(held) - 1
    tier.clear()
    assert _open_cache_files(tmp_path) == []
    tier.close()


def test_the_bound_is_a_share_of_the_descriptor_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (1024, 4096))
    assert openentries.descriptor_share() == 256
    tier = _tier(tmp_path, open_entries=3)
    for index in range(6):
        assert tier.put(_key(index), _block(index), "src")
        assert tier.get_range(_key(index), 0, 10).data == _block(index)[:10]
    assert len(tier.open_entries) == 3 and len(_open_cache_files(tmp_path)) == 3
    tier.close()


def test_out_of_descriptors_the_cache_shrinks_and_reads_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EMFILE injected into os.open: deterministic, and the test process keeps its own limit
    (the subprocess test below runs the same path against a real, lowered RLIMIT_NOFILE)."""
    tier = _tier(tmp_path, open_entries=8)
    for index in range(8):
        assert tier.put(_key(index), _block(index), "src")
        assert tier.get_range(_key(index), 0, 10).data is not None
    assert len(tier.open_entries) == 8
    real_open = os.open
    failures = 0

    def open_out_of_descriptors(path: str, flags: int, mode: int = 0o777) -> int:
        nonlocal failures
        reading = not flags & (os.O_WRONLY | os.O_RDWR)
        if reading and path.endswith(".val") and failures < 1:
            failures += 1
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", open_out_of_descriptors)
    assert tier.put(_key(8), _block(8), "src")
    assert tier.get_range(_key(8), 5, 10).data == _block(8)[5:15]
    assert failures == 1
    assert tier.open_entries.capacity == 4  # half of what was open
    assert len(tier.open_entries) == 4
    # Every entry still reads, now through fewer open entries; the bound grows back by one
    # for every 16 entries opened, never past where it started.
    for _round in range(6):
        for index in range(9):
            got = tier.get_range(_key(index), 100, 4 * KIB).data
            assert got == _block(index)[100 : 100 + 4 * KIB]
    assert 4 < tier.open_entries.capacity <= 8
    assert len(tier.open_entries) <= tier.open_entries.capacity
    tier.close()


_LOW_LIMIT = """
import random, resource, sys
from pffs.cache.disk import DiskTier, entry_key
from pffs.cache.keys import BlockKey
tier = DiskTier(sys.argv[1], capacity=1 << 30, free_ratio=0.0, compress=False, open_entries=1000)
keys = [entry_key(BlockKey("s", "u", "f", "v", i), 65536) for i in range(80)]
blocks = {key: random.Random(i).randbytes(65536) for i, key in enumerate(keys)}
for key, data in blocks.items():
    assert tier.put(key, data, "s")
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (48, hard))
for _ in range(3):
    for key, data in blocks.items():
        assert tier.get_range(key, 1000, 4096).data == data[1000:5096], key
print(tier.open_entries.capacity, len(tier.open_entries))
"""


def test_a_real_descriptor_limit_shrinks_the_cache(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _LOW_LIMIT, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    capacity, held = map(int, result.stdout.split())
    assert held <= capacity < 48
    assert "out of file descriptors" in result.stderr


def test_bytes_exact_under_concurrent_reads_and_evictions(tmp_path: Path) -> None:
    tier = _tier(tmp_path, open_entries=4)  # fewer than the entries: descriptors churn
    blocks = {_key(index): _block(index) for index in range(10)}
    for key, data in blocks.items():
        assert tier.put(key, data, "src")
    wrong: list[str] = []
    served = 0

    def reader(seed: int) -> None:
        nonlocal served
        rng = random.Random(seed)
        for _ in range(1500):
            key = rng.choice(list(blocks))
            start = rng.randrange(BLOCK - 1)
            length = rng.randrange(1, 3 * CHUNK)
            found = tier.get_range(key, start, length)
            if found.data is not None:
                served += 1
                if found.data != blocks[key][start : start + length]:
                    wrong.append(f"{key} {start} {length}")

    def evictor() -> None:
        rng = random.Random(99)
        for _ in range(150):
            key = rng.choice(list(blocks))
            tier.delete(key)
            assert tier.put(key, blocks[key], "src")

    threads = [threading.Thread(target=reader, args=(n,)) for n in range(4)]
    threads.append(threading.Thread(target=evictor))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []
    assert served > 0
    assert len(_open_cache_files(tmp_path)) == len(tier.open_entries) <= 4
    tier.close()
    assert _open_cache_files(tmp_path) == []


def test_a_compressed_entry_read_in_part_is_kept_in_memory(tmp_path: Path) -> None:
    cache = BlockCache(cache_config(tmp_path, block=BLOCK, compress=True))
    assert cache.disk is not None
    key = BlockKey("src", "u", "file", "v1", 0)
    text = (b"path,label\n" * BLOCK)[:BLOCK]  # compresses: stored with lz4
    assert cache.disk.put(entry_key(BlockKey("src", "u", "file", "v1", 0), BLOCK), text, "src")

    async def no_store() -> bytes:
        raise AssertionError("the store was asked")

    async def main() -> None:
        assert await cache.read_part(key, 1000, 50, FetchSource(no_store), BLOCK) == text[1000:1050]
        assert key in cache.memory  # decompressed once, then served from memory
        assert await cache.read_part(key, 9000, 50, FetchSource(no_store), BLOCK) == text[9000:9050]

    trio.run(main)
    assert cache.stats.disk_hits == 1
    cache.disk.close()


# --- reads without a worker thread (DiskIO.get_range tries get_range_nowait first) -----------


def _disk_io(tier: DiskTier) -> DiskIO:
    return DiskIO(tier, BLOCK, threads=2, stats=CacheStats(), background=Background())


def test_a_part_in_the_page_cache_is_read_without_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = _tier(tmp_path)
    data = _block(5)
    assert tier.put(_key(5), data, "src")
    disk = _disk_io(tier)
    key = BlockKey("src", "u", "file", "v1", 5)
    assert tier.get_range_nowait(_key(5), 0, 10) is None  # not open yet: needs the index
    assert trio.run(disk.get_range, key, 0, 10) == data[:10]  # opens it, in a worker thread

    def no_threads(*args: object, **kwargs: object) -> object:
        raise AssertionError("a worker thread was used")

    monkeypatch.setattr(trio.to_thread, "run_sync", no_threads)
    for start in (0, CHUNK - 10, 2 * CHUNK + 7):
        got = trio.run(disk.get_range, key, start, 5000)
        assert got == data[start : start + 5000]
    assert disk.stats.disk_hits == 4
    tier.close()


def test_a_read_without_a_thread_serves_nothing_doubtful(tmp_path: Path) -> None:
    """Anything but a verified part of a live, uncompressed entry goes to the worker thread,
    which drops what is damaged."""
    tier = _tier(tmp_path)
    for index in (6, 7):
        assert tier.put(_key(index), _block(index), "src")
        assert tier.get_range(_key(index), 0, 10).data is not None
    disk = _disk_io(tier)
    # A flipped bit: not served here; the worker thread's read drops the entry.
    path = _entry_file(tier, _key(6))
    with open(path, "r+b") as f:
        f.seek(4096 + 5)
        f.write(bytes([_block(6)[5] ^ 1]))
    assert tier.get_range_nowait(_key(6), 0, 10) is None
    assert trio.run(disk.get_range, BlockKey("src", "u", "file", "v1", 6), 0, 10) is None
    assert disk.stats.disk_corrupt == 1 and _key(6) not in tier
    # Deleted by another process: no link left, not served.
    _in_other_process(tmp_path, "delete", _key(7))
    assert tier.get_range_nowait(_key(7), 0, 10) is None
    tier.close()


def test_a_part_not_in_the_page_cache_is_left_to_a_thread(tmp_path: Path) -> None:
    if _file_system(tmp_path) == "tmpfs":
        pytest.skip("tmpfs keeps every page in memory: nothing to wait for")
    tier = _tier(tmp_path)
    data = _block(8)
    assert tier.put(_key(8), data, "src")
    assert tier.get_range(_key(8), 0, 10).data == data[:10]
    path = _entry_file(tier, _key(8))
    fd = os.open(path, os.O_RDONLY)
    # Every page read and waited for: the read above started a readahead, and pages still
    # locked under its I/O when DONTNEED comes stay in the page cache (on a busy machine).
    os.pread(fd, os.fstat(fd).st_size, 0)
    # Written back first: the page cache keeps dirty pages through DONTNEED (a busy machine's
    # writeback may not have reached them yet).
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # the page cache lets it go
    os.close(fd)
    assert tier.get_range_nowait(_key(8), 3 * CHUNK, 10) is None  # would wait for the disk
    assert tier.get_range(_key(8), 3 * CHUNK, 10).data == data[3 * CHUNK : 3 * CHUNK + 10]
    assert tier.get_range_nowait(_key(8), 3 * CHUNK, 10) == data[3 * CHUNK : 3 * CHUNK + 10]
    tier.close()


def _file_system(path: Path) -> str:
    """The type of the file system holding `path` (from /proc/self/mounts)."""
    best, kind = "", ""
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            _device, mountpoint, fs_type = line.split()[:3]
            if str(path).startswith(mountpoint) and len(mountpoint) > len(best):
                best, kind = mountpoint, fs_type
    return kind
