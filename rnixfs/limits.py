"""Default limits of every process, in one place (README "Limits").

A request or an agent.yaml sets its own budgets; what neither sets comes
from here, so no process runs unbounded by default. ``limits.yaml`` in the
config directory overrides any default (``0`` or ``null`` turns a budget
off; the three caps on tool calls and children cannot be turned off).
Durations are written like agent.yaml's step_timeout (``30s``, ``10m``,
``1h``). Unknown keys and bad values refuse the mount with one line.
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from .config import ConfigError
from .fileio import read_config_text

LIMITS_FILE = "limits.yaml"
SHELL_TIMEOUT = 600.0  # seconds a dev/shell command may run
WORKER_NICE = 5  # worker processes run this much nicer than the daemon
SHELL_OUTPUT_BYTES = 1024 * 1024  # bytes of a dev/shell command's output kept (head and tail)
MAX_LIMITS_BYTES = 64 << 10


class LimitsError(ConfigError):
    """limits.yaml is unusable; the message is one readable line."""


class DurationError(ValueError):
    """A duration that is not one: the message is one readable line."""


MAX_DURATION = 7 * 24 * 3600  # no duration (timeout, max_time) is longer than a week
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, None: 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value, what: str = "step_timeout") -> float:
    """Seconds from ``"10m"``/``"30s"``/``"1h"``/``"500ms"``/a number; ``"0"`` = off.

    The one rule for every duration rnixfs reads: agent.yaml, spawn
    requests, limits.yaml, mcp.yaml."""
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


@dataclass(frozen=True)
class Limits:
    """Defaults for a process whose request and agent leave a budget unset.

    ``None`` means off. The caps (``max_tool_calls``, ``max_children``,
    ``max_descendants``) always apply.
    """

    max_steps: int | None = 50             # model calls per process (exit 10)
    max_tokens: int | None = None          # server-reported tokens (exit 11)
    max_cost: float | None = None          # USD from providers.yaml prices (exit 12)
    context_budget: int | None = 100_000   # ~tokens of context: compaction, then exit 13
    max_time: float | None = 3600.0        # wall-clock seconds per process (exit 14)
    step_timeout: float | None = 300.0     # heartbeat of one reply (exit 124)
    max_tool_calls: int = 16               # tool calls run per step; the rest are refused
    max_children: int = 16                 # Spawns per process over its life
    max_descendants: int = 64              # processes ever spawned below one, all levels
    workers: int | None = None             # worker processes for agent loops; None = one per core,
                                           # 0 = loops run on the daemon's own loop

    def worker_count(self) -> int:
        return (os.cpu_count() or 1) if self.workers is None else self.workers

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


DEFAULT = Limits()
_BUDGETS = ("max_steps", "max_tokens", "max_cost", "context_budget", "max_time", "step_timeout")
_CAPS = ("max_tool_calls", "max_children", "max_descendants")
_DURATIONS = ("max_time", "step_timeout")
MAX_WORKERS = 256


def parse_limits(text: str, label: str = LIMITS_FILE) -> Limits:
    """Limits from limits.yaml text (missing keys keep their default)."""
    try:
        data = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError) as exc:
        raise LimitsError(f"{label}: invalid YAML: {str(exc).splitlines()[0][:200]}") from None
    if data is None:
        return DEFAULT
    if not isinstance(data, dict):
        raise LimitsError(f"{label}: top level must be a mapping of limits")
    values: dict = {}
    for key, value in data.items():
        if key not in _BUDGETS and key not in _CAPS and key != "workers":
            raise LimitsError(f"{label}: unknown key {str(key)[:40]!r}; known: "
                              f"{', '.join(_BUDGETS + _CAPS + ('workers',))}")
        if key == "workers":
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or not 0 <= value <= MAX_WORKERS):
                raise LimitsError(f"{label}: workers must be a whole number from 0 to {MAX_WORKERS} "
                                  f"(0: agent loops run in the daemon), got {value!r}"[:200])
            values[key] = value
            continue
        if key in _DURATIONS:
            try:
                seconds = parse_duration(0 if value is None else value, key)
            except DurationError as exc:
                raise LimitsError(f"{label}: {exc}") from None
            values[key] = seconds or None
            continue
        number = (float,) if key == "max_cost" else ()
        if value is None and key in _BUDGETS:
            values[key] = None
            continue
        if isinstance(value, bool) or not isinstance(value, (int, *number)) or value < 0:
            raise LimitsError(f"{label}: {key} must be a non-negative number, got {value!r}"[:200])
        if key in _CAPS:
            if value < 1:
                raise LimitsError(f"{label}: {key} must be at least 1, got {value!r}")
            values[key] = int(value)
        else:
            values[key] = value or None
    return dataclasses.replace(DEFAULT, **values)


def load_limits(config_dir: Path) -> Limits:
    """``<config_dir>/limits.yaml``, or the defaults when there is none."""
    path = Path(config_dir) / LIMITS_FILE
    text = read_config_text(path, MAX_LIMITS_BYTES, LimitsError)
    if text is None:
        return DEFAULT
    return parse_limits(text, str(path))
