"""The member list of `dns://NAME:PORT`: the A records of a name (a headless Service's name
in Kubernetes, `SERVICE.NAMESPACE.svc.cluster.local`), looked up every POLL seconds.

DNS says nothing of nodes or readiness: a member is named by its address (so a pod that comes
back on another address owns other blocks), every address owns blocks, and a Service's DNS
lists only its ready pods. Prefer `k8s://` where the API is reachable. A failed lookup is one
log line and the previous list stays.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Callable

import trio

from pffs.group.members import MAX_MEMBERS, Member, MembershipError
from pffs.workers import run_blocking

log = logging.getLogger("pffs.group")

POLL = 5.0


def members_of(addresses: list[str], port: int) -> tuple[Member, ...]:
    found = sorted({str(ipaddress.ip_address(a)) for a in addresses})
    if len(found) > MAX_MEMBERS:
        raise MembershipError(f"more than {MAX_MEMBERS} members")
    return tuple(
        Member(
            address.replace(":", "-"),
            f"http://[{address}]:{port}" if ":" in address else f"http://{address}:{port}",
        )
        for address in found
    )


class DnsMembers:
    def __init__(self, name: str, port: int) -> None:
        self.name, self.port = name, port
        self._limiter = trio.CapacityLimiter(1)

    def _resolve(self) -> list[str]:
        try:
            infos = socket.getaddrinfo(self.name, self.port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise MembershipError(f"{self.name}: {exc}") from None
        return [str(info[4][0]) for info in infos]

    async def load(self) -> tuple[Member, ...]:
        return members_of(await run_blocking(self._limiter, self._resolve), self.port)

    async def watch(self, update: Callable[[tuple[Member, ...]], None]) -> None:
        failing = False
        while True:
            try:
                members = await self.load()
            except MembershipError as exc:
                if not failing:
                    log.warning(
                        "group: members of %s: %s; keeping the previous list", self.name, exc
                    )
                failing = True
            else:
                failing = False
                update(members)
            await trio.sleep(POLL)
