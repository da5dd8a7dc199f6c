"""One MCP server: a lazily started session shared by every caller.

The session lives in its own task (the SDK's context managers must be
entered and left by one task). Calls from any number of callers go over the
one session concurrently: JSON-RPC requests carry ids, so replies cannot
cross. The session stops after ``idle_timeout`` without calls, restarts on
the next call after a crash (with backoff), and every call has a deadline.
The server's stderr goes to the daemon log. See docs/devices.md, "dev/mcp".
"""
from __future__ import annotations

import json
import logging
import math
import os
import shutil
import sys
import time
from collections import deque
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import trio

from ...kernel.errors import Code, SyscallError
from ..llm.redact import Redactor
from .mcp_config import ServerConfig

log = logging.getLogger(__name__)

MAX_RESULT_BYTES = 1024 * 1024  # one tool result, as text, before "[truncated]"
START_TIMEOUT = 30.0
# Wait before start N+1 after N failures in a row: the first restart is at
# once, so the call after a crash finds the server again.
BACKOFF = (0.0, 1.0, 2.0, 5.0, 10.0, 30.0)
STDERR_LINE = 4096
STDERR_TAIL = 3  # lines of a server's stderr kept to explain a failed start
# Run by path: the server gets a minimal environment (no PYTHONPATH), and
# the launcher imports nothing of rnixfs.
LAUNCHER = str(Path(__file__).with_name("launch.py"))


@dataclass
class Tool:
    name: str
    description: str
    input_schema: dict

    def schema(self) -> dict:
        """What `schema` shows; the input schema under both spellings: rnixfs's
        and MCP's own (`inputSchema`), so scripts written for either work."""
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema,
                "inputSchema": self.input_schema}


@dataclass
class CallResult:
    text: str
    is_error: bool


