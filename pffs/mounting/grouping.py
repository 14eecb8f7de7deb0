"""Joining a mount to its cache group or shared tier (pffs.group): the parts composed over
this mount.

`open_group` reads the secret, binds the peer port (a port in use is a one-line error before
the mount serves) and reads the first member list; `JoinedGroup.run` serves peers and follows
the member list while the mount serves. The server's block handler (pffs.group.server)
is this mount's own read path: the block cache (its single flight, so one fetch serves every
asker) over the store of the source the block names, version pinned, so an owner fetches a
block once for the whole group, streamed to the askers as it arrives. It serves only sources
this mount mounts: the source id in the key carries the bucket and endpoint, so the group is
never a way around a bucket's access rules. The group, as the tier joined
(`JoinedGroup.tier`), is handed to the VFS, whose reads put it before each object's store
(pffs.store.fetching). `asking_group` is the same group for `pffs warmup` on a member: it asks
the owners, so each owner loads its own blocks from the store once, and the group fills in
parallel. `open_shared` joins the group's second form instead, a shared tier over a store of
its own, after checking whether that store honours `If-None-Match: *` (pffs.group.claims).
"""

from __future__ import annotations

import functools
import logging
import os
import socket
from collections.abc import Callable

import trio

from pffs.backends import open_backend
from pffs.backends.base import Backend, WritableBackend, writable
from pffs.cache.blocks import BlockCache
from pffs.cache.keys import ObjectBlocks
from pffs.cache.singleflight import SingleFlight
from pffs.config import GroupConfig, MembersDns, MembersFile, SharedCacheConfig, SourceConfig
from pffs.errors import PffsError, UsageError
from pffs.flow.permits import SourceFlow
from pffs.group import claims
from pffs.group.claims import Claims
from pffs.group.client import PeerClient, ProofKey
from pffs.group.dnsmembers import DnsMembers
from pffs.group.kubemembers import KubeMembers
from pffs.group.members import FileMembers
from pffs.group.peers import Group
from pffs.group.principals import PrincipalKeys
from pffs.group.server import PeerBlocks, PeerServer
from pffs.group.shared import Background, SharedTier, tier_key
from pffs.group.signing import Verifier, read_secret
from pffs.group.sources import Joined, member_order, shuffled_order
from pffs.kube import KubeClient, KubeError
from pffs.optionvalues import host_port
from pffs.routing.table import MountTable

log = logging.getLogger("pffs.group")


class JoinedGroup:
    def __init__(
        self,
        group: Group,
        server: PeerServer,
        listening: socket.socket,
        members: FileMembers | KubeMembers | DnsMembers,
        arriving: SingleFlight,
    ) -> None:
        self.group = group
        # What the mount's reads ask before the store, and the flights its store fills piece
        # by piece (the peer server's handler streams them).
        self.tier = Joined(group, arriving, self._preload_order)
        self.server = server
        self._listening = listening
        self._members = members

    def _preload_order(self, count: int) -> list[int]:
        members = [member.name for member in self.group.placement.members]
        return member_order(self.group.self_name, members, count)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve peers and follow the member list until cancelled."""
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(self._listening))
        async with trio.open_nursery() as nursery:
            await nursery.start(self.server.serve, listener)
            nursery.start_soon(self._members.watch, self.group.update)
            task_status.started()

    def close(self) -> None:
        self.group.close()
        self._listening.close()


def open_group(config: GroupConfig, table: MountTable, cache: BlockCache) -> JoinedGroup:
    secret = read_secret(config.secret_file)
    keys = _principal_keys(config)
    client = PeerClient(secret, config.self_name, proof_key=_proof_key(table, keys))
    group = Group(config.self_name, client, handover=config.handover)
    members = _member_source(config)
    if isinstance(members, FileMembers):
        group.update(members.load())
    blocks = PeerBlocks(group, table, cache, keys)
    server = PeerServer(blocks.serve, Verifier(secret, config.self_name))
    listening = _bind(config.listen)
    log.info("group: %s serving peers on %s", config.self_name, config.listen)
    # The store's blocks fill their flights piece by piece: a peer's ask joins any of them.
    return JoinedGroup(group, server, listening, members, cache.flights)


def _principal_keys(config: GroupConfig) -> PrincipalKeys:
    option = "--group-principal-secret-file"
    path = config.principal_secret_file
    return PrincipalKeys(None if path is None else read_secret(path, option))


def _proof_key(table: MountTable, keys: PrincipalKeys) -> ProofKey:
    """The key proving the principal of a block this process reads: that of the source it
    mounts as that principal (pffs.group.principals)."""

    def proof_key(blocks: ObjectBlocks) -> bytes | None:
        for mounted in table.mounted:
            backend = mounted.backend
            if backend.source_id == blocks.source and backend.principal == blocks.principal:
                return keys.key(backend.principal, backend.principal_key)
        return None

    return proof_key


async def asking_group(config: GroupConfig, table: MountTable) -> Group:
    """The group of a mount as a process that only asks (`pffs warmup` on a member, reading
    the sources of `table`): its members now, no server: warmup puts it before the store, so
    it asks the blocks' owners."""
    proof_key = _proof_key(table, _principal_keys(config))
    client = PeerClient(read_secret(config.secret_file), config.self_name, proof_key=proof_key)
    group = Group(config.self_name, client, handover=config.handover)
    members = _member_source(config)
    group.update(members.load() if isinstance(members, FileMembers) else await members.load())
    return group


