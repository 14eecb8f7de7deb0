"""A stand-in for a member asking a grouped mount's peer port, from the test process over real
sockets (http.client): a good signed request, checked as a member checks a reply, and raw
bytes of any shape. Shared by the group's hostile-input and trust tests."""

from __future__ import annotations

import http.client
import random
import socket
from dataclasses import dataclass

import crc32c

from pffs.backends import open_backend
from pffs.cache.keys import ObjectBlocks
from pffs.config import SourceConfig
from pffs.group import protocol, signing
from pffs.group.protocol import BlockRequest


@dataclass(frozen=True)
class Asker:
    """Asks member `name` at `host:port` for blocks of `blocks`, with the group's `secret` and
    the principal's `proof_key` (None: no proof)."""

    name: str
    host: str
    port: int
    secret: bytes
    blocks: ObjectBlocks
    proof_key: bytes | None

    def ask(self, target: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, str]:
        """(status, body, nonce) of one signed GET of `target` (`headers` override the
        signature's)."""
        signed = signing.sign(self.secret, "GET", target, self.name, self.proof_key)
        signed.update(headers or {})
        connection = http.client.HTTPConnection(self.host, self.port, timeout=15)
        try:
            connection.request("GET", target, headers=signed)
            response = connection.getresponse()
            return response.status, response.read(), signed[signing.NONCE]
        finally:
            connection.close()

    def block(self, index: int) -> bytes:
        """Block `index`, its CRC32C and tag checked; AssertionError on any other answer."""
        status, body, nonce = self.ask(BlockRequest(self.blocks, index).target())
        assert status == 200, status
        data, footer = body[: -protocol.FOOTER.size], body[-protocol.FOOTER.size :]
        crc, tag = protocol.FOOTER.unpack(footer)
        assert crc == crc32c.crc32c(data)
        expected = signing.reply_tag(
            self.secret, nonce, self.name, self.blocks.version, len(data), crc
        )
        assert signing.tags_match(expected, tag)
        return data

    def send_raw(self, data: bytes, wait: float = 2.0) -> bytes:
        """Send `data` on a new connection, end the sending side, and read what comes back
        until the member closes (or `wait` seconds pass)."""
        with socket.create_connection((self.host, self.port), timeout=wait) as raw:
            try:
                raw.sendall(data)
                raw.shutdown(socket.SHUT_WR)
                got = b""
                while chunk := raw.recv(65536):
                    got += chunk
            except (TimeoutError, ConnectionResetError, BrokenPipeError):
                return b""
            return got


@dataclass(frozen=True)
class OneObject:
    """One object put in the bucket, its blocks as the group names them, and its principal's
    proof key (the static S3 key's)."""

    path: str
    data: bytes
    source: str
    blocks: ObjectBlocks
    proof_key: bytes | None


def one_object(s3, bucket: str, endpoint_url: str, size: int, block_size: int) -> OneObject:
    """An object of `size` random bytes at data/f00.bin, as a member over `endpoint_url` sees it."""
    path, data = "data/f00.bin", random.Random(1).randbytes(size)
    s3.put_object(Bucket=bucket, Key=path, Body=data)
    backend = open_backend(SourceConfig(url=f"s3://{bucket}", endpoint_url=endpoint_url))
    version = s3.head_object(Bucket=bucket, Key=path)["ETag"]
    source = f"s3://{bucket}@{endpoint_url}"
    blocks = ObjectBlocks(source, backend.principal, path, version, size, block_size)
    return OneObject(path, data, source, blocks, backend.principal_key)
