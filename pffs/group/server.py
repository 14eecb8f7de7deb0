"""Serving blocks to peers: HTTP/1.1 through h11 on trio, kept-alive connections, and the
owner's side that says what is served.

Each request is checked before anything is read from the cache: its signature
(`signing.Verifier`: its form, its time, the member it is for, a replay, the HMAC), its target
(`protocol.parse_target`), and then by the block handler the mount composed
(pffs.mounting.grouping), which refuses a source this member does not mount and a principal
the request does not prove. Refusals answer 403 (421 for a source this member does not serve,
which askers remember) and are logged keyed by the peer's address (never by what a request
claims), at most one line per address and reason a minute and `REFUSAL_LOG_BURST` lines a
minute in all, so no one can flood the log. A block is sent as its handler gives it: whole, or
in pieces as the owner's store sends them (pffs.cache.pieces), its length known from the
request, then its CRC32C and the reply's tag (pffs.group.protocol, pffs.group.signing). A
failure to get the block before any byte of it answers 503 (after, the connection is closed):
the asker then fetches from the store itself. Every input is bounded: the request head (h11's
limit), a body (none is expected), the wait for a new connection's first request, the time to
send a request, idle connections, the connections of one address and of all. No request ends
more than its own connection: any error in one is counted (`pffs_group_connection_errors`) and
closes that connection, never the server.

The owner's side (`PeerBlocks.serve`, the block handler a mount composes): a block a peer asks
for comes through this mount's own cache, its version pinned: served from
memory or disk, else fetched once for every asker (the cache's single flight), from the
previous owner during a handover (pffs.group.peers), else the store. A block on its way from
the store, whoever started its fetch, is streamed to every peer request that joins it, from
its first piece (the block's flight: pffs.cache.singleflight says how); the whole
block lands in the cache as usual. Every second request for a hot block this member
owns is sent to the block's second copy (pffs.group.hot). It serves only sources this mount
mounts, as the principal the block key names and only when the request proves that principal
(pffs.group.principals: an HMAC keyed by the principal's key, 403 otherwise), so the group is
never a way around a bucket's access rules. It never believes the asker's view of the object:
the path was checked inside the source (pffs.group.protocol), the version is pinned at the
store, a block held in memory must have the length asked for, and a fetch for a peer of a
block its size makes a short last one asks the store for a byte more, so the store's own end
of that version says whether the size is the object's before the block lands in the cache: a
smaller size claimed cannot leave a shortened block under the shared key.

The assembly point (pffs.mounting, through grouping) hands it what it loads with: the mount
table, the block cache (whose flights are the blocks on their way) and the principal keys. A
load it starts runs among the cache's background tasks, in the mount's nursery: it ends with the
mount, and its errors go to the pieces its askers stream. A peer's ask goes down from here,
never back up: the cache (pffs.cache.blocks), the store (pffs.store.fetching), the backend.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial

import crc32c
import h11
import trio

from pffs.cache.blocks import BlockCache
from pffs.cache.keys import Blocks, ObjectBlocks
from pffs.cache.pieces import Pieces
from pffs.errors import PffsError
from pffs.group import protocol, signing, stats
from pffs.group.peers import Group
from pffs.group.principals import PrincipalKeys
from pffs.group.protocol import BadRequest, BlockRequest
from pffs.group.signing import Signed, Verifier
from pffs.routing.table import MountTable
from pffs.store.fetching import Store, StoreBlocks

log = logging.getLogger("pffs.group")

MAX_CONNECTIONS = 512
# Connections from one address: an asker keeps at most 32 requests at once and 16 idle
# connections per member (pffs.group.peers, pffs.group.client); room for a few mounts per node.
MAX_PER_ADDRESS = 128
FIRST_REQUEST = 5.0  # a new connection's first request must start within this
IDLE = 60.0  # an idle kept-alive connection is closed after this
REQUEST_TIME = 10.0  # a request's head must arrive within this
MAX_HEAD = protocol.MAX_TARGET + 4096
REFUSAL_LOG_EVERY = 60.0
REFUSAL_LOG_BURST = 20  # refusal lines a minute, over every address


class _Unfinished(Exception):
    """A block whose fetch failed after some of it was sent: its connection is closed."""


class Refused(Exception):
    """A request this member will not serve (logged, answered 403)."""


class NotServed(Refused):
    """A block of a source this member does not serve (not mounted here, or with another block
    size): logged, answered 421, after which askers leave this member out of that source's
    owners for a while (pffs.group.peers)."""


class AskSecond(Exception):
    """A hot block's request the owner sends to its second copy (answered 307)."""


