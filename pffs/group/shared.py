"""A shared tier: blocks kept in an S3-compatible store near the compute, for every mount.

The group's second form (`--shared-cache s3://BUCKET/PREFIX`): instead of asking peers, a miss
looks in the shared store before the origin, and after a fetch from the origin the block is
written there in the background. A block object is named by the block key: a digest of (source,
principal, path, version, block size), then the index. It starts with a header carrying the
format, the block's length, index, a digest of the version, a CRC32C of the bytes, and a MAC of
all of them and the object's name, keyed by the tier's secret (`--shared-cache-secret-file`:
`tier_key`); all are checked on read, and any mismatch, a missing object or any failure of the
shared store is a miss (the origin serves the block, and it is written again). Whoever can
write the tier's bucket but holds no tier secret can therefore replace a block only by one
that is refused: the CRC32C covers the bytes, the MAC the CRC32C, so the MAC costs one HMAC over
the header, never the block. Whoever holds the secret, or can read the bucket, is inside the
tier's one trust domain (docs/SECURITY.md). A missing object is first claimed (`claims`): the
mount that claims it fetches it from the origin and writes it, while the others wait for it to
appear, so mounts missing one block at once fetch it from the origin once. The shared store is
any pffs backend that reads ranges and takes PUTs, composed by pffs.mounting with its own
endpoint and credentials. The writes run among the mount's background tasks (`Background`,
handed in by the assembly point: the block cache's), so an unmount waits for them a while, then
cancels them.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import logging
import struct
import tempfile
from collections.abc import Awaitable, Callable
from typing import Protocol

import crc32c
import trio

from pffs.cache.keys import ObjectBlocks
from pffs.errors import NotFound
from pffs.flow.permits import Priority, SourceFlow
from pffs.group import stats
from pffs.group.claims import WAIT, Claims
from pffs.workers import run_blocking

log = logging.getLogger("pffs.group")

MAGIC = b"PFFSBLK2"
# magic, CRC32C of the bytes, length, index, sha256 of the version, MAC of those and the name
HEADER = struct.Struct(">8sIQQ32s16s")
_MAC_SIZE = 16
_KEY_DOMAIN = b"pffs shared tier key v1"
# Blocks waiting to be written at once; past it a block is not written (a later miss writes it)
# unless this mount claimed it: other mounts are waiting for that one.
MAX_PENDING = 64
# How often a mount waiting for a block another mount claimed looks for it: from the first
# pause, growing by half each time, to the last.
POLL_FIRST, POLL_LAST = 0.01, 0.1


# Runs a task among the mount's background tasks (pffs.cache.blocks.BlockCache.background);
# False when the mount runs none (nothing started).
Background = Callable[[Callable[[], Awaitable[None]]], bool]


class SharedStore(Protocol):
    """What the shared tier needs of a store (a pffs backend and its writer)."""

    def read_range(self, path: str, start: int, length: int, version: str | None) -> bytes: ...

    def put(self, path: str, local_path: str) -> object: ...


def object_name(blocks: ObjectBlocks, index: int) -> str:
    # The principal too: a mount never reads a block another principal's mount wrote.
    key = "\0".join(
        (blocks.source, blocks.principal, blocks.path, blocks.version, str(blocks.block_size))
    )
    return f"{hashlib.sha256(key.encode()).hexdigest()}/{index}"


def tier_key(secret: bytes) -> bytes:
    """The key of the tier's MACs, from the secret its mounts share."""
    return hmac.new(secret, _KEY_DOMAIN, hashlib.sha256).digest()


def _mac(key: bytes, name: str, fields: bytes) -> bytes:
    message = name.encode("utf-8", "surrogateescape") + b"\0" + fields
    return hmac.new(key, message, hashlib.sha256).digest()[:_MAC_SIZE]


def pack(key: bytes, blocks: ObjectBlocks, index: int, data: bytes) -> bytes:
    version = hashlib.sha256(blocks.version.encode()).digest()
    fields = HEADER.pack(MAGIC, crc32c.crc32c(data), len(data), index, version, b"")
    mac = _mac(key, object_name(blocks, index), fields[:-_MAC_SIZE])
    return fields[:-_MAC_SIZE] + mac + data


def unpack(key: bytes, blocks: ObjectBlocks, index: int, raw: bytes) -> tuple[bytes | None, str]:
    """The block in `raw` when every field matches and the MAC is the tier's; else None and
    why."""
    length = blocks.length(index)
    if len(raw) != HEADER.size + length:
        return None, "wrong length"
    magic, crc, stored_length, stored_index, version, mac = HEADER.unpack_from(raw)
    if magic != MAGIC or stored_length != length or stored_index != index:
        return None, "not this block"
    if version != hashlib.sha256(blocks.version.encode()).digest():
        return None, "another version"
    expected = _mac(key, object_name(blocks, index), raw[: HEADER.size - _MAC_SIZE])
    if not hmac.compare_digest(expected, mac):
        return None, "not authenticated"
    data = raw[HEADER.size :]
    if crc32c.crc32c(data) != crc:
        return None, "CRC32C mismatch"
    return data, ""


