"""Durations as people write them in configuration and read them in reports."""

from __future__ import annotations

import re

_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d)\s*$")
_DURATION_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(value: str | int) -> int:
    """Parse a duration such as ``"90s"``, ``"1h"`` or ``"7d"`` into milliseconds.

    Args:
        value: A string with a unit (ms, s, m, h, d) or an integer number of milliseconds.

    Returns:
        The duration in milliseconds.

    Raises:
        ValueError: If the value has no recognised unit.
    """
    if isinstance(value, int):
        return value
    match = _DURATION.match(value)
    if not match:
        raise ValueError(
            f"{value!r} is not a duration; write a number and a unit, e.g. '1h' or '90s'"
        )
    return int(match.group(1)) * _DURATION_MS[match.group(2)]


def human_duration(ms: int) -> str:
    """A duration in the largest fitting unit, e.g. `3.5h` or `2.0d`."""
    seconds = ms / 1000
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.1f}s"
