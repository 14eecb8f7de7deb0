"""The peer protocol's messages: what names a block on the wire, and what a reply must carry.

A request is
`GET /v3/block?s=SOURCE&a=PRINCIPAL&p=PATH&v=VERSION&i=INDEX&n=SIZE&b=BLOCK_SIZE[&c=1][&f=1]`:
the block key (the source id, which carries the bucket and endpoint, and the digest of the
principal the asker reads it as: a member serves only a source it mounts as that same
principal, so the group never hands one principal's bytes to another), the object's size and
the group's block size (so the owner cuts the object into the same blocks), `c=1` to ask only
for a block the member holds (the handover from a previous owner), `f=1` for a request a hot
block's second copy sends its owner (pffs.group.hot: never redirected). A reply of 307 says:
ask the block's second copy. A reply of 200 carries the block's `x-pffs-version`, a
Content-Length of the block's length and 4, then the block, sent as the owner gets it (it may
still be on its way from the owner's store), then its CRC32C (big-endian) and the reply's tag
(`FOOTER`; pffs.group.signing.reply_tag): the asker checks all four before it uses the block.
A path is a source-relative one: never absolute, never with an empty, `.` or `..` part (an
owner reads what it names as the principal it names; it must not name anything outside the
source).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from urllib.parse import unquote_plus, urlencode

import crc32c

from pffs.cache.keys import ObjectBlocks

PATH = "/v3/block"
VERSION = "x-pffs-version"
FOOTER = struct.Struct(">I16s")  # the block's CRC32C and the reply's tag, after its last byte
MAX_TARGET = 8192
MAX_FIELDS = 10


class BadRequest(ValueError):
    """A request target that names no block."""


@dataclass(frozen=True, slots=True)
class BlockRequest:
    blocks: ObjectBlocks
    index: int
    cached_only: bool = False
    forwarded: bool = False  # from a hot block's second copy: served, never sent on

    def target(self) -> str:
        b = self.blocks
        query = {
            "s": b.source,
            "a": b.principal,
            "p": b.path,
            "v": b.version,
            "i": self.index,
            "n": b.size,
        }
        query["b"] = b.block_size
        if self.cached_only:
            query["c"] = 1
        if self.forwarded:
            query["f"] = 1
        return f"{PATH}?{urlencode(query)}"

    @property
    def length(self) -> int:
        return self.blocks.length(self.index)


def parse_target(target: str) -> BlockRequest:
    """The block a request target names, or BadRequest."""
    if len(target) > MAX_TARGET:
        raise BadRequest("target too long")
    path, _, query = target.partition("?")
    if path != PATH:
        raise BadRequest("unknown path")
    # The query split by hand, as urllib's parse_qs splits it (a field without "=" has an
    # empty value; "+" and %XX decoded, and only where they occur): an owner parses one per
    # block, and parse_qs's general path was 2% of its Python time in the group scenario.
    fields: dict[str, str] = {}
    for field in query.split("&"):
        if not field:
            continue
        if len(fields) == MAX_FIELDS:
            raise BadRequest("too many fields")
        name, _, value = field.partition("=")
        name, value = _decoded(name), _decoded(value)
        if name in fields:
            raise BadRequest("repeated field")
        fields[name] = value
    try:
        source, principal = fields["s"], fields["a"]
        path, version = fields["p"], fields["v"]
        index, size, block_size = int(fields["i"]), int(fields["n"]), int(fields["b"])
    except (KeyError, ValueError):
        raise BadRequest("missing or malformed field") from None
    if (
        not source
        or not principal
        or block_size <= 0
        or size <= 0
        or not 0 <= index < -(-size // block_size)
    ):
        raise BadRequest("no such block")
    if not _relative(path):
        raise BadRequest("not a path inside the source")
    blocks = ObjectBlocks(source, principal, path, version, size, block_size)
    return BlockRequest(blocks, index, fields.get("c") == "1", fields.get("f") == "1")


def _decoded(text: str) -> str:
    return unquote_plus(text) if "%" in text or "+" in text else text


def _relative(path: str) -> bool:
    """Whether `path` names something inside a source: not absolute, no empty, `.` or `..`
    part, no NUL."""
    if "\0" in path:
        return False
    return all(part not in ("", ".", "..") for part in path.split("/"))


def footer(data: bytes | memoryview, tag: bytes) -> bytes:
    """What follows a block of `data` in a reply whose tag is `tag`."""
    return FOOTER.pack(crc32c.crc32c(data), tag)
