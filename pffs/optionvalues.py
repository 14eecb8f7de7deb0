"""The value parsers of mount options: each turns one option's text into its value, or raises
`BadValue` saying in one line, starting with the text itself, what is wrong with it.

Every front end parses with these (through pffs.optiontable): the CLI, mount(8)'s `-o`, the
CSI volume attributes and Fluid's options, so a value means the same wherever it is written.

The one boolean rule: `true`, `yes`, `on`, `1` and `false`, `no`, `off`, `0`, in any case;
anything else is refused, the empty text included. A front end whose syntax has a bare key
(`-o ro`, Fluid's `allow-other` with no value) hands "true" for it; an empty CSI attribute is
one not given.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from urllib.parse import urlsplit

from pffs.config import INDEFINITE_TTL, MemberSource, parse_member_source
from pffs.sizes import SizeError, parse_size

TRUE_WORDS = ("true", "yes", "on", "1")
FALSE_WORDS = ("false", "no", "off", "0")


class BadValue(ValueError):
    """Text that is not a value of its option; the message says what was expected."""


def boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in TRUE_WORDS:
        return True
    if lowered in FALSE_WORDS:
        return False
    raise BadValue(f"{text!r} is not true or false")


def size(text: str) -> int:
    try:
        return parse_size(text)
    except SizeError as exc:
        raise BadValue(str(exc)) from None


def size_between(low: int, high: int, what: str) -> Callable[[str], int]:
    """A parser of a size with low <= value <= high."""

    def parse(text: str) -> int:
        value = size(text)
        if not low <= value <= high:
            raise BadValue(f"{text!r} is not {what}")
        return value

    return parse


# Bytes of files preloaded in flight: none would be no preload (`--preload off` says that).
positive_size = size_between(1, 1 << 62, "a size above 0 (to load nothing ahead: --preload off)")

# A cache block (pffs.cache.keys): under 64K the requests per byte dominate; over 64M one block
# holds the memory tier's room for a dozen readers.
block_size = size_between(64 << 10, 64 << 20, "a block size from 64K to 64M")


def mode(text: str) -> int:
    try:
        value = int(text, 8)
    except ValueError:
        raise BadValue(f"{text!r} is not an octal mode like 644") from None
    if not 0 <= value <= 0o7777:
        raise BadValue(f"{text!r} is not a mode between 0 and 7777")
    return value


def number_in(low: float, high: float, what: str) -> Callable[[str], float]:
    """A parser of a float with low <= value < high."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not low <= value < high:
            raise BadValue(f"{text!r} is not {what}")
        return value

    return parse


seconds = number_in(0, float("inf"), "a number of seconds")
# A handover of a cache group (pffs.group.placement): up to a day.
handover_seconds = number_in(
    0, math.nextafter(86400, math.inf), "a number of seconds from 0 to 86400"
)
ratio = number_in(0, 1, "a fraction between 0 and 1")
positive_seconds = number_in(0.001, float("inf"), "a positive number of seconds")


def metadata_ttl(text: str) -> float:
    return INDEFINITE_TTL if text.strip().lower() == "indefinite" else seconds(text)


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise BadValue(f"{text!r} is not a positive integer")
    return int(text)


def count_up_to(high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not text.isdigit() or int(text) > high:
            raise BadValue(f"{text!r} is not a whole number from 0 to {high}")
        return int(text)

    return parse


whole_number = count_up_to(1 << 31)
any_id = count_up_to((1 << 32) - 1)


def text(value: str) -> str:
    return value


def one_of(*choices: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if value not in choices:
            raise BadValue(f"{value!r} is not one of {', '.join(choices)}")
        return value

    return parse


def host_port(text: str) -> tuple[str, int]:
    """`HOST:PORT` ([::1]:PORT for IPv6) -> (host, port). `:PORT` is 127.0.0.1, as for every
    listener (docs/SECURITY.md): every interface is asked for by name, `0.0.0.0:PORT`."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise BadValue(f"{text!r} is not HOST:PORT (like 127.0.0.1:9567)")
    return host.strip("[]") or "127.0.0.1", int(port)


def listen_address(text: str) -> str:
    """An address to listen on, checked (`host_port` reads it when the listener opens)."""
    host_port(text)
    return text


# A Kubernetes name (RFC 1123 label): a namespace's or a Service's.
MEMBER_FORMS = {"file": "file:///PATH", "k8s": "k8s://NAMESPACE/SERVICE", "dns": "dns://NAME:PORT"}


def member_source(text: str) -> MemberSource:
    """Where a cache group's member list comes from, by its URL's scheme."""
    source = parse_member_source(text)
    if source is None:
        forms = ", ".join(MEMBER_FORMS.values())
        scheme = urlsplit(text).scheme
        raise BadValue(f"{text!r} is not {MEMBER_FORMS.get(scheme, forms)}")
    return source


# A member's name in its group (a node's name; pffs.group.members reads lists by it too).
MEMBER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}\Z")


def member_name(text: str) -> str:
    if not MEMBER_NAME.match(text):
        raise BadValue(f"{text[:80]!r} is not a member name: letters, digits, '.', '_', '-' only")
    return text


def s3_prefix(text: str) -> str:
    """`s3://BUCKET[/PREFIX]`: where a shared tier keeps its blocks."""
    if not text.startswith("s3://") or not text.removeprefix("s3://").split("/", 1)[0]:
        raise BadValue(f"{text!r} is not s3://BUCKET/PREFIX")
    return text