class SharedTier:
    """A block source (pffs.group.sources) over a shared store."""

    def __init__(
        self,
        store: SharedStore,
        prefix: str,
        flow: SourceFlow,
        key: bytes,
        claims: Claims | None = None,
        *,
        background: Background,
    ) -> None:
        self.store = store
        self.background = background  # where its writes run: the mount's nursery
        self.key = key  # tier_key: the MACs of its objects
        self.prefix = prefix.strip("/")
        # The shared store's request permits (pffs.flow.permits), its claims' included: reads
        # and claims are a reader's, the copies of blocks no other mount waits for written
        # behind.
        self.flow = flow
        self.claims = claims
        self._pending = 0
        self._warned: set[str] = set()

    def _name(self, blocks: ObjectBlocks, index: int) -> str:
        name = object_name(blocks, index)
        return f"{self.prefix}/{name}" if self.prefix else name

    def asks(self, blocks: ObjectBlocks, index: int) -> bool:
        return True

    async def fetch_block(
        self, blocks: ObjectBlocks, index: int, priority: Priority = "reader"
    ) -> bytes | None:
        """The block from the tier; else None, after waiting for it when another mount
        claimed it. Each None is counted by why the origin serves it. (`priority` is not
        used: the tier's reads take its store's reader permits, pffs.flow.permits.)"""
        name = self._name(blocks, index)
        if self._mine(name):
            return self._origin("claimed already")  # this mount is fetching it already
        try:
            return await self._read(blocks, index) or self._origin("read failed or damaged")
        except NotFound:
            pass
        if self.claims is None:
            return self._origin("no claims")
        outcome = await self.claims.claim(name)
        if outcome == "failed":
            return self._origin("claim failed")
        if outcome == "won":
            # The block may have landed, and its claim gone, between the look above and this
            # claim: look once more (the tier is near) before the origin.
            with contextlib.suppress(NotFound):
                data = await self._read(blocks, index, coming=True)
                if data is not None:
                    await self.claims.release(name)
                    return data
            return self._origin("claimed")  # written when it lands, whatever the writes pending
        started = trio.current_time()
        try:
            return await self._wait(blocks, index, started + WAIT)
        finally:
            stats.TIER_WAITS.observe(trio.current_time() - started)

    async def _wait(self, blocks: ObjectBlocks, index: int, deadline: float) -> bytes | None:
        """The block another mount claimed, once it is in the tier; None past `deadline`."""
        pause = POLL_FIRST
        while trio.current_time() + pause < deadline:
            await trio.sleep(pause)
            pause = min(pause * 1.5, POLL_LAST)
            stats.TIER_POLLS.inc()
            with contextlib.suppress(NotFound):
                return await self._read(blocks, index, coming=True) or self._origin(
                    "read failed or damaged"
                )
        stats.FALLBACKS.labels(reason="claimed block late").inc()
        return self._origin("waited too long")

    @staticmethod
    def _origin(reason: str) -> None:
        stats.TIER_ORIGIN.labels(reason=reason).inc()
        return None

    async def _read(self, blocks: ObjectBlocks, index: int, coming: bool = False) -> bytes | None:
        """The block object checked; NotFound when absent or short (a store whose PUTs are not
        atomic, s3rver, shows it short while it is written: it is claimed, or waited for, as
        an absent one; counted as damaged unless it is `coming`), None when it cannot be
        used."""
        length = HEADER.size + blocks.length(index)
        try:
            raw = await run_blocking(
                self.flow.permit("reader"),
                self.store.read_range,
                self._name(blocks, index),
                0,
                length,
                None,
            )
        except NotFound:
            raise
        except Exception as exc:  # failing: the origin serves it
            self._once(f"read failed: {exc}")
            stats.FALLBACKS.labels(reason="shared tier failed").inc()
            return None
        if len(raw) < length:
            if not coming:
                self._damaged(blocks, index, "wrong length")
            raise NotFound(self._name(blocks, index))
        data, why = unpack(self.key, blocks, index, raw)
        if data is None:
            self._damaged(blocks, index, why)
            return None
        stats.PEER_BYTES.labels(way="received").inc(len(data))
        return data

    def landed(self, blocks: ObjectBlocks, index: int, data: bytes) -> None:
        name = self._name(blocks, index)
        if self._pending >= MAX_PENDING and not self._mine(name):
            stats.TIER_WRITES.labels(outcome="dropped").inc()
            return
        body = pack(self.key, blocks, index, data)
        if not self.background(functools.partial(self._write, name, body, len(data))):
            stats.TIER_WRITES.labels(outcome="dropped").inc()
            return
        self._pending += 1

    async def _write(self, name: str, body: bytes, length: int) -> None:
        # Other mounts wait for a block this one claimed: it does not queue behind the rest.
        permit = self.flow.permit("reader" if self._mine(name) else "write_behind")
        try:
            await run_blocking(permit, self._put, name, body)
            stats.PEER_BYTES.labels(way="served").inc(length)
            stats.TIER_WRITES.labels(outcome="written").inc()
            if self.claims is not None:
                await self.claims.release(name)  # the block is there: its claim has served
        except Exception as exc:  # the block stays out of the tier: a later miss writes it
            stats.TIER_WRITES.labels(outcome="failed").inc()
            self._once(f"write failed: {exc}")
        finally:
            self._pending -= 1

    def _mine(self, name: str) -> bool:
        return self.claims is not None and self.claims.mine(name)

    def _put(self, name: str, body: bytes) -> None:
        with tempfile.NamedTemporaryFile(prefix="pffs-shared-") as f:
            f.write(body)
            f.flush()  # read back by the upload: no need to reach the disk
            self.store.put(name, f.name)

    def _damaged(self, blocks: ObjectBlocks, index: int, why: str) -> None:
        self._once(f"{self._name(blocks, index)}: {why}; read from the origin")
        stats.FALLBACKS.labels(reason=why).inc()

    def _once(self, message: str) -> None:
        """One log line per kind of trouble (the counters keep the rest)."""
        kind = message.split(":", 1)[-1][:60]
        if kind not in self._warned and len(self._warned) < 64:
            self._warned.add(kind)
            log.warning("shared cache: %s", message)

    def close(self) -> None:
        pass