class McpServer:
    def __init__(self, cfg: ServerConfig, nursery: trio.Nursery, *, cwd: Path):
        self.cfg = cfg
        self.name = cfg.name
        self.device = f"/dev/mcp/{cfg.name}"
        self._nursery = nursery
        self._cwd = cwd
        self._redactor = Redactor(cfg.secrets)  # env/header values and URL userinfo
        self.state = "stopped"
        self.pid: int | None = None
        self.tools: dict[str, Tool] = {}
        self.resources: list[dict] = []
        self.prompts: list[dict] = []
        self.calls = 0
        self.inflight = 0
        self.last_error: dict | None = None
        self.started_at: float | None = None
        self.changed = trio.Event()
        self._client = None
        self._ready: trio.Event | None = None
        self._stop: trio.Event | None = None
        self._last_use = time.monotonic()
        self._failures = 0
        self._retry_at = 0.0
        self._stderr_tail: deque[str] = deque(maxlen=STDERR_TAIL)
        self._stderr_done: trio.Event | None = None

    # -- what status shows -----------------------------------------------------------
    def status(self) -> dict:
        return {
            "name": self.name, "state": self.state, **self.cfg.describe(), "pid": self.pid,
            "tools": len(self.tools), "calls": self.calls, "inflight": self.inflight,
            "started": self.started_at, "last_error": self.last_error,
        }

    def _error(self, code: Code, cause: str, syscall: str = "Call") -> SyscallError:
        return SyscallError(code, self.redact(cause), syscall=syscall, device=self.device)

    def redact(self, text: str) -> str:
        return self._redactor(text)

    def _note_error(self, cause: str) -> None:
        self.last_error = {"message": self.redact(cause), "time": time.time()}

    def _set_state(self, state: str) -> None:
        self.state = state
        self.changed.set()
        self.changed = trio.Event()

    # -- lifecycle ------------------------------------------------------------------
    async def start(self) -> None:
        """Start (or join a start in progress); raise if the server cannot serve."""
        self._last_use = time.monotonic()
        while self.state == "ready" and self._client is None:  # a session on its way out
            await self.changed.wait()
        if self.state == "ready":
            return
        if self.state != "starting":
            wait = self._retry_at - time.monotonic()
            if wait > 0:
                raise self._error(Code.DRIVER, f"server failed ({(self.last_error or {}).get('message', '?')}); "
                                  f"next start in {math.ceil(wait)}s", "Start")
            self._ready = trio.Event()
            self._stop = trio.Event()
            self._set_state("starting")
            self._nursery.start_soon(self._session)
        ready = self._ready
        assert ready is not None
        with trio.move_on_after(START_TIMEOUT + 5):
            await ready.wait()
        if self.state != "ready":
            cause = (self.last_error or {}).get("message", "server did not start")
            raise self._error(Code.DRIVER, f"server not ready: {cause}", "Start")

    async def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()
        while self.state in ("starting", "ready"):
            await self.changed.wait()

    async def restart(self) -> None:
        await self.stop()
        self._retry_at = 0.0
        await self.start()

    def _stdio(self, errlog, command: str):
        from mcp.client.stdio import StdioServerParameters, stdio_client
        params = StdioServerParameters(
            command=sys.executable,
            args=[LAUNCHER, f"--tag=rnixfs-mcp:{id(self)}",
                  command, *self.cfg.args],
            env=dict(self.cfg.env), cwd=self.cfg.cwd or str(self._cwd))
        return stdio_client(params, errlog=errlog)

    async def _session(self) -> None:
        from mcp import Client
        ready, stop = self._ready, self._stop
        assert ready is not None and stop is not None
        errlog = None
        crashed = False
        stderr_done = None
        try:
            if self.cfg.command:
                command = self._find_command()
                r, w = os.pipe()
                os.set_blocking(r, False)
                errlog = os.fdopen(w, "w")
                self._stderr_tail.clear()
                stderr_done = self._stderr_done = trio.Event()
                self._nursery.start_soon(self._pump_stderr, r, stderr_done)
                target = self._stdio(errlog, command)
            else:
                target = (_sse if self.cfg.sse else _http)(self.cfg.url, self.cfg.headers, self.cfg.timeout)
            # One scope for the start: its deadline is lifted once ready.
            with trio.CancelScope(deadline=trio.current_time() + START_TIMEOUT) as starting:
                async with Client(target, read_timeout_seconds=self.cfg.timeout, cache=None) as client:
                    if errlog is not None:
                        errlog.close()  # the server holds its own copy
                        errlog = None
                    await self._discover(client)
                    starting.deadline = math.inf
                    self._client = client
                    self.pid = _launcher_pid(f"--tag=rnixfs-mcp:{id(self)}")
                    self.started_at = time.time()
                    self._last_use = time.monotonic()
                    self._failures = 0
                    self._set_state("ready")
                    ready.set()
                    log.info("mcp %s: ready (%d tools)", self.name, len(self.tools))
                    crashed = await self._serve(stop)
                    self._client = None
            if starting.cancelled_caught:
                raise TimeoutError(f"no answer within {START_TIMEOUT:g}s of starting")
        except Exception as exc:  # noqa: BLE001 - whatever the server did, say it
            crashed = True
            cause = _describe(exc)
            if not ready.is_set() and stderr_done is not None:
                cause += await self._stderr_reason(stderr_done, errlog)
                errlog = None
            self._note_error(cause)
            log.warning("mcp %s: %s", self.name, self.redact(cause))
        finally:
            if errlog is not None:
                errlog.close()
            self.pid = None
            self._client = None
            if crashed:
                self._failures += 1
                self._retry_at = time.monotonic() + BACKOFF[min(self._failures, len(BACKOFF)) - 1]
                self._set_state("failed")
            else:
                self._set_state("stopped")
            ready.set()

    async def _serve(self, stop: trio.Event) -> bool:
        """Wait for stop, idleness, or a broken session (True: it crashed)."""
        while not stop.is_set():
            idle = self.cfg.idle_timeout - (time.monotonic() - self._last_use)
            if idle <= 0 and self.inflight == 0:
                log.info("mcp %s: idle for %gs, stopping", self.name, self.cfg.idle_timeout)
                return False
            with trio.move_on_after(min(max(idle, 0.1), 1.0)):
                await stop.wait()
            if self._client is None:  # a call saw the session break
                return True
            if self.pid is not None and not _alive(self.pid):  # died between calls
                self._note_error("server exited")
                log.warning("mcp %s: server exited", self.name)
                return True
        return False

    async def _discover(self, client) -> None:
        listed = await client.list_tools()
        tools = {}
        for t in listed.tools:
            schema = getattr(t, "input_schema", None) or getattr(t, "inputSchema", None) or {}
            if not isinstance(schema, dict):
                log.warning("mcp %s: tool %r has an invalid input schema; skipped", self.name, t.name)
                continue
            tools[t.name] = Tool(t.name, t.description or "", schema)
        self.tools = tools
        caps = client.server_capabilities
        self.resources, self.prompts = [], []
        if getattr(caps, "resources", None) is not None:
            try:
                res = await client.list_resources()
                self.resources = [{"uri": str(r.uri), "name": r.name, "mime_type": getattr(r, "mime_type", None)}
                                  for r in res.resources]
            except Exception as exc:  # noqa: BLE001 - optional capability
                log.info("mcp %s: resources/list failed: %s", self.name, self.redact(str(exc)))
        if getattr(caps, "prompts", None) is not None:
            try:
                pr = await client.list_prompts()
                self.prompts = [{"name": p.name, "description": p.description or "",
                                 "arguments": [a.model_dump(exclude_none=True) for a in (p.arguments or [])]}
                                for p in pr.prompts]
            except Exception as exc:  # noqa: BLE001 - optional capability
                log.info("mcp %s: prompts/list failed: %s", self.name, self.redact(str(exc)))

    def _find_command(self) -> str:
        """The command to run. A bare name is looked up on PATH, then beside
        the daemon's Python (a server installed into rnixfs's own environment
        works when that environment is not activated). A command that cannot
        be run fails the start with that reason (say `uvx` or `npx` not
        installed), not a bare "connection closed"."""
        command = self.cfg.command or ""
        if "/" in command:
            path = os.path.join(self.cfg.cwd or str(self._cwd), command)
            found = command if os.path.isfile(path) and os.access(path, os.X_OK) else None
        else:
            search = self.cfg.env.get("PATH", os.environ.get("PATH", os.defpath))
            found = shutil.which(command, path=search) and command
            found = found or shutil.which(command, path=os.path.dirname(sys.executable))
        if found:
            return found
        raise FileNotFoundError(f"cannot run command {command!r}: not found or not executable"
                                + ("" if "/" in command else " on PATH"))

    async def _stderr_reason(self, done: trio.Event, errlog) -> str:
        """The last lines the server wrote before a failed start, to say why."""
        if errlog is not None:
            errlog.close()
        with trio.move_on_after(2):
            await done.wait()
        tail = [line.strip() for line in self._stderr_tail if line.strip()]
        return f" (server stderr: {' | '.join(tail)[-500:]})" if tail else ""

    async def _pump_stderr(self, fd: int, done: trio.Event | None = None) -> None:
        """The server's stderr, line by line, into the daemon log."""
        stream = trio.lowlevel.FdStream(fd)
        buf = b""
        try:
            async with stream:
                while True:
                    chunk = await stream.receive_some(65536)
                    if not chunk:
                        break
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        text = self.redact(line[:STDERR_LINE].decode("utf-8", "replace"))
                        self._stderr_tail.append(text)
                        log.info("mcp %s stderr: %s", self.name, text)
                    buf = buf[-STDERR_LINE:]
            if buf.strip():  # a last line without a newline
                text = self.redact(buf.decode("utf-8", "replace"))
                self._stderr_tail.append(text)
                log.info("mcp %s stderr: %s", self.name, text)
        except (trio.ClosedResourceError, OSError):
            pass
        finally:
            if done is not None:
                done.set()

    # -- calls ------------------------------------------------------------------------
    def tool(self, name: str) -> Tool:
        tool = self.tools.get(name)
        if tool is None:
            raise self._error(Code.NOT_FOUND, f"no tool {name!r} on server {self.name!r}")
        return tool

    async def call(self, tool: str, args: dict, *, limit: int = MAX_RESULT_BYTES) -> CallResult:
        self.inflight += 1  # counted from the start: no idle stop under a waiting caller
        try:
            return await self._call(tool, args, limit)
        finally:
            self.inflight -= 1
            self._last_use = time.monotonic()

    async def _call(self, tool: str, args: dict, limit: int) -> CallResult:
        await self.start()
        self.tool(tool)
        client = self._client
        if client is None:
            raise self._error(Code.DRIVER, "server stopped")
        self.calls += 1
        try:
            with trio.fail_after(self.cfg.timeout):
                result = await client.call_tool(tool, args)
        except trio.TooSlowError:
            self._note_error(f"{tool}: no answer within {self.cfg.timeout:g}s")
            raise self._error(Code.TIMEOUT, f"{tool}: no answer within {self.cfg.timeout:g}s") from None
        except Exception as exc:  # noqa: BLE001 - the transport's failures
            cause = _describe(exc)
            self._note_error(f"{tool}: {cause}")
            if self._stop is not None and _is_broken(exc):
                self._client = None
                self._stop.set()
            raise self._error(Code.DRIVER, f"{tool}: {cause}") from None
        text = render_result(result)
        if getattr(result, "is_error", False):
            self._note_error(f"{tool}: {text[:200]}")
        return CallResult(cap(self.redact(text), limit), bool(getattr(result, "is_error", False)))

    async def read_resource(self, uri: str) -> bytes:
        await self.start()
        client = self._client
        if client is None:
            raise self._error(Code.DRIVER, "server stopped", "ReadResource")
        try:
            with trio.fail_after(self.cfg.timeout):
                res = await client.read_resource(uri)
        except trio.TooSlowError:
            raise self._error(Code.TIMEOUT, f"{uri}: no answer", "ReadResource") from None
        except Exception as exc:  # noqa: BLE001
            raise self._error(Code.DRIVER, f"{uri}: {_describe(exc)}", "ReadResource") from None
        out = bytearray()
        import base64
        for c in res.contents:
            if getattr(c, "text", None) is not None:
                out += c.text.encode()
            elif getattr(c, "blob", None) is not None:
                out += base64.b64decode(c.blob)
            if len(out) > MAX_RESULT_BYTES:
                break
        return bytes(out[:MAX_RESULT_BYTES])

    async def prompt(self, entry: dict) -> dict:
        """A prompt's arguments; its messages too when it needs none."""
        out = dict(entry)
        if any(a.get("required") for a in entry.get("arguments", [])):
            return out
        client = self._client
        if client is None:
            return out
        try:
            with trio.fail_after(self.cfg.timeout):
                got = await client.get_prompt(entry["name"], {})
        except Exception as exc:  # noqa: BLE001 - shown, not fatal
            out["error"] = self.redact(_describe(exc))
            return out
        out["messages"] = [{"role": m.role, "content": getattr(m.content, "text", None)
                            or m.content.model_dump(exclude_none=True)} for m in got.messages]
        return out


