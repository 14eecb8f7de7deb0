"""The member list of `k8s://NAMESPACE/SERVICE`: the EndpointSlices of a headless Service over
the pffs node pods (discovery.k8s.io/v1), polled through the project's small API client
(pffs.kube).

A member is named by its endpoint's `nodeName`, so a pod restarted on the same node keeps
owning the blocks its cache holds; its URL is the endpoint's first address and the slice's
port named `peer` (else its first port). Only ready endpoints own blocks; a terminating one
that still serves (`serving` true) stays a member that owns nothing, so peers can still fetch
what it holds while it drains. A failed poll is one log line and the previous list stays.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

import trio

from pffs.group.members import MAX_MEMBERS, Member, MembershipError, check_name
from pffs.kube import KubeClient, KubeError
from pffs.workers import run_blocking

log = logging.getLogger("pffs.group")

POLL = 5.0


def members_of(slices: list[dict[str, Any]]) -> tuple[Member, ...]:
    """The members the EndpointSlices name (MembershipError for a malformed slice)."""
    found: dict[str, Member] = {}
    for item in slices:
        ports = item.get("ports") or []
        if not isinstance(ports, list) or not ports:
            continue
        named = [p for p in ports if isinstance(p, dict) and p.get("name") == "peer"]
        port = (named or ports)[0].get("port") if isinstance((named or ports)[0], dict) else None
        if not isinstance(port, int) or not 0 < port < 65536:
            raise MembershipError("an EndpointSlice port is not a number")
        for endpoint in item.get("endpoints") or []:
            member = _member(endpoint, port)
            if member is None:
                continue
            known = found.get(member.name)
            if known is None or (member.owns and not known.owns):
                found[member.name] = member
            if len(found) > MAX_MEMBERS:
                raise MembershipError(f"more than {MAX_MEMBERS} members")
    return tuple(sorted(found.values(), key=lambda m: m.name))


def _member(endpoint: Any, port: int) -> Member | None:
    if not isinstance(endpoint, dict):
        return None
    conditions = endpoint.get("conditions") or {}
    ready = conditions.get("ready") is not False  # unset means ready (the API's rule)
    serving = conditions.get("serving", ready) is not False
    if not serving:
        return None
    node, addresses = endpoint.get("nodeName"), endpoint.get("addresses")
    if not isinstance(node, str) or not isinstance(addresses, list) or not addresses:
        return None
    address = addresses[0]
    if not isinstance(address, str) or not re.fullmatch(r"[0-9A-Fa-f.:]{2,45}", address):
        return None
    host = f"[{address}]" if ":" in address else address
    terminating = conditions.get("terminating") is True
    return Member(check_name(node), f"http://{host}:{port}", owns=ready and not terminating)


class KubeMembers:
    """The members a headless Service's EndpointSlices list, polled every POLL seconds."""

    def __init__(self, namespace: str, service: str, client: KubeClient) -> None:
        self.namespace, self.service = namespace, service
        self.client = client
        self._limiter = trio.CapacityLimiter(1)

    async def load(self) -> tuple[Member, ...]:
        slices = await run_blocking(
            self._limiter, self.client.list_endpoint_slices, self.namespace, self.service
        )
        return members_of(slices)

    async def watch(self, update: Callable[[tuple[Member, ...]], None]) -> None:
        failing = False
        while True:
            try:
                members = await self.load()
            except (KubeError, MembershipError) as exc:
                if not failing:
                    log.warning(
                        "group: members of %s/%s: %s; keeping the previous list",
                        self.namespace,
                        self.service,
                        exc,
                    )
                failing = True
            else:
                failing = False
                update(members)
            await trio.sleep(POLL)