# The block a request names: its bytes (whole, or in pieces as they arrive), or None for a
# cached-only request of a block this member does not hold; Refused for a block it may not
# serve (NotServed: 421); AskSecond for a hot block's request its second copy serves; any
# other error is a 503.
# The handler gets the request as signed (`Signed.proves` checks its principal's proof).
BlockHandler = Callable[[BlockRequest, Signed], Awaitable[bytes | Pieces | None]]
Body = bytes | Pieces


class NotTheOwnersObject(PffsError):
    """A peer's request named a size that is not the object's at the store."""


class PeerBlocks:
    def __init__(
        self,
        group: Group,
        table: MountTable,
        cache: BlockCache,
        keys: PrincipalKeys,
    ) -> None:
        self.group = group
        self.table = table
        self.cache = cache  # its flights: the blocks on their way to this mount
        self.keys = keys

    async def serve(self, request: BlockRequest, signed: Signed) -> bytes | Pieces | None:
        blocks, index = request.blocks, request.index
        store = self._store_of(blocks)
        proof_key = self.keys.key(blocks.principal, store.backend.principal_key)
        if proof_key is None:
            raise Refused("principal unprovable")  # no key of its own, no principal secret
        if not signed.proves(proof_key):
            raise Refused("principal not proven")
        key = blocks.key(index)
        if request.cached_only:  # a handover: only what this member holds now
            return await self.cache.held(key)
        if not request.forwarded and self.group.to_second(blocks, index):
            raise AskSecond(key)
        length = blocks.length(index)
        flight = self.cache.flights.get(key)
        if flight is not None:  # on its way here: whoever fetches it, the pieces so far
            return flight.stream(length)
        if key in self.cache.memory:
            return await self.cache.read(key, self._source(store, request), length)
        # Its flight registered now, so the store GET it leads to fills its pieces; loaded
        # among the cache's background tasks, in the mount's nursery: the load ends (and fills
        # the cache) whoever stops listening, and is cancelled when the mount stops.
        flight = self.cache.load_for_peer(key, self._source(store, request), length)
        if flight is None:
            # No background tasks (the mount is not serving): answered 503, as a store failure.
            raise PffsError("no background tasks to load the block in")
        return flight.stream(length)

    def _store_of(self, blocks: ObjectBlocks) -> Store:
        if blocks.block_size != self.cache.block_size:
            # A fixed reason: it labels a metric, and the asker chose the size.
            raise NotServed(f"another block size (this member's is {self.cache.block_size})")
        for mounted in self.table.mounted:
            backend = mounted.backend
            if backend.source_id == blocks.source and backend.principal == blocks.principal:
                # The store itself (it never asks the group), filling the flights it serves.
                return Store.of(mounted, arriving=self.cache.flights)
        raise NotServed("a source this member does not mount as that principal")

    def _source(self, store: Store, request: BlockRequest) -> _OwnerSide:
        return _OwnerSide(self.group, request, StoreBlocks(store, request.blocks))


class _OwnerSide:
    """The block source of a block a peer asked for (pffs.cache.keys.BlockSource): the owner's
    copy when this member is its second copy, the previous owner's during a handover, else
    the store's (Group.fetch_for_peer). A block the asker's size makes the object's last is
    asked of the store with one byte more: the store's own end says whether that size is the
    object's, in the same GET (a stat of its own cost the group scenario a fifth of its time)."""

    def __init__(self, group: Group, request: BlockRequest, store: StoreBlocks) -> None:
        self.group = group
        self.request = request
        self.store = store

    async def part(self, offset: int, length: int) -> bytes:
        request = self.request
        blocks = request.blocks
        data = await self.group.fetch_for_peer(blocks, request.index, request.forwarded)
        if data is not None:
            return data
        if offset + length == blocks.size and length < blocks.block_size:
            return await self._last_block(offset, length)
        return await self.store.part(offset, length)

    async def _last_block(self, offset: int, length: int) -> bytes:
        """The object's last `length` bytes from `offset`, as the asker's size says; refused
        (nothing lands in the cache) when the store has a byte past them, or fewer."""
        store, blocks = self.store.store, self.request.blocks
        data = await store.request(
            store.backend.read_range, blocks.path, offset, length + 1, blocks.version, ahead=False
        )
        if len(data) != length:
            stats.REFUSALS.labels(reason="size not the owner's").inc()
            raise NotTheOwnersObject(
                f"{blocks.path}: {blocks.size} bytes asked, the store's object ends elsewhere"
            )
        return data

    def run(self, first: int, count: int) -> Blocks:
        return self.store.run(first, count)


