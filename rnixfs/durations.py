"""Durations as written in agent.yaml, limits.yaml, .mcp.json and spawn
requests: ``"10m"``, ``"30s"``, ``"1h"``, ``"500ms"`` or a number of
seconds; ``0`` means off. One parser for all of them."""
from __future__ import annotations

import re

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
MAX_DURATION = 7 * 24 * 3600


class DurationError(ValueError):
    """Not a duration; ``str()`` is one readable line."""


def parse_duration(value, what: str = "step_timeout") -> float:
    """Seconds from ``"10m"``/``"30s"``/``"1h"``/``"500ms"``/a number; ``"0"`` = off."""
    if isinstance(value, bool) or value is None:
        raise DurationError(f"{what} must be a duration like 30s or 10m, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION_RE.match(value)):
        seconds = float(m.group(1)) * _UNITS[m.group(2)]
    else:
        raise DurationError(f"{what} must be a duration like 30s or 10m, got {value!r}"[:200])
    if not 0 <= seconds <= MAX_DURATION:
        raise DurationError(f"{what} must be between 0 and 7 days, got {value!r}")
    return seconds
