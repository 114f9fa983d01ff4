"""Byte sizes as users write them: 24GiB, 24G, 23.5GB, 512MiB, 1e9."""

from __future__ import annotations

import re

from app.errors import SpecdeckError

_UNITS = {
    "": 1, "b": 1,
    "k": 1024, "kib": 1024, "kb": 1000,
    "m": 1024**2, "mib": 1024**2, "mb": 1000**2,
    "g": 1024**3, "gib": 1024**3, "gb": 1000**3,
    "t": 1024**4, "tib": 1024**4, "tb": 1000**4,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    m = _SIZE.match(text)
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS:
        raise SpecdeckError(f"'{text}' is not a size", hint="write it like 24GiB, 23.5GB, 512MiB or a number of bytes")
    value = float(m.group(1)) * _UNITS[unit]
    if value <= 0:
        raise SpecdeckError(f"size '{text}' must be positive")
    if unit in ("", "b") and value < 1024**2:
        raise SpecdeckError(f"'{text}' is {int(value)} bytes", hint=f"did you mean {text.strip()}GiB?")
    return int(value)


def fmt_gib(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB"
