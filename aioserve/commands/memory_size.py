"""Memory sizes as people write them: ``2GiB``, ``512MiB``, ``1.5GB``, ``1073741824``,
or a fraction of free memory (``0.9``, ``90%``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3,
          "gb": 1000**3, "t": 1000**4, "tb": 1000**4, "kib": 1024, "mib": 1024**2,
          "gib": 1024**3, "tib": 1024**4}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z%]*)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class MemoryBudget:
    """A budget in bytes, or a fraction (0 < f <= 1) of the free memory at start."""

    bytes: int | None = None
    fraction: float | None = None


def parse_memory(text: str) -> MemoryBudget:
    """Parse ``text``: a size with an optional unit (B, KB/MB/GB/TB powers of 1000,
    KiB/MiB/GiB/TiB powers of 1024), or a fraction of free memory written ``0.9`` or
    ``90%``.

    Raises:
        ValueError: not a size, zero, or a fraction above 1.
    """
    match = _PATTERN.match(text)
    if match is None or match.group(2).lower() not in {*_UNITS, "%"}:
        raise ValueError(
            f"not a memory size: {text!r} (write e.g. 2GiB, 512MiB, 0.9 or 90%)")
    number, unit = float(match.group(1)), match.group(2).lower()
    if unit == "%" or (unit == "" and number < 1 and "." in match.group(1)):
        fraction = number / 100 if unit == "%" else number
        if not 0 < fraction <= 1:
            raise ValueError(f"a fraction of free memory must be in (0, 1], got {text!r}")
        return MemoryBudget(fraction=fraction)
    size = int(number * _UNITS[unit])
    if size <= 0:
        raise ValueError(f"memory size must be positive, got {text!r}")
    return MemoryBudget(bytes=size)

