"""A block's entry on disk: its format, checked reads, and writing it with O_DIRECT.

Every entry carries a header: magic, flags, raw length, a CRC32C of each 64 KiB of the raw
bytes and a digest of its key. Reads go through a descriptor: `read_layout` checks and parses
the header once per open (the disk tier keeps the result with the descriptor), then
`read_block` and `read_range` verify the chunks they read against its CRC table on every read.
Each gives None for an entry that fails (bit rot, a truncated file after a crash, a file from
another key); the disk tier (disk.py) then deletes it and reports a miss.

Entries are written with O_DIRECT where the file system allows it: the header and the payload
each start on a 4 KiB boundary and the file is padded to one, so the block goes from an aligned
buffer straight to the disk. A buffered write costs a copy into the page cache plus its
bookkeeping, which a cold read would pay for every block it caches.

Everything here blocks (file I/O, CRC, lz4); callers run it in worker threads, except
`read_range(..., nowait=True)`, which only takes what the page cache holds.
"""

from __future__ import annotations

import array
import errno
import hashlib
import mmap
import os
import struct
import threading
from dataclasses import dataclass

import crc32c
import lz4.block

_MAGIC = b"PFB3"
# magic, flags, raw length, chunk size, key digest, stored payload length
_HEADER = struct.Struct("<4sBII16sI")
_COMPRESSED = 1
# O_DIRECT wants buffers, offsets and lengths aligned to the device's logical block; 4 KiB
# covers every common one. The header (with its CRC table) is padded to it, and so is the file.
ALIGN = 4096
# Each 64 KiB of a block has its own CRC32C (a table after the header), so a random 4 KiB read
# can be served and verified from one chunk of the file instead of the whole 4 MiB block.
CHUNK = 64 * 1024
# Compression is tried on samples first: random-looking data (images, tensors) is common.
_PROBE = 4 * 1024
_PROBES = 4
_CONFIRM = 16
_WORTH_IT = 0.9  # store compressed only when it saves at least 10%


def _key_digest(key: str) -> bytes:
    return hashlib.blake2b(key.encode(), digest_size=16).digest()


def _crc_table(data: bytes | bytearray | memoryview) -> array.array[int]:
    view = memoryview(data)
    return array.array(
        "I", (crc32c.crc32c(view[i : i + CHUNK]) for i in range(0, len(view), CHUNK))
    )


