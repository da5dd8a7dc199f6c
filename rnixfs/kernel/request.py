"""Parsing a proc/new write into a spawn request (README.md, "proc/new").

One write is one request: plain text (the whole text is the intent), or a
JSON object / YAML mapping with an ``intent`` key plus options. A YAML
mapping without ``intent`` is plain text; a JSON object without it is an
error, because nobody writes braces by accident.
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field

import yaml

from .. import limits
from .errors import Code, SyscallError

MAX_REQUEST_BYTES = 64 * 1024
WRITE_BLOCK = 4096  # st_blksize of proc/new: what stdio and bash flush at
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
OPTIONS = (
    "intent", "agent", "provider", "model", "max_steps", "max_tokens",
    "max_cost", "step_timeout", "skills", "cwd", "env", "max_time", "context_budget",
)


@dataclass
class SpawnRequest:
    intent: str
    agent: str | None = None
    provider: str | None = None
    model: str | None = None
    max_steps: int | None = None
    max_tokens: int | None = None
    max_cost: float | None = None
    step_timeout: float | None = None  # 0 = off
    skills: list[str] = field(default_factory=list)
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    max_time: float | None = None  # wall-clock seconds; 0 = off
    context_budget: int | None = None


def framing(data: bytes, last_write: int) -> str:
    """When the pending bytes of a proc/new handle form a request.

    One write() is one request (README.md, "proc/new"), except where a writer is
    known to cut one request into several writes:
    - stdio and bash flush a full buffer of st_blksize (4 KiB) bytes, so a
      write of a whole number of buffers not ending in a newline goes on;
    - a JSON object goes on until it parses (bash writes `echo` line by line);
    - a YAML mapping of request options may go on over more lines, so it
      completes when the handle is read or closed ("later").
    Returns "now", "more" or "later".
    """
    full_buffers = last_write % WRITE_BLOCK == 0
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        cut = exc.reason == "unexpected end of data" and exc.end == len(data)
        return "more" if cut and full_buffers else "now"
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            json.loads(stripped)
        except json.JSONDecodeError as exc:
            if exc.msg.startswith("Unterminated string") or exc.pos >= len(stripped):
                return "more"
        except RecursionError:
            pass  # parse() says why
        return "now"
    if full_buffers and not text.endswith("\n"):
        return "more"
    mapping = _yaml_mapping(stripped)
    if mapping and all(k in OPTIONS for k in mapping) and "\x00" not in text:
        return "later"
    return "now"


def invalid(msg: str) -> SyscallError:
    return SyscallError(Code.INVALID, msg, syscall="Spawn", device="/proc/new")


def parse_duration(value, what: str) -> float:
    """Seconds from a number or "10m"/"30s"/"1h"/"500ms"; "0" means off
    (the same rule as agent.yaml's step_timeout)."""
    try:
        return limits.parse_duration(value, what)
    except limits.DurationError as exc:
        raise invalid(str(exc)) from None


def parse(data: bytes) -> SpawnRequest:
    if len(data) > MAX_REQUEST_BYTES:
        raise SyscallError(
            Code.TOO_BIG, f"request is {len(data)} bytes; the cap is {MAX_REQUEST_BYTES}",
            syscall="Spawn", device="/proc/new",
        )
    if b"\x00" in data:
        raise invalid("request contains a NUL byte")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid(f"request is not UTF-8 (byte {exc.start})") from None
    if not text.strip():
        raise invalid("empty request: write an intent, or a JSON/YAML object with \"intent\"")
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            obj = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise invalid(f"bad JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
        except RecursionError:
            raise invalid("bad JSON: nested too deeply") from None
        if not isinstance(obj, dict):
            raise invalid("a JSON request must be an object")
        if "intent" not in obj:
            raise invalid('JSON request has no "intent"')
        return _from_mapping(obj)
    obj = _yaml_mapping(stripped)
    if obj is not None and "intent" in obj:
        return _from_mapping(obj)
    return SpawnRequest(intent=stripped)


# libyaml's safe loader when PyYAML has it: ten times faster on a request
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.lru_cache(maxsize=8)
def _yaml_mapping(text: str) -> dict | None:
    """The text as a YAML mapping, or None. Cached: ``framing`` and ``parse``
    look at the same request one after the other (callers only read it)."""
    if ":" not in text:
        return None
    try:
        obj = yaml.load(text, Loader=_YAML_LOADER)
    except (yaml.YAMLError, RecursionError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def _name(obj: dict, key: str) -> str | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise invalid(f'{key} must be a name like "code-analyst" (letters, digits, . _ -), got {value!r}'[:200])
    return value


def _positive_int(obj: dict, key: str, top: int) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= top:
        raise invalid(f"{key} must be a whole number from 1 to {top}, got {value!r}"[:200])
    return value


def _from_mapping(obj: dict) -> SpawnRequest:
    unknown = sorted(str(k) for k in obj if k not in OPTIONS)
    if unknown:
        raise invalid(f"unknown option {unknown[0]!r}; known: {', '.join(OPTIONS)}"[:300])
    intent = obj["intent"]
    if not isinstance(intent, str) or not intent.strip():
        raise invalid("intent must be non-empty text")
    req = SpawnRequest(intent=intent.strip())
    req.agent = _name(obj, "agent")
    req.provider = _name(obj, "provider")
    model = obj.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip() or len(model) > 200):
        raise invalid("model must be a non-empty name of at most 200 characters")
    req.model = model
    req.max_steps = _positive_int(obj, "max_steps", 10_000)
    req.max_tokens = _positive_int(obj, "max_tokens", 100_000_000)
    cost = obj.get("max_cost")
    if cost is not None:
        if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not 0 <= cost <= 1e6:
            raise invalid(f"max_cost must be a number of dollars from 0 to 1000000, got {cost!r}"[:200])
        req.max_cost = float(cost)
    if obj.get("step_timeout") is not None:
        req.step_timeout = parse_duration(obj["step_timeout"], "step_timeout")
    if obj.get("max_time") is not None:
        req.max_time = parse_duration(obj["max_time"], "max_time")
    req.context_budget = _positive_int(obj, "context_budget", 100_000_000)
    skills = obj.get("skills")
    if skills is not None:
        if isinstance(skills, str):
            skills = [s.strip() for s in skills.split(",") if s.strip()]
        if not isinstance(skills, list) or len(skills) > 64:
            raise invalid("skills must be a list of at most 64 names")
        req.skills = [_name({"skill": s}, "skill") for s in skills]
    cwd = obj.get("cwd")
    if cwd is not None:
        if not isinstance(cwd, str) or not cwd or len(cwd) > 4096 or "\x00" in cwd:
            raise invalid("cwd must be a path inside the project")
        req.cwd = cwd
    env = obj.get("env")
    if env is not None:
        if not isinstance(env, dict) or len(env) > 256:
            raise invalid("env must be a mapping of at most 256 variables")
        for k, v in env.items():
            if not isinstance(k, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$", k):
                raise invalid(f"env name {k!r} is not a valid variable name"[:200])
            if not isinstance(v, (str, int, float)) or isinstance(v, bool):
                raise invalid(f"env value of {k} must be text")
        req.env = {k: str(v) for k, v in env.items()}
    return req
