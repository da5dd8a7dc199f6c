"""dev/mcp: the configured MCP servers, and one call per open `call` handle.

Kept free of pyfuse3: the adapter moves bytes; this module decides what a
write means and what a read returns (docs/devices.md, "dev/mcp").
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
from pathlib import Path

import trio

from ...kernel.errors import Code, SyscallError
from .mcp_config import ServerConfig, load_servers
from .server import McpServer

log = logging.getLogger(__name__)

MAX_ARGS_BYTES = 256 * 1024
CTL_COMMANDS = ("start", "stop", "restart")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
MAX_NAME = 255
# What a provider accepts as a function name (OpenAI: ^[a-zA-Z0-9_-]{1,64}$).
FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def qualified(server: str, tool: str) -> str:
    """The name an agent calls a tool by, as Claude Code spells it."""
    return f"mcp__{server}__{tool}"


def file_name(text: str) -> str:
    """A name safe for one path component: `/`, `%`, controls and the like
    are %-escaped, so a resource URI maps to one file and back."""
    name = _UNSAFE.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode()), text)
    if name in ("", ".", ".."):
        name = name.replace(".", "%2E") or "%00"
    if len(name) > MAX_NAME:  # keep long names apart: a digest of the whole
        digest = hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:16]
        name = name[:MAX_NAME - 17] + "~" + digest
    return name


def tool_for_file(server: McpServer, name: str) -> str:
    """The tool a `tools/<name>` directory stands for (names are escaped
    like resources, so a tool called `a/b` cannot break the listing)."""
    for tool in server.tools:
        if file_name(tool) == name:
            return tool
    return name


class McpDevices:
    """Every configured server by name, each started on first use."""

    def __init__(self, configs: dict[str, ServerConfig], nursery: trio.Nursery, *, cwd: Path,
                 errors: list[str] | None = None):
        self.servers = {name: McpServer(cfg, nursery, cwd=cwd) for name, cfg in sorted(configs.items())}
        self.errors = list(errors or [])
        self._nursery, self._cwd = nursery, cwd

    @classmethod
    def load(cls, project: Path | None, config_dir: Path, nursery: trio.Nursery, *, cwd: Path) -> "McpDevices":
        configs, errors = load_servers(project, config_dir)
        return cls(configs, nursery, cwd=cwd, errors=errors)

    def names(self) -> list[str]:
        return list(self.servers)

    def get(self, name: str) -> McpServer:
        server = self.servers.get(name)
        if server is None:
            raise SyscallError(Code.NOT_FOUND, f"no MCP server {name!r}", syscall="Open",
                               device=f"/dev/mcp/{name}")
        return server

    async def ctl(self, name: str, command: str) -> None:
        server = self.get(name)
        command = command.strip()
        if command not in CTL_COMMANDS:
            raise SyscallError(Code.INVALID, f"unknown command {command!r} (want {', '.join(CTL_COMMANDS)})",
                               syscall="Ctl", device=server.device)
        if command == "start":
            await server.start()
        elif command == "stop":
            await server.stop()
        else:
            await server.restart()

    # -- the agents' port (kernel.tools.McpPort) -----------------------------------------
    async def tool_specs(self, servers: list[str], inline: dict) -> tuple[list[dict], list[str]]:
        """Function specs ``mcp__<server>__<tool>`` of the given servers, and
        the reasons for servers that could not start (their tools are absent)."""
        specs, errors = [], []
        for name in servers:
            if name in inline and name not in self.servers:
                self.servers[name] = McpServer(inline[name], self._nursery, cwd=self._cwd)
            try:
                server = self.get(name)
                await server.start()
            except SyscallError as exc:
                errors.append(f"{name}: {exc.cause}")
                continue
            for tool in server.tools.values():
                if not FUNCTION_NAME.fullmatch(qualified(name, tool.name)):
                    # one such name would make the provider refuse every request
                    errors.append(f"{name}: tool {tool.name[:80]!r} skipped: "
                                  f"{qualified(name, tool.name)[:80]!r} is not a usable function name")
                    continue
                specs.append({"type": "function", "function": {
                    "name": qualified(name, tool.name), "description": tool.description[:1024],
                    "parameters": tool.input_schema or {"type": "object", "properties": {}}}})
        return specs, errors

    async def call_tool(self, server: str, tool: str, args: dict, limit: int) -> tuple[str, bool]:
        result = await self.get(server).call(tool, args, limit=limit)
        return result.text, result.is_error

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            for server in self.servers.values():
                with trio.move_on_after(15):
                    await server.stop()


class Incomplete(Exception):
    """The arguments so far are the start of a JSON object: wait for more."""


def parse_args(data: bytes, device: str, *, final: bool = True) -> dict:
    """One JSON object: the tool's arguments. Unless ``final``, text that is
    only cut short (the kernel splits big writes) raises Incomplete."""
    def invalid(msg: str) -> SyscallError:
        return SyscallError(Code.INVALID, msg, syscall="Call", device=device)
    if len(data) > MAX_ARGS_BYTES:
        raise SyscallError(Code.TOO_BIG, f"arguments are over {MAX_ARGS_BYTES} bytes",
                           syscall="Call", device=device)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if not final and exc.start >= len(data) - 3 and exc.reason == "unexpected end of data":
            raise Incomplete() from None
        raise invalid("arguments are not UTF-8") from None
    if not text.strip():
        return {}
    try:
        args = json.loads(text)
    except RecursionError:
        raise invalid("arguments are nested too deeply") from None
    except ValueError as exc:
        if not final and getattr(exc, "pos", 0) >= len(text.rstrip()):
            raise Incomplete() from None
        raise invalid(f"arguments are not JSON: {str(exc).splitlines()[0][:200]}") from None
    if not isinstance(args, dict):
        raise invalid(f"arguments must be a JSON object, not {type(args).__name__}")
    return args


class ToolCall:
    """One open `tools/<tool>/call`: each write is a call, reads return its
    result and then EOF. Concurrent handles never see each other's results."""

    def __init__(self, server: McpServer, tool: str, nursery: trio.Nursery):
        self.server = server
        self.tool = tool
        self.device = f"{server.device}/tools/{tool}/call"
        self._nursery = nursery
        self.buffer = b""
        self.cursor = 0
        self.running = False
        self.changed = trio.Event()
        self._scope: trio.CancelScope | None = None
        self.closed = False
        self.pending = bytearray()

    def send(self, data: bytes) -> None:
        """A write: the arguments, possibly in several pieces (the kernel
        cuts writes at 128 KiB); the call starts once they parse."""
        if self.running:
            raise SyscallError(Code.BUSY, "a call is still running; read its result first",
                               syscall="Call", device=self.device)
        self.pending += data
        self._start(final=False)

    def _start(self, *, final: bool) -> None:
        data = bytes(self.pending)
        try:
            args = parse_args(data, self.device, final=final)
        except Incomplete:
            return
        except SyscallError as exc:  # the reason is readable from the same handle
            self.pending.clear()
            self.buffer, self.cursor = f"error: {exc.cause}\n".encode(), 0
            raise
        self.pending.clear()
        if self.server.state == "ready":
            self.server.tool(self.tool)  # a tool gone after a restart: ENOENT now
        self.buffer, self.cursor, self.running = b"", 0, True
        self._nursery.start_soon(self._run, args)

    async def _run(self, args: dict) -> None:
        with trio.CancelScope() as scope:
            self._scope = scope
            try:
                result = await self.server.call(self.tool, args)
                text = result.text if not result.is_error else f"error: {result.text}"
            except SyscallError as exc:
                text = f"error: {exc.cause}\n"
            self.buffer = text.encode("utf-8")
        self.running = False
        self.changed.set()
        self.changed = trio.Event()

    def ready(self) -> bool:
        """Reading means the arguments are complete: start what is pending."""
        if self.pending and not self.running:
            try:
                self._start(final=True)
            except SyscallError as exc:
                log.warning("%s", exc)
        return not self.running

    def take(self, size: int) -> bytes:
        data = self.buffer[self.cursor:self.cursor + size]
        self.cursor += len(data)
        return data

    def close(self) -> None:
        self.closed = True
        if self._scope is not None:
            self._scope.cancel()
