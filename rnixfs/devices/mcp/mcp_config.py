"""MCP server definitions: `.rnix/mcp.yaml`, the user's `mcp.yaml`, and the
project's `.mcp.json` (Claude Code's `mcpServers` format).

Precedence per server name: project `.rnix/mcp.yaml` > project `.mcp.json` >
user `$XDG_CONFIG_HOME/rnix/mcp.yaml` (docs/devices.md, "dev/mcp").
`${VAR}` in env, headers, args and url is expanded from the daemon's
environment; every expanded value is a secret the device redacts.
"""
from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ...fileio import read_config_text
from ...limits import DurationError, parse_duration

log = logging.getLogger(__name__)

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")  # ${VAR}, ${VAR:-default}
# `type` (Claude Code) or `transport`: what each spelling means
TRANSPORTS = {"stdio": "stdio", "http": "http", "streamable-http": "http", "streamable_http": "http",
              "streamableHttp": "http", "sse": "sse"}
MAX_CONFIG_BYTES = 256 * 1024
DEFAULT_CALL_TIMEOUT = 60.0
DEFAULT_IDLE_TIMEOUT = 300.0


class McpConfigError(ValueError):
    """A server entry that cannot be used; the message says which and why."""


@dataclass(frozen=True)
class ServerConfig:
    name: str
    command: str | None = None  # stdio transport
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None  # Streamable HTTP transport
    headers: dict[str, str] = field(default_factory=dict)
    timeout: float = DEFAULT_CALL_TIMEOUT
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    sse: bool = False  # the older HTTP+SSE transport (`type: sse` in .mcp.json)
    origin: str = ""
    secrets: tuple[str, ...] = ()

    @property
    def transport(self) -> str:
        return "stdio" if self.command else "sse" if self.sse else "http"

    def describe(self) -> dict:
        """What status shows: no env values, no header values, no URL userinfo."""
        d = {"transport": self.transport, "origin": self.origin, "timeout": self.timeout,
             "idle_timeout": self.idle_timeout}
        if self.command:
            d["command"] = self.command
        if self.url:
            d["url"] = strip_userinfo(self.url)
        return d


def strip_userinfo(url: str) -> str:
    return re.sub(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)[^/@]*@", r"\1", url)


def duration(value, where: str) -> float:
    """The agent.yaml duration grammar (``30s``, ``5m``, a number), above 0 and at most 24h."""
    try:
        seconds = parse_duration(value, where)
    except DurationError as exc:
        raise McpConfigError(str(exc)) from None
    if not 0 < seconds <= 86400:
        raise McpConfigError(f"{where}: duration must be between 0 and 24h")
    return seconds


class _Expander:
    def __init__(self, where: str):
        self.where = where
        self.secrets: list[str] = []

    def __call__(self, value, what: str) -> str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise McpConfigError(f"{self.where}: {what} must be a string")
        value = str(value)

        def sub(m: re.Match) -> str:
            var = m.group(1)
            if var not in os.environ and m.group(2) is not None:
                return m.group(2)  # the default is written in the file: not a secret
            if var not in os.environ:
                raise McpConfigError(f"{self.where}: {what}: environment variable {var} is not set")
            secret = os.environ[var]
            if secret:
                self.secrets.append(secret)
            return secret
        return _ENV_RE.sub(sub, value)


