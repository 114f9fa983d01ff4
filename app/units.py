"""Byte sizes as users write them (24GiB, 24G, 23.5GB, 512MiB, 1e9), and durations (5m, 1h30m, 90)."""

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


_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"([0-9]*\.?[0-9]+)(ms|s|m|h)")


def parse_duration(text: str) -> float:
    """Seconds, from a number of seconds or Go's duration form as Ollama's keep_alive takes it
    (5m, 1h30m, 90s, 500ms). A negative value is returned as it is (keep_alive: forever)."""
    t = str(text).strip().lower()
    sign = -1.0 if t.startswith("-") else 1.0
    body = t.lstrip("+-")
    try:
        return sign * float(body)
    except ValueError:
        pass
    parts = _DURATION_PART.findall(body)
    if not body or not parts or "".join(n + u for n, u in parts) != body:
        raise SpecdeckError(f"'{text}' is not a duration", hint="write it like 300, 90s, 5m or 1h30m")
    return sign * sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
