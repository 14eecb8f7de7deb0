"""The disk tier on its own: entry format, O_DIRECT, its bound, its permissions."""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import lz4.block
import pytest

from pffs.cache.disk import DiskTier, entry_key
from pffs.cache.entries import decode, encode
from pffs.cache.keys import BlockKey
from tests.cache.configs import KIB


def test_entries_compress_only_when_it_pays() -> None:
    text = b"label,path\n" * 5000
    noise = random.Random(0).randbytes(len(text))
    for data, compressed in ((text, True), (noise, False)):
        header, payload = encode("k", data, compress=True)
        assert (len(payload) < len(data)) is compressed
        assert decode("k", header + payload) == data
        assert decode("other-key", header + payload) is None  # a misplaced entry is refused


def test_compression_is_judged_by_samples_over_the_whole_block() -> None:
    noise = random.Random(5).randbytes(256 * KIB)
    text = b"label,path\n" * (1024 * KIB // 11)
    # Text behind a header of random bytes (larger than one sample) is compressed; random
    # bytes behind a short text header are not stored compressed (it would save under 10%).
    cases = ((noise[: 64 * KIB] + text, True), (text[: 16 * KIB] + noise, False))
    for data, compressed in cases:
        header, payload = encode("k", data, compress=True)
        assert (len(payload) < len(data)) is compressed
        assert decode("k", header + payload) == data


def test_one_compressible_sample_does_not_have_a_random_block_compressed_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Parquet file's last block: random but for its footer at the very end, where one of
    the first samples falls. lz4 is not run over the whole block only to store it raw."""
    block = random.Random(6).randbytes(4096 * KIB - 4 * KIB) + b"footer" * 700
    sizes: list[int] = []
    compress = lz4.block.compress

    def counted(data: bytes, **options: object) -> bytes:
        sizes.append(len(data))
        return compress(data, **options)  # type: ignore[no-any-return]

    monkeypatch.setattr(lz4.block, "compress", counted)  # as pffs.cache.entries calls it
    header, payload = encode("k", block, compress=True)
    assert len(payload) >= len(block) and decode("k", header + payload) == block
    assert sizes and max(sizes) <= 4 * KIB  # samples only
    sizes.clear()
    text = b"label,path\n" * (4096 * KIB // 11)
    header, payload = encode("k", text, compress=True)  # compressible throughout: compressed
    assert len(payload) < len(text) / 2 and len(text) in sizes


@pytest.mark.parametrize("o_direct", [True, False])
def test_entries_round_trip_with_and_without_o_direct(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, o_direct: bool
) -> None:
    if not o_direct:
        # Some file systems refuse O_DIRECT with EINVAL (tmpfs before Linux 6.6, some network
        # and FUSE file systems); none at hand here does, so the refusal is simulated.
        real_open = os.open

        def refusing_open(path: str, flags: int, mode: int = 0o777) -> int:
            if flags & os.O_DIRECT:
                raise OSError(errno.EINVAL, "Invalid argument")
            return real_open(path, flags, mode)

        monkeypatch.setattr(os, "open", refusing_open)
    tier = DiskTier(str(tmp_path / "cache"), 1 << 30, 0.0, compress=True)
    blocks = {
        "odd": random.Random(1).randbytes(100_001),  # not a multiple of 4 KiB
        "text": b"a,b,c\n" * 30_000,  # compressed
        "empty": b"",
    }
    for name, data in blocks.items():
        assert tier.put(name, data, "src")
    for name, data in blocks.items():
        assert tier.get(name) == (data, False, True)
        # A compressed entry is read whole, for the caller to keep; a plain one in part.
        if name == "text":
            assert tier.get_range(name, 5, 50) == (data, False, True)
        else:
            assert tier.get_range(name, 5, 50) == (data[5:55], False, False)
    # The tail: the last chunk is short and the entry's zero padding follows it on disk.
    odd = blocks["odd"]
    assert tier.get_range("odd", len(odd) - 4096, 4096).data == odd[-4096:]
    assert tier.get_range("odd", 70_000, 50_000).data == odd[70_000:]
    for entry in (tmp_path / "cache").rglob("*.val"):
        assert entry.stat().st_size % 4096 == 0  # padded for O_DIRECT
    tier.close()


def test_disk_tier_stays_within_its_bound(tmp_path: Path) -> None:
    tier = DiskTier(str(tmp_path / "d"), capacity=1 << 20, free_ratio=0.0, compress=False)
    block = random.Random(3).randbytes(64 * KIB)
    for index in range(60):
        assert tier.put(entry_key(BlockKey("s", "u", "p", "v", index), 64 * KIB), block, "s")
    stored = sum(u.bytes for u in tier.usage_by_source())
    assert stored <= 1 << 20
    assert sum(u.blocks for u in tier.usage_by_source()) < 60
    tier.close()


def test_cache_dir_files_are_private(tmp_path: Path) -> None:
    tier = DiskTier(str(tmp_path / "private"), 1 << 20, 0.0, False)
    assert (tmp_path / "private").stat().st_mode & 0o777 == 0o700
    tier.close()


def test_usage_by_source_adds_up_each_sources_entries(tmp_path: Path) -> None:
    tier = DiskTier(str(tmp_path / "d"), capacity=1 << 30, free_ratio=0.0, compress=False)
    assert list(tier.usage_by_source()) == []
    blocks = {"small": 2, "large": 5, "middle": 3}
    for source, count in blocks.items():
        for index in range(count):
            data = random.Random(index).randbytes(10 * KIB + index)
            assert tier.put(
                entry_key(BlockKey(source, "u", "p", "v", index), 64 * KIB), data, source
            )
    usage = list(tier.usage_by_source())
    assert [u.source for u in usage] == ["large", "middle", "small"]  # largest first
    assert {u.source: u.blocks for u in usage} == blocks
    for u in usage:  # each entry: a 4 KiB header region and the payload padded to 4 KiB
        assert u.bytes == u.blocks * (4096 + 12 * KIB)
    # A second DiskTier on the directory (another mount, `pffs cache info`) sees the same.
    other = DiskTier(str(tmp_path / "d"), capacity=1 << 30, free_ratio=0.0, compress=False)
    assert list(other.usage_by_source()) == usage
    assert tier.clear("middle") == 3
    assert [(u.source, u.blocks) for u in other.usage_by_source()] == [("large", 5), ("small", 2)]
    other.close()
    tier.close()
