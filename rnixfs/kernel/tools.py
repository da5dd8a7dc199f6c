"""The agent's tools, each a sequence of traced syscalls on a device.

Read/Write/Edit/Glob/Grep go through the workspace device (``/dev/fs``),
Bash through the shell device (``/dev/shell``) — the same code the mount
uses — and Spawn/Wait through the kernel. A denied or failing call is a
SyscallError in the trace and an ``error: …`` text the model sees; the
process goes on.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import threading

import trio

from .errors import Code, SyscallError
from .process import Process
from .request import SpawnRequest
from .trace import quote

log = logging.getLogger(__name__)

RESULT_CAP = 16 * 1024  # bytes of one tool result the model sees
READ_CAP = 256 * 1024  # bytes a Read takes from a file before it truncates
EDIT_CAP = 16 * 1024 * 1024  # an Edit never writes back a cut file
BASH_TIMEOUT = 120.0
BASH_TIMEOUT_MAX = 3600.0
SEARCH_TIMEOUT = 60.0  # seconds a Glob or Grep may walk before it ends truncated

_S = {"type": "string"}
_I = {"type": "integer"}
SPECS = {
    "Read": ("Read a text file of the workspace.",
             {"path": _S, "offset": _I, "limit": _I}, ["path"]),
    "Write": ("Create or replace a file of the workspace with the given content.",
              {"path": _S, "content": _S}, ["path", "content"]),
    "Edit": ("Replace exactly one occurrence of old_string with new_string in a file.",
             {"path": _S, "old_string": _S, "new_string": _S}, ["path", "old_string", "new_string"]),
    "Glob": ("List workspace files matching a glob pattern (e.g. **/*.py).", {"pattern": _S}, ["pattern"]),
    "Grep": ("Search workspace files for a regular expression; optional glob limits the files.",
             {"pattern": _S, "glob": _S}, ["pattern"]),
    "Bash": ("Run a shell command in the workspace; returns its output and exit status.",
             {"command": _S, "timeout": _I}, ["command"]),
    "Spawn": ("Start a child agent process with an intent; returns its PID.",
              {"intent": _S, "agent": _S}, ["intent"]),
    "Wait": ("Wait for a child process to exit; returns its exit line and result.", {"pid": _I}, ["pid"]),
}
NAMES = tuple(SPECS)


def schemas(allowed: list[str]) -> list[dict]:
    """OpenAI function specs of the tools a process may call."""
    names = [n for n in NAMES if not allowed or n in allowed]
    return [{"type": "function", "function": {
        "name": n, "description": SPECS[n][0],
        "parameters": {"type": "object", "properties": SPECS[n][1], "required": SPECS[n][2]}}}
        for n in names]


def answer_schema(allowed: list[str]) -> dict:
    """The JSON a schema-constrained model must answer with (weak models)."""
    names = [n for n in NAMES if not allowed or n in allowed]
    return {
        "type": "object",
        "properties": {"tool": {"type": "string", "enum": [*names, "answer"]},
                       "arguments": {"type": "object"}},
        "required": ["tool", "arguments"],
    }


def cap(text: str, limit: int = RESULT_CAP) -> str:
    data = text.encode()
    if len(data) <= limit:
        return text
    cut = data[:limit].decode("utf-8", "ignore")
    return cut + f"\n[truncated: {len(data) - len(cut.encode())} more bytes not shown]"


class ToolError(Exception):
    """A tool refused its arguments: shown to the model, traced as INVALID."""


def _arg(args: dict, key: str, kind=str, required: bool = True):
    value = args.get(key)
    if value is None:
        if required:
            raise ToolError(f'missing argument "{key}"')
        return None
    if kind is int and isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ToolError(f'argument "{key}" must be {"text" if kind is str else "a whole number"}')
    return value


class Tools:
    """Runs tool calls for processes of one kernel."""

    def __init__(self, kernel, workspace, shell, *, mount: str = "", env: dict | None = None):
        self.kernel = kernel
        self.ws = workspace
        self.shell = shell
        self.mount = mount
        self.env = dict(os.environ if env is None else env)  # without provider keys

    async def call(self, proc: Process, name: str, args) -> str:
        tracer = self.kernel.tracer
        if not isinstance(args, dict):
            args = {}
        if name not in SPECS:
            err = SyscallError(Code.INVALID, f"unknown tool {name[:40]!r}; tools: {', '.join(NAMES)}",
                               syscall="Tool", pid=proc.pid)
            tracer.emit(proc, "Tool", quote(name), f"-1 {err}", dur_ms=0, error=err)
            return f"error: {err.cause}"
        if proc.allowed_tools and name not in proc.allowed_tools:
            err = SyscallError(Code.PERMISSION,
                               f"{name} is not allowed (allowed tools: {', '.join(proc.allowed_tools)})",
                               syscall=name, pid=proc.pid, device=_DEVICE.get(name, ""))
            tracer.emit(proc, name, _summary(args), f"-1 {err}", dur_ms=0, error=err)
            return f"error: permission denied: {err.cause}"
        try:
            return cap(await getattr(self, "_" + name.lower())(proc, args))
        except ToolError as exc:
            err = SyscallError(Code.INVALID, str(exc), syscall=name, pid=proc.pid)
            tracer.emit(proc, name, _summary(args), f"-1 {err}", dur_ms=0, error=err)
            return f"error: {exc}"
        except SyscallError as exc:  # already traced by the syscall that failed
            return f"error: {exc.cause}"

    # -- workspace ---------------------------------------------------------------------
    def relative(self, path: str) -> str:
        """Models like absolute paths: /dev/fs/x, $RNIX_MOUNT/dev/fs/x and the
        project's own absolute path all name workspace-relative x."""
        prefixes = ["/dev/fs/"]
        if self.mount:
            prefixes.append(self.mount.rstrip("/") + "/dev/fs/")
        prefixes.append(str(self.kernel.project).rstrip("/") + "/")
        for prefix in prefixes:
            if path.startswith(prefix):
                return path[len(prefix):] or "."
        if path in ("/dev/fs", str(self.kernel.project)):
            return "."
        return path

    async def _open(self, proc: Process, rel: str, mode: str):
        rel = self.relative(rel)
        device = f"/dev/fs/{rel}"
        async with self.kernel.tracer.syscall(proc, "Open", f"{quote(device)}, {mode}", device=device) as c:
            path = await trio.to_thread.run_sync(self.ws.resolve, rel)
            fd = proc.alloc_fd(f"/dev/fs/{path}")
            c.result = f"FD({fd})"
        return fd, path

    async def _close(self, proc: Process, fd: int) -> None:
        async with self.kernel.tracer.syscall(proc, "Close", f"FD({fd})"):
            proc.fds.pop(fd, None)

    async def _read(self, proc: Process, args: dict) -> str:
        rel = _arg(args, "path")
        offset = _arg(args, "offset", int, required=False) or 0
        limit = _arg(args, "limit", int, required=False)
        fd, path = await self._open(proc, rel, "O_RDONLY")
        try:
            async with self.kernel.tracer.syscall(proc, "Read", f"FD({fd})", device=f"/dev/fs/{path}") as c:
                data, truncated = await trio.to_thread.run_sync(self.ws.read_file, path, READ_CAP)
                c.result = f"{len(data)} bytes" + (" (truncated)" if truncated else "")
        finally:
            await self._close(proc, fd)
        text = data.decode("utf-8", "replace")
        if offset or limit:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[offset: offset + limit if limit else None])
        return text + (f"\n[truncated: file is larger than {READ_CAP} bytes]" if truncated else "")

    async def _write(self, proc: Process, args: dict) -> str:
        rel, content = _arg(args, "path"), _arg(args, "content")
        fd, path = await self._open(proc, rel, "O_WRONLY|O_CREAT|O_TRUNC")
        data = content.encode()
        try:
            async with self.kernel.tracer.syscall(proc, "Write", f"FD({fd}), {len(data)} bytes",
                                                  device=f"/dev/fs/{path}") as c:
                await trio.to_thread.run_sync(self.ws.write_file, path, data)
                c.result = str(len(data))
        finally:
            await self._close(proc, fd)
        return f"wrote {len(data)} bytes to {path}"

    async def _edit(self, proc: Process, args: dict) -> str:
        rel, old, new = _arg(args, "path"), _arg(args, "old_string"), _arg(args, "new_string")
        if not old:
            raise ToolError("old_string must not be empty")
        fd, path = await self._open(proc, rel, "O_RDWR")
        device = f"/dev/fs/{path}"
        try:
            async with self.kernel.tracer.syscall(proc, "Read", f"FD({fd})", device=device) as c:
                data, truncated = await trio.to_thread.run_sync(self.ws.read_file, path, EDIT_CAP)
                c.result = f"{len(data)} bytes"
            if truncated:
                raise ToolError(f"{path} is larger than {EDIT_CAP} bytes: too large to edit")
            text = data.decode("utf-8")
            count = text.count(old)
            if count != 1:
                raise ToolError(f"old_string occurs {count} times in {path}; it must occur exactly once"
                                + (" (add surrounding lines to make it unique)" if count else ""))
            out = text.replace(old, new, 1).encode()
            async with self.kernel.tracer.syscall(proc, "Write", f"FD({fd}), {len(out)} bytes",
                                                  device=device) as c:
                await trio.to_thread.run_sync(self.ws.write_file, path, out)
                c.result = str(len(out))
        except UnicodeDecodeError:
            raise ToolError(f"{path} is not UTF-8 text") from None
        finally:
            await self._close(proc, fd)
        return f"edited {path}: replaced 1 occurrence"

    async def _glob(self, proc: Process, args: dict) -> str:
        pattern = self.relative(_arg(args, "pattern"))
        async with self.kernel.tracer.syscall(proc, "Glob", quote(pattern), device="/dev/fs") as c:
            matches = await _search(self.ws.glob, pattern, 1000)
            c.result = f"{len(matches)} matches" + (" (timeout)" if _timed_out(matches) else "")
        return ("\n".join(matches) if matches else "(no matches)") + _stopped(matches)

    async def _grep(self, proc: Process, args: dict) -> str:
        pattern, glob = _arg(args, "pattern"), _arg(args, "glob", required=False) or "**"
        async with self.kernel.tracer.syscall(proc, "Grep", f"{quote(pattern)}, {quote(glob)}",
                                              device="/dev/fs") as c:
            hits = await _search(self.ws.grep, pattern, self.relative(glob), 500)
            c.result = f"{len(hits)} matches" + (" (timeout)" if _timed_out(hits) else "")
        return ("\n".join(f"{rel}:{n}: {line}" for rel, n, line in hits) if hits else "(no matches)"
                ) + _stopped(hits)

    # -- shell ---------------------------------------------------------------------------
    async def _bash(self, proc: Process, args: dict) -> str:
        command = _arg(args, "command")
        timeout = _arg(args, "timeout", int, required=False) or BASH_TIMEOUT
        timeout = min(max(1, timeout), BASH_TIMEOUT_MAX)
        tracer = self.kernel.tracer
        async with tracer.syscall(proc, "Open", '"/dev/shell", O_RDWR', device="/dev/shell") as c:
            fd = proc.alloc_fd("/dev/shell")
            c.result = f"FD({fd})"
        try:
            async with tracer.syscall(proc, "Write", f"FD({fd}), {quote(command)}", device="/dev/shell") as c:
                c.result = str(len(command.encode()))
            env = {**self.env, **proc.env, "RNIX_PID": str(proc.pid), "RNIX_MOUNT": self.mount}
            cwd = self.kernel.project / await trio.to_thread.run_sync(self.ws.resolve, proc.cwd)
            hosts: list[int] = []

            def started(host_pid: int) -> None:
                hosts.append(host_pid)
                self.kernel.host_pids[host_pid] = proc.pid

            try:
                async with tracer.syscall(proc, "Read", f"FD({fd})", device="/dev/shell") as c:
                    res = await self.shell.run(command, cwd=cwd, env=env, timeout=timeout,
                                               output_limit=RESULT_CAP, on_start=started)
                    status = f"exit={res.exit_code}" if res.signal is None else f"signal={res.signal}"
                    c.result = f"{len(res.output)} bytes {status}" + (" timeout" if res.timed_out else "") \
                        + (f" sandbox={res.sandbox}" if getattr(res, "sandbox", "") else "")
            finally:
                for h in hosts:
                    self.kernel.host_pids.pop(h, None)
        finally:
            await self._close(proc, fd)
        text = res.output.decode("utf-8", "replace")
        noeol = bool(text) and not text.endswith("\n")
        # the same status trailer a dev/shell user reads: [exit N signal=… timeout …]
        return text + ("\n" if noeol else "") + res.trailer(noeol=noeol).decode().rstrip("\n")

    # -- processes -----------------------------------------------------------------------
    async def _spawn(self, proc: Process, args: dict) -> str:
        intent = _arg(args, "intent")
        agent = _arg(args, "agent", required=False)
        async with self.kernel.tracer.syscall(proc, "Spawn", f"{quote(intent)}, agent={agent or 'default'}",
                                              device="/proc/new") as c:
            child = await self.kernel.spawn(SpawnRequest(intent=intent, agent=agent), ppid=proc.pid)
            c.result = f"PID({child.pid})"
        return f"spawned PID {child.pid}"

    async def _wait(self, proc: Process, args: dict) -> str:
        pid = _arg(args, "pid", int)
        child = self.kernel.table.get(pid)
        if child is None or child.ppid != proc.pid:
            err = SyscallError(Code.NOT_FOUND, f"PID {pid} is not a child of this process",
                               syscall="Wait", pid=proc.pid)
            self.kernel.tracer.emit(proc, "Wait", f"PID({pid})", f"-1 {err}", dur_ms=0, error=err)
            raise err
        async with self.kernel.tracer.syscall(proc, "Wait", f"PID({pid})") as c:
            await child.exited_event.wait()
            c.result = child.wait_line().strip()
        return child.wait_line() + (child.result or "")


async def _search(fn, *args):
    """Run a workspace glob/grep in a thread that a kill abandons at once and
    that stops itself at its next check (docs/devices.md, "Grep and Glob")."""
    cancel = threading.Event()
    try:
        return await trio.to_thread.run_sync(
            functools.partial(fn, *args, cancel=cancel, timeout=SEARCH_TIMEOUT), abandon_on_cancel=True)
    finally:
        cancel.set()


def _timed_out(matches) -> bool:
    return bool(getattr(matches, "timed_out", False))


def _stopped(matches) -> str:
    return f"\n[search stopped after {SEARCH_TIMEOUT:g}s: results are partial]" if _timed_out(matches) else ""


_DEVICE = {"Read": "/dev/fs", "Write": "/dev/fs", "Edit": "/dev/fs", "Glob": "/dev/fs",
           "Grep": "/dev/fs", "Bash": "/dev/shell"}


def _summary(args: dict) -> str:
    text = json.dumps(args, ensure_ascii=False, sort_keys=True)
    return quote(text, 120)
