"""The mount options of pffs.optiontable as argparse arguments, the value types of the other
options, and `RenamedOption`, an option's old name kept working."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pffs import optionvalues as values
from pffs.optiontable import SECTIONS, Option, add_argument, argtype, section

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
    kwargs: dict[str, Any] = {}
    if option.name == "debug":
        # Also given before the subcommand (`pffs --debug mount`): SUPPRESS keeps that one.
        kwargs["default"] = argparse.SUPPRESS
    add_argument(group, option, **kwargs)
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
