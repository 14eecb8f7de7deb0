"""Who is in the group: a member list from a file, or from Kubernetes EndpointSlices.

`file:///path` holds one `NAME http://HOST:PORT` per line (blank lines and `#` comments
allowed). It is re-read when it changes; a malformed list, or one naming a member twice, is
one log line and the previous list stays. `k8s://NAMESPACE/SERVICE` is in `kubemembers`.
Every input here comes from outside the process, so each is bounded and checked.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import trio

from pffs.errors import UsageError
from pffs.optionvalues import MEMBER_NAME

log = logging.getLogger("pffs.group")

MAX_MEMBERS = 4096
MAX_FILE_BYTES = 1 << 20
# How often the member file is checked for a change.
FILE_POLL = 1.0


class MembershipError(UsageError):
    """A member list that cannot be used (the previous one is kept)."""


@dataclass(frozen=True, slots=True)
class Member:
    """One member: its name (the node name), its peer URL, and whether it owns blocks (a
    terminating Kubernetes endpoint still serves what it has but owns nothing new)."""

    name: str
    url: str
    owns: bool = True
    weight: float = 1.0


def check_name(name: str) -> str:
    if not MEMBER_NAME.match(name):
        raise MembershipError(f"member name {name[:80]!r}: letters, digits, '.', '_', '-' only")
    return name


def check_url(url: str) -> str:
    """`http://HOST:PORT`, nothing else (no path, no credentials)."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if (
        parts.scheme != "http"
        or not parts.hostname
        or port is None
        or parts.username
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
    ):
        raise MembershipError(f"member URL {url[:80]!r}: expected http://HOST:PORT")
    return f"http://{parts.netloc}"


def parse_member_list(text: str) -> tuple[Member, ...]:
    """The members a member file lists, or MembershipError saying what is wrong."""
    members: dict[str, Member] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        if len(fields) != 2:
            raise MembershipError(f"line {number}: expected NAME http://HOST:PORT")
        name, url = check_name(fields[0]), check_url(fields[1])
        if name in members:
            raise MembershipError(f"line {number}: member {name} named twice")
        if len(members) >= MAX_MEMBERS:
            raise MembershipError(f"more than {MAX_MEMBERS} members")
        members[name] = Member(name, url)
    return tuple(members.values())


def read_member_file(path: str) -> tuple[Member, ...]:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise MembershipError(f"member file {path}: {exc.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise MembershipError(f"member file {path}: larger than {MAX_FILE_BYTES} bytes")
    try:
        return parse_member_list(data.decode())
    except UnicodeDecodeError:
        raise MembershipError(f"member file {path}: not UTF-8 text") from None
    except MembershipError as exc:
        raise MembershipError(f"member file {path}: {exc}") from None


class FileMembers:
    """The member list of a file, re-read when its inode, size or mtime changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None

    def load(self) -> tuple[Member, ...]:
        """The list now (MembershipError when it cannot be used)."""
        self._seen = self._stamp()
        return read_member_file(self.path)

    def _stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    async def watch(self, update: Callable[[tuple[Member, ...]], None]) -> None:
        """Call `update` with each new list; a bad one is logged once and skipped."""
        while True:
            await trio.sleep(FILE_POLL)
            stamp = self._stamp()
            if stamp == self._seen:
                continue
            self._seen = stamp
            try:
                members = read_member_file(self.path)
            except MembershipError as exc:
                log.warning("group: %s; keeping the previous member list", exc)
                continue
            update(members)