def parse_server(name, raw, origin: str) -> ServerConfig:
    """One server entry (both the mcp.yaml and the .mcp.json shapes)."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise McpConfigError(f"{origin}: bad server name {name!r} (want [A-Za-z0-9][A-Za-z0-9_.-]{{0,63}})")
    where = f"{origin}: server {name!r}"
    if not isinstance(raw, dict):
        raise McpConfigError(f"{where}: expected a mapping")
    known = {"command", "args", "env", "cwd", "url", "headers", "timeout", "idle_timeout", "type",
             "transport", "disabled"}
    unknown = sorted(set(map(str, raw)) - known)
    if unknown:
        log.warning("%s: ignoring unknown keys %s", where, ", ".join(unknown))
    expand = _Expander(where)
    command, url = raw.get("command"), raw.get("url")
    if (command is None) == (url is None):
        raise McpConfigError(f"{where}: give exactly one of command (stdio) or url (Streamable HTTP)")
    kind = raw.get("type", raw.get("transport"))
    transport = "stdio" if command is not None else "http"
    if kind is not None:
        transport = TRANSPORTS.get(str(kind), "")
        if not transport:
            raise McpConfigError(f"{where}: unknown transport type {kind!r} (want stdio, http or sse)")
        if (transport == "stdio") != (command is not None):
            raise McpConfigError(f"{where}: type {kind!r} needs {'command' if transport == 'stdio' else 'url'}")
    args = raw.get("args", [])
    if not isinstance(args, list):
        raise McpConfigError(f"{where}: args must be a list")
    env, headers = raw.get("env", {}) or {}, raw.get("headers", {}) or {}
    for what, value in (("env", env), ("headers", headers)):
        if not isinstance(value, dict):
            raise McpConfigError(f"{where}: {what} must be a mapping")
    cfg = ServerConfig(
        name=name,
        command=expand(command, "command") if command is not None else None,
        args=tuple(expand(a, "args") for a in args),
        env={str(k): expand(v, f"env.{k}") for k, v in env.items()},
        cwd=expand(raw["cwd"], "cwd") if raw.get("cwd") is not None else None,
        url=expand(url, "url") if url is not None else None,
        headers={str(k): expand(v, f"headers.{k}") for k, v in headers.items()},
        timeout=duration(raw.get("timeout", DEFAULT_CALL_TIMEOUT), f"{where}: timeout"),
        idle_timeout=duration(raw.get("idle_timeout", DEFAULT_IDLE_TIMEOUT), f"{where}: idle_timeout"),
        sse=transport == "sse",
        origin=origin,
        secrets=tuple(sorted(set(expand.secrets), key=len, reverse=True)),
    )
    if cfg.url is not None and not re.match(r"^https?://", cfg.url):
        raise McpConfigError(f"{where}: url must start with http:// or https://")
    if cfg.url is not None:
        m = re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://([^/@]*)@", cfg.url)
        if m and m.group(1):
            cfg = ServerConfig(**{**cfg.__dict__, "secrets": cfg.secrets + (m.group(1),)})
    return cfg


def _read(path: Path) -> str | None:
    return read_config_text(path, MAX_CONFIG_BYTES, McpConfigError)


def parse_servers(raw, origin: str) -> tuple[dict[str, ServerConfig], list[str]]:
    """A `servers:` / `mcpServers:` mapping. Bad entries are skipped with a
    reason, so one typo does not take every other server away."""
    out: dict[str, ServerConfig] = {}
    errors: list[str] = []
    if raw is None:
        return out, errors
    if not isinstance(raw, dict):
        return out, [f"{origin}: servers must be a mapping"]
    for name, entry in raw.items():
        if isinstance(entry, dict) and entry.get("disabled") is True:
            continue
        try:
            out[name] = parse_server(name, entry, origin)
        except McpConfigError as exc:
            errors.append(str(exc))
    return out, errors


def _load_file(path: Path, key: str, json_format: bool) -> tuple[dict[str, ServerConfig], list[str]]:
    text = _read(path)
    if text is None:
        return {}, []
    try:
        data = json.loads(text) if json_format else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        return {}, [f"{path}: not valid {'JSON' if json_format else 'YAML'}: {str(exc).splitlines()[0]}"]
    if data is None:
        return {}, []
    if not isinstance(data, dict):
        return {}, [f"{path}: expected a mapping with {key!r}"]
    return parse_servers(data.get(key), str(path))


def load_servers(project: Path | None, config_dir: Path) -> tuple[dict[str, ServerConfig], list[str]]:
    """Every configured server by name (project wins), and the reasons for
    entries that were skipped."""
    servers: dict[str, ServerConfig] = {}
    errors: list[str] = []
    sources = [(config_dir / "mcp.yaml", "servers", False)]
    if project is not None:
        sources += [(project / ".mcp.json", "mcpServers", True),
                    (project / ".rnix" / "mcp.yaml", "servers", False)]
    for path, key, json_format in sources:  # lowest precedence first
        found, errs = _load_file(path, key, json_format)
        servers.update(found)
        errors += errs
    for e in errors:
        log.warning("mcp: %s", e)
    return servers, errors
