"""Sizes as people write them ('4M', '512MiB', '100G'): one parser for argv, volume attributes
and the bench."""

from __future__ import annotations

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class SizeError(ValueError):
    """Text that is not a size; the message says what was expected."""


def parse_size(text: str) -> int:
    """'4M', '512MiB', '100G', '1.5g' or plain bytes."""
    cleaned = text.strip().lower().removesuffix("ib").removesuffix("b")
    unit = cleaned[-1:] if cleaned[-1:] in _UNITS and cleaned[-1:] else ""
    number = cleaned[: len(cleaned) - len(unit)]
    try:
        value = int(float(number) * _UNITS[unit])
    except ValueError:
        raise SizeError(f"{text!r} is not a size like 4M, 512MiB or 100G") from None
    if value < 0:
        raise SizeError(f"{text!r} is negative")
    return value