def render_result(result) -> str:
    """Text content as text; structured content as JSON when the result has
    no text (servers that send both send the same thing twice)."""
    parts = []
    for c in getattr(result, "content", []) or []:
        kind = getattr(c, "type", "")
        if kind == "text":
            parts.append(c.text)
        elif kind == "resource":
            res = c.resource
            parts.append(getattr(res, "text", None) or f"[resource {getattr(res, 'uri', '')}]")
        else:
            parts.append(f"[{kind} content, {len(str(getattr(c, 'data', '')))} bytes]")
    structured = getattr(result, "structured_content", None)
    if not parts and structured is not None:
        return json.dumps(structured, ensure_ascii=False, indent=2) + "\n"
    text = "\n".join(parts)
    return text if text.endswith("\n") or not text else text + "\n"


def cap(text: str, limit: int) -> str:
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", "ignore") + f"\n[truncated: {len(data)} bytes, cap {limit}]\n"


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:500] if text else type(exc).__name__


def _is_broken(exc: BaseException) -> bool:
    import anyio
    if isinstance(exc, BaseExceptionGroup):
        return any(_is_broken(e) for e in exc.exceptions)
    return isinstance(exc, (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream,
                            ConnectionError, EOFError)) or "closed" in str(exc).lower()


def _alive(pid: int) -> bool:
    import psutil
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _launcher_pid(tag: str) -> int | None:
    """The launcher's pid (the server's parent, in the same process group)."""
    import psutil
    for child in psutil.Process().children():
        try:
            if tag in child.cmdline():
                return child.pid
        except psutil.Error:
            continue
    return None


@asynccontextmanager
async def _http(url: str, headers: dict[str, str], timeout: float):
    """Streamable HTTP with the configured headers; the HTTP client is ours to close."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client
    async with httpx2.AsyncClient(headers=dict(headers), timeout=timeout) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            yield streams


@asynccontextmanager
async def _sse(url: str, headers: dict[str, str], timeout: float):
    """The older HTTP+SSE transport, for `.mcp.json` entries of `type: sse`."""
    from mcp.client.sse import sse_client
    async with sse_client(url, headers=dict(headers), timeout=timeout) as streams:
        yield streams