class PeerServer:
    def __init__(self, handler: BlockHandler, verifier: Verifier) -> None:
        self._handler = handler
        self._verifier = verifier
        self._connections = 0
        self._per_address: dict[str, int] = {}
        self._logged: dict[tuple[str, str], float] = {}
        self._log_window = (0.0, 0)  # (start of the current minute, lines logged in it)

    async def serve(
        self,
        listener: trio.SocketListener,
        *,
        task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        await trio.serve_listeners(partial(self._connection), [listener], task_status=task_status)

    async def _connection(self, stream: trio.SocketStream) -> None:
        peer = _address(stream)
        taken = self._per_address.get(peer, 0)
        if self._connections >= MAX_CONNECTIONS or taken >= MAX_PER_ADDRESS:
            stats.CONNECTION_ERRORS.labels(kind="over the cap").inc()
            stream.socket.close()
            return
        self._connections += 1
        self._per_address[peer] = taken + 1
        try:
            conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
            async with stream:
                wait = FIRST_REQUEST
                while await self._one_request(conn, stream, peer, wait):
                    conn.start_next_cycle()
                    wait = IDLE
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.LocalProtocolError):
            pass  # the peer went away
        except _Unfinished as exc:
            log.debug("group: a block for %s stopped mid-way: %s", peer, exc)
        except Exception as exc:  # whatever one connection did, it ends only that connection
            stats.CONNECTION_ERRORS.labels(kind=type(exc).__name__[:40]).inc()
            log.debug("group: a connection from %s failed: %r", peer, exc)
        finally:
            self._connections -= 1
            left = self._per_address[peer] - 1
            if left:
                self._per_address[peer] = left
            else:
                del self._per_address[peer]

    async def _one_request(
        self, conn: h11.Connection, stream: trio.SocketStream, peer: str, wait: float
    ) -> bool:
        """Answer one request, which must start within `wait`; whether the connection may
        carry another."""
        with trio.move_on_after(IDLE):
            try:
                request = await _read_request(conn, stream, trio.current_time() + wait)
            except h11.RemoteProtocolError:
                self._refused(peer, "malformed request")
                await _reply(conn, stream, 400, b"")
                return False
            if request is None:
                return False
            status, body, headers, tag = await self._answer(request, peer, _local(stream))
            await _reply(conn, stream, status, body, headers, tag)
            return conn.our_state is h11.DONE and conn.their_state is h11.DONE
        return False

    async def _answer(
        self, request: h11.Request, peer: str, address: str
    ) -> tuple[int, Body, list[tuple[str, str]], _Tag | None]:
        method = request.method.decode("ascii", "replace")
        target = request.target.decode("ascii", "replace")
        headers = {
            name.decode("ascii", "replace"): value.decode("latin-1")
            for name, value in request.headers
        }
        signed = self._verifier.check(method, target, headers, address)
        if isinstance(signed, Signed) and method != "GET":
            signed = "method"
        if not isinstance(signed, Signed):
            # The name a request claims is shown, never trusted: the log is keyed by address.
            claimed = "".join(c for c in headers.get("x-pffs-from", "")[:64] if c.isprintable())
            self._refused(peer, signed, f" ({claimed}?)" if claimed else "")
            # A full nonce window is this member's load, not the asker's fault: 503, which
            # sends it to the store without marking this member broken.
            return 503 if signed == signing.BUSY else 403, b"", [], None
        try:
            block_request = protocol.parse_target(target)
        except BadRequest as exc:
            self._refused(peer, str(exc))
            return 400, b"", [], None
        try:
            body = await self._handler(block_request, signed)
            if isinstance(body, Pieces) and not await body.started():
                raise body.error or RuntimeError("no bytes")
        except NotServed as exc:
            self._refused(peer, str(exc))
            return 421, b"", [], None
        except Refused as exc:
            self._refused(peer, str(exc))
            return 403, b"", [], None
        except AskSecond:
            return 307, b"", [], None
        except Exception as exc:  # the store failed it: the asker fetches it itself
            log.debug("group: block for %s failed: %s", peer, exc)
            return 503, b"", [], None
        if body is None:
            return 404, b"", [], None
        version = block_request.blocks.version
        tag = partial(self._verifier.reply_tag, signed, version)
        return 200, body, [(protocol.VERSION, version)], tag

    def _refused(self, peer: str, reason: str, claimed: str = "") -> None:
        """Counted always; logged once per address and reason a minute, and at most
        `REFUSAL_LOG_BURST` lines a minute in all."""
        stats.REFUSALS.labels(reason=reason).inc()
        now = time.monotonic()
        key = (peer, reason)
        if now - self._logged.get(key, -REFUSAL_LOG_EVERY) < REFUSAL_LOG_EVERY:
            return
        start, lines = self._log_window
        if now - start >= REFUSAL_LOG_EVERY:
            start, lines = now, 0
        if lines >= REFUSAL_LOG_BURST:
            return
        self._log_window = (start, lines + 1)
        if len(self._logged) > 1024:
            self._logged.clear()
        self._logged[key] = now
        log.warning("group: refused a request from %s%s: %s", peer, claimed, reason)