def open_shared(config: SharedCacheConfig, mountpoint: str, background: Background) -> Joined:
    """The shared tier joined, its store checked now (a one-line error before the mount
    serves), its writes run by `background` (the mount's). The node's name and the mountpoint
    tell this mount from the others sharing the tier (they seed the order its dataset preload
    walks a listing in)."""
    key = tier_key(read_secret(config.secret_file, "--shared-cache-secret-file"))
    source = SourceConfig(url=config.url, endpoint_url=config.endpoint_url, profile=config.profile)
    backend = open_backend(source)
    writer = writable(backend)
    if writer is None:
        raise UsageError(f"--shared-cache {config.url}: the store takes no writes")
    try:
        backend.check()
    except PffsError as exc:
        raise type(exc)(f"--shared-cache {config.url}: {exc}") from None
    store = _SharedStore(backend, writer)
    try:
        conditional = claims.probe(store, "")
    except PffsError as exc:
        raise type(exc)(f"--shared-cache {config.url}: {exc}") from None
    flow = SourceFlow(backend.max_concurrency)  # the shared store's requests (pffs.flow)
    tier = SharedTier(store, "", flow, key, Claims(store, conditional, flow), background=background)
    log.info(
        "shared cache: blocks in %s; claims %s",
        backend.source_id,
        "with If-None-Match" if conditional else "read back (the store ignores If-None-Match)",
    )
    name = f"{os.environ.get('NODE_NAME') or socket.gethostname()}:{mountpoint}"
    return Joined(tier, preload_order=functools.partial(shuffled_order, name))


class _SharedStore:
    """A backend and its writer as the shared tier's store."""

    def __init__(self, backend: Backend, writer: WritableBackend) -> None:
        self.read_range = backend.read_range
        self.put = writer.put
        self.delete = writer.delete
        # S3's writer (the one --shared-cache takes) writes an object only where none is.
        self.put_new: Callable[[str, bytes], bool] = writer.put_new  # type: ignore[attr-defined]


def _member_source(config: GroupConfig) -> FileMembers | KubeMembers | DnsMembers:
    """What follows the member list, by the kind of source the config parsed."""
    source = config.members
    if isinstance(source, MembersFile):
        return FileMembers(source.path)
    if isinstance(source, MembersDns):
        return DnsMembers(source.name, source.port)
    try:
        return KubeMembers(source.namespace, source.service, KubeClient.from_url(config.kube_api))
    except KubeError as exc:
        raise UsageError(f"--group-members {source}: {exc}") from None


def _bind(address: str) -> socket.socket:
    host, port = host_port(address)  # checked when the option was read
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise PffsError(f"--group-listen {address}: {exc.strerror}") from None
    return sock
