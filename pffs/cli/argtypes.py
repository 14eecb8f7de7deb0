"""The value types of `pffs`'s options: each turns one option's text into its value, or
says in one line what is wrong with it; and `RenamedOption`, an option's old name kept working.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from pffs.config import INDEFINITE_TTL
from pffs.sizes import SizeError, parse_size


def mode(text: str) -> int:
    try:
        value = int(text, 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an octal mode like 644") from None
    if not 0 <= value <= 0o7777:
        raise argparse.ArgumentTypeError(f"{text!r} is not a mode between 0 and 7777")
    return value


def number_in(low: float, high: float, what: str) -> Callable[[str], float]:
    """An argparse type for a float with low <= value < high."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not low <= value < high:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return value

    return parse


seconds = number_in(0, float("inf"), "a number of seconds")
ratio = number_in(0, 1, "a fraction between 0 and 1")
positive_seconds = number_in(0.001, float("inf"), "a positive number of seconds")


def metadata_ttl(text: str) -> float:
    return INDEFINITE_TTL if text.strip().lower() == "indefinite" else seconds(text)


def size(text: str) -> int:
    try:
        return parse_size(text)
    except SizeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def count_up_to(high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not text.isdigit() or int(text) > high:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from 0 to {high}")
        return int(text)

    return parse


def on_off(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"{text!r} is not on or off")
    return lowered == "on"


class RenamedOption(argparse.Action):
    """The old name of a renamed option: it still works, and says once on stderr what to use."""

    def __init__(self, option_strings: list[str], dest: str, new: str, **kwargs: Any) -> None:
        self.new = new
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        renamed(option_string or self.option_strings[0], self.new)
        setattr(namespace, self.dest, values)


def renamed(old: str, new: str) -> None:
    """The one-line notice of a deprecated name (an option, a command, a key)."""
    sys.stderr.write(f"pffs: {old} is deprecated and will be removed, use {new}\n")


def add_renamed(group: Any, old: str, new: str, **kwargs: Any) -> None:
    """Keep `old`, the former name of option `new` (added before to `group`), working."""
    action = next(a for a in group._group_actions if new in a.option_strings)
    group.add_argument(
        old,
        dest=action.dest,
        type=action.type,
        action=RenamedOption,
        new=new,
        help=argparse.SUPPRESS,
        **kwargs,
    )