# A reply's tag from the block's length and CRC32C (pffs.group.signing.reply_tag).
_Tag = Callable[[int, int], bytes]


async def _read_request(
    conn: h11.Connection, stream: trio.SocketStream, start_by: float
) -> h11.Request | None:
    """The next request, its (empty) body read; None when the peer closed the connection, or
    sent no byte of it by `start_by`."""
    request: h11.Request | None = None
    deadline: float | None = None
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            if deadline is None and (conn.their_state is not h11.IDLE or conn.trailing_data[0]):
                deadline = trio.current_time() + REQUEST_TIME  # it has started: whole by then
            with trio.move_on_at(start_by if deadline is None else deadline) as late:
                data = await stream.receive_some(65536)
            if late.cancelled_caught:
                return None
            if deadline is None and data:
                deadline = trio.current_time() + REQUEST_TIME
            conn.receive_data(data)
            continue
        if isinstance(event, h11.Request):
            request = event
            deadline = trio.current_time() + REQUEST_TIME
        elif isinstance(event, h11.Data):
            raise h11.RemoteProtocolError("a block request has no body")
        elif isinstance(event, h11.EndOfMessage):
            return request
        elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
            return None


async def _reply(
    conn: h11.Connection,
    stream: trio.SocketStream,
    status: int,
    body: Body,
    headers: list[tuple[str, str]] | None = None,
    tag: _Tag | None = None,
) -> None:
    """The response; a block's (status 200) followed by its CRC32C and `tag` of its length
    and CRC32C (protocol.FOOTER).

    A block held whole goes out with its head and CRC32C in one gathered send (no copy of it,
    one system call and one trip through trio's scheduler where four were); a block still on
    its way goes out piece by piece as its pieces arrive, the head with the first."""
    if conn.our_state not in (h11.SEND_RESPONSE, h11.IDLE):  # IDLE: a malformed request
        return
    length = body.length if isinstance(body, Pieces) else len(body)
    if status == 200:
        length += protocol.FOOTER.size
    fields = [*(headers or []), ("content-length", str(length))]
    if status != 200:
        fields.append(("connection", "close"))
    head = conn.send(h11.Response(status_code=status, headers=fields))
    if status != 200:
        await _send(stream, [head, conn.send(h11.EndOfMessage()) or b""])
        return
    if isinstance(body, Pieces):
        crc = 0
        pending = [head]
        pieces = body.stream()
        while True:
            try:
                piece = await anext(pieces)
            except StopAsyncIteration:
                break
            except Exception as exc:  # the owner's fetch failed mid-block: close the connection
                if pending:
                    await _send(stream, pending)
                raise _Unfinished(str(exc)) from exc
            crc = crc32c.crc32c(piece, crc)
            await _send(stream, [*pending, *_framed(conn, piece)])
            pending = []
    else:
        crc = crc32c.crc32c(body)
        pending = [head, *_framed(conn, body)]
    size = length - protocol.FOOTER.size
    if tag is None:
        raise _Unfinished("a block without its tag")  # never: every 200 carries one
    footer = _framed(conn, protocol.FOOTER.pack(crc, tag(size, crc)))
    await _send(stream, [*pending, *footer, conn.send(h11.EndOfMessage()) or b""])
    stats.PEER_BYTES.labels(way="served").inc(size)


def _framed(conn: h11.Connection, data: bytes) -> list[bytes]:
    """`data` as a body's bytes on the wire, not copied (a Content-Length body: as it is)."""
    return conn.send_with_data_passthrough(h11.Data(data=data)) or []


async def _send(stream: trio.SocketStream, parts: list[bytes]) -> None:
    """Every byte of `parts`, in order, gathered into as few system calls as the socket takes."""
    views = [memoryview(part) for part in parts if part]
    while views:
        try:
            sent = await stream.socket.sendmsg(views)
        except OSError as exc:  # the peer went away, as SocketStream.send_all would say it
            raise trio.BrokenResourceError(str(exc)) from exc
        while sent:
            if sent >= len(views[0]):
                sent -= len(views.pop(0))
            else:
                views[0] = views[0][sent:]
                sent = 0


def _local(stream: trio.SocketStream) -> str:
    """This member's address the peer connected to ("" when unknown)."""
    try:
        host, *_ = stream.socket.getsockname()
    except OSError:
        return ""
    return str(host)


def _address(stream: trio.SocketStream) -> str:
    try:
        host, *_ = stream.socket.getpeername()
    except OSError:
        return "?"
    return str(host)
