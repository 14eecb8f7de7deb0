"""The mount options of pffs.optiontable as argparse arguments, the value types of the other
options, and `RenamedOption`, an option's old name kept working."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from pffs import optionvalues as values
from pffs.optiontable import SECTIONS, SWITCH, TRISTATE, Option, section


def argtype(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """`parse` as an argparse type: its one-line complaint becomes argparse's."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except values.BadValue as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


seconds = argtype(values.seconds)
positive_seconds = argtype(values.positive_seconds)
positive_int = argtype(values.positive_int)
size = argtype(values.size)


def add_section(parser: argparse.ArgumentParser, name: str) -> Any:
    """The table's options of section `name`, as an argument group of `parser` (returned)."""
    group = parser.add_argument_group(SECTIONS[name])
    for option in section(name):
        if option.cli:
            add_option(group, option)
    return group


def add_option(group: Any, option: Option) -> None:
    kwargs: dict[str, Any] = {"help": option.help or None}
    if option.form == SWITCH:
        kwargs |= {"action": "store_true", "default": option.default_value()}
    elif option.form == TRISTATE:
        kwargs |= {"action": argparse.BooleanOptionalAction, "default": option.default_value()}
    else:
        kwargs |= {"type": argtype(option.parse), "default": option.default_value()}
        if option.metavar:
            kwargs["metavar"] = option.metavar
    if option.name == "debug":
        # Also given before the subcommand (`pffs --debug mount`): SUPPRESS keeps that one.
        kwargs["default"] = argparse.SUPPRESS
    group.add_argument(option.flag, **kwargs)
    for old in option.renamed:
        add_renamed(group, f"--{old}", option.flag, metavar=option.metavar)


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