def _aligned(size: int) -> int:
    return -(-size // ALIGN) * ALIGN


def _samples_compress(data: bytes, probes: int) -> bool:
    """Whether `probes` samples of _PROBE bytes, spread evenly from its start to its end,
    compress to under _WORTH_IT of their size together."""
    if len(data) <= probes * _PROBE:
        samples = [data]
    else:
        step = (len(data) - _PROBE) // (probes - 1)
        samples = [data[n * step : n * step + _PROBE] for n in range(probes)]
    packed = sum(len(lz4.block.compress(sample, store_size=False)) for sample in samples)
    return packed < _WORTH_IT * sum(len(sample) for sample in samples)


def worth_trying(data: bytes) -> bool:
    """Whether lz4 may pay for the block: samples of it spread over its length compress.

    Samples from several places rather than one run at the start: a block may open with a
    header unlike the rest. Four first, 16 KiB that cost a quarter of a 64 KiB probe on random
    bytes, which most training data is; a yes is checked with _CONFIRM samples, because one
    compressible sample in four can carry the sum: a Parquet file's last block, random but for
    the footer in its last 4 KiB, said yes and was compressed whole to be stored raw.
    """
    if not _samples_compress(data, _PROBES):
        return False
    # Data the check would compress whole as its one sample is compressed whole next anyway.
    return len(data) <= _CONFIRM * _PROBE or _samples_compress(data, _CONFIRM)


def _packed(data: bytes, compress: bool) -> bytes | None:
    """The block lz4-compressed when compression is on and saves at least 10%, else None."""
    if compress and len(data) > 256 and worth_trying(data):
        packed: bytes = lz4.block.compress(data, store_size=False)
        if len(packed) < _WORTH_IT * len(data):
            return packed
    return None


def _header_region(key: str, flags: int, length: int, stored: int, crcs: array.array[int]) -> bytes:
    """An entry's header, its CRC table and the zero padding to the ALIGN boundary where the
    payload starts."""
    header = _HEADER.pack(_MAGIC, flags, length, CHUNK, _key_digest(key), stored)
    header += crcs.tobytes()
    return header.ljust(_aligned(len(header)), b"\0")


def _region_size(length: int) -> int:
    """The header region's size for a block of `length` raw bytes (a whole number of ALIGN)."""
    return _aligned(_HEADER.size + 4 * -(-length // CHUNK))


def entry_size(length: int) -> int:
    """The most bytes the entry of a block of `length` bytes takes (stored raw: its header
    region, the payload, the padding to ALIGN)."""
    return _aligned(_region_size(length) + length)


def encode(key: str, data: bytes, compress: bool) -> tuple[bytes, bytes]:
    """(header region, payload) of a block's entry, as `write_entry` lays it out on disk."""
    packed = _packed(data, compress)
    if packed is None:
        return _header_region(key, 0, len(data), len(data), _crc_table(data)), data
    return _header_region(key, _COMPRESSED, len(data), len(packed), _crc_table(data)), packed


@dataclass(frozen=True, slots=True)
class Layout:
    """An entry's parsed header: what a read of it needs, kept while its descriptor is open."""

    flags: int
    length: int  # the block's raw bytes
    stored: int  # payload bytes in the file (compressed or not)
    crcs: array.array[int]

    @property
    def payload_offset(self) -> int:
        return _aligned(_HEADER.size + 4 * len(self.crcs))

    @property
    def compressed(self) -> bool:
        return bool(self.flags & _COMPRESSED)


def _parse_layout(key: str, region: bytes | bytearray) -> Layout | None:
    """The layout from an entry's first bytes (header and CRC table), or None if they fail."""
    if len(region) < _HEADER.size:
        return None
    magic, flags, length, chunk, digest, stored = _HEADER.unpack_from(region)
    if magic != _MAGIC or chunk != CHUNK or digest != _key_digest(key):
        return None  # damaged, from an older format, or another key's entry
    count = -(-length // CHUNK)
    table = region[_HEADER.size : _HEADER.size + 4 * count]
    if len(table) != 4 * count:
        return None
    crcs = array.array("I")
    crcs.frombytes(table)
    return Layout(flags, length, stored, crcs)


def has_current_format(path: str) -> bool:
    """Whether the file at `path` starts as an entry of this format does (False when it
    cannot be read)."""
    try:
        with open(path, "rb") as f:
            return f.read(len(_MAGIC)) == _MAGIC
    except OSError:
        return False


def read_layout(key: str, fd: int) -> Layout | None:
    """The layout of the entry open at `fd`, or None when it is damaged or another key's.

    One pread of ALIGN bytes holds the header region of blocks up to 64 MiB; a longer CRC
    table (larger blocks) costs a second read.
    """
    region = os.pread(fd, ALIGN, 0)
    if len(region) >= _HEADER.size:
        length = _HEADER.unpack_from(region)[2]
        wanted = _HEADER.size + 4 * -(-length // CHUNK)
        if wanted > len(region) == ALIGN:
            region = os.pread(fd, wanted, 0)
    return _parse_layout(key, region)


def _verified(data: bytes | bytearray, crcs: array.array[int], first_chunk: int) -> bool:
    view = memoryview(data)
    for n, i in enumerate(range(0, len(view), CHUNK)):
        if crc32c.crc32c(view[i : i + CHUNK]) != crcs[first_chunk + n]:
            return False
    return True


def _block_from_payload(layout: Layout, payload: bytes | bytearray) -> bytes | None:
    """The verified block from its stored payload (decompressed if need be), or None."""
    if len(payload) != layout.stored:
        return None
    if layout.compressed:
        try:
            payload = lz4.block.decompress(payload, uncompressed_size=layout.length)
        except lz4.block.LZ4BlockError:
            return None
    if len(payload) != layout.length or not _verified(payload, layout.crcs, 0):
        return None
    # A bytearray serves as well as bytes (the cache never mutates a block) and saves a copy.
    return payload  # type: ignore[return-value]


def _pread_exactly(fd: int, size: int, offset: int) -> bytearray | None:
    """`size` bytes at `offset` read straight into one buffer, or None when the file is short."""
    buffer = bytearray(size)
    view = memoryview(buffer)
    done = 0
    while done < size:
        count = os.preadv(fd, [view[done:]], offset + done)
        if count == 0:
            return None  # truncated (a crash, or damaged since)
        done += count
    return buffer


def read_block(layout: Layout, fd: int) -> bytes | None:
    """The whole block of the entry open at `fd`, or None when it is damaged.

    Read into a bytes object of its own: not zeroed first, its pages touched while the read
    runs without the GIL (a zeroed buffer costs the GIL holder a page fault per 4 KiB, most of
    a small block's read). A short read, rare, is done again into one buffer.
    """
    payload: bytes | bytearray | None = os.pread(fd, layout.stored, layout.payload_offset)
    if payload is not None and len(payload) < layout.stored:
        payload = _pread_exactly(fd, layout.stored, layout.payload_offset)
    return None if payload is None else _block_from_payload(layout, payload)


def read_range(
    layout: Layout, fd: int, start: int, length: int, nowait: bool = False
) -> bytes | None:
    """Bytes [start, start+length) of an uncompressed entry's block, reading and verifying
    only the 64 KiB chunks they touch; None when the entry is damaged or truncated.

    With `nowait` the read never waits for the disk (RWF_NOWAIT: only what the page cache
    holds); it raises BlockingIOError when the bytes are not all there.
    """
    assert not layout.compressed, "a compressed entry is read whole (read_block)"
    end = min(start + length, layout.length)
    if start >= end:
        return b""
    first, last = start // CHUNK, (end - 1) // CHUNK
    # The last chunk may be short: the entry's zero padding follows it and is not payload.
    expected = min(layout.length, (last + 1) * CHUNK) - first * CHUNK
    position = layout.payload_offset + first * CHUNK
    if nowait:
        buffer = bytearray(expected)
        count = os.preadv(fd, [buffer], position, os.RWF_NOWAIT)
        if count != expected:  # part of it is on the disk only (or the file is short)
            raise BlockingIOError(errno.EAGAIN, "not all in the page cache")
        span: bytes | bytearray = buffer
    else:
        span = os.pread(fd, expected, position)
    if len(span) != expected or not _verified(span, layout.crcs, first):
        return None
    offset = start - first * CHUNK
    return bytes(span[offset : offset + end - start])


def decode(key: str, entry: bytes) -> bytes | None:
    """The block of an entry held in memory, or None when it is damaged or another key's."""
    layout = _parse_layout(key, entry)
    if layout is None:
        return None
    start = layout.payload_offset
    return _block_from_payload(layout, entry[start : start + layout.stored])


# Aligned buffers for writing entries, reused: a fresh 4 MiB buffer costs a page fault and a
# zeroed page per 4 KiB, about as much as the copy it serves. Shared by all threads, so there
# are only as many as writes ever ran at once (the cache's disk limiter bounds that).
_spare_buffers: list[mmap.mmap] = []
_spare_lock = threading.Lock()


def _take_buffer(size: int) -> mmap.mmap:
    with _spare_lock:
        buffer = _spare_buffers.pop() if _spare_buffers else None
    if buffer is None or len(buffer) < size:
        buffer = mmap.mmap(-1, _aligned(size))  # page-aligned
    return buffer


def _give_back(buffer: mmap.mmap) -> None:
    with _spare_lock:
        _spare_buffers.append(buffer)


def _open_for_write(path: str) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    try:
        return os.open(path, flags | os.O_DIRECT, 0o600)
    except OSError as exc:  # some file systems refuse O_DIRECT (tmpfs before Linux 6.6)
        if exc.errno != errno.EINVAL:
            raise
        return os.open(path, flags, 0o600)


def _copy_with_crcs(target: memoryview, data: bytes | memoryview) -> array.array[int]:
    """Copy `data` into `target` a chunk at a time, taking each chunk's CRC32C from the copy
    while it is still in the CPU's cache: one pass over the block's memory instead of two."""
    source = memoryview(data)
    crcs = array.array("I")
    for start in range(0, len(source), CHUNK):
        chunk = target[start : start + CHUNK]
        chunk[:] = source[start : start + len(chunk)]
        crcs.append(crc32c.crc32c(chunk))
    return crcs


def write_entry(path: str, key: str, data: bytes, compress: bool) -> int:
    """Write the block's entry (header region, payload, zero padding) to a new file with
    O_DIRECT; its size. The payload is copied once, into an aligned buffer, and an
    uncompressed block's CRC table is taken from that copy."""
    packed = _packed(data, compress)
    region = _region_size(len(data))
    stored = len(data) if packed is None else len(packed)
    end = region + stored
    total = _aligned(end)
    buffer = _take_buffer(total)
    try:
        with memoryview(buffer) as view:
            if packed is None:
                crcs = _copy_with_crcs(view[region:end], data)
            else:
                crcs = _crc_table(data)
                view[region:end] = packed
            flags = 0 if packed is None else _COMPRESSED
            view[:region] = _header_region(key, flags, len(data), stored, crcs)
            view[end:total] = bytes(total - end)
            _write_new_file(path, view[:total])
    finally:
        _give_back(buffer)
    return total


def _write_new_file(path: str, content: memoryview) -> None:
    """Create the file at `path` (its directory too when it went) and write `content`."""
    try:
        fd = _open_for_write(path)
    except FileNotFoundError:  # its directory was removed (an emptied cache, say)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = _open_for_write(path)
    try:
        written = 0
        while written < len(content):
            written += os.pwrite(fd, content[written:], written)
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)
