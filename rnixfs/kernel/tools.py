"""The agent's tools, each a sequence of traced syscalls on a device.

Read/Write/Edit/Glob/Grep go through the workspace device (``/dev/fs``),
Bash through the shell device (``/dev/shell``) — the same code the mount
uses — and Spawn/Wait through the kernel (``ports.KernelPort``). Skill loads a skill's body (the
activation syscall); the files of the skills a process may use are
readable, never writable, by Read/Glob/Grep at the paths the catalog and
Skill give (``/skills/<name>/…`` works too). Grants are checked by
``grants`` (docs/skills.md, "Grants"). A denied or failing call is a
SyscallError in the trace and an ``error: …`` text the model sees; the
process goes on.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import threading
from pathlib import Path
from typing import Protocol

import trio

from . import grants as grant_rules
from .errors import Code, SyscallError
from .ports import KernelPort, TracerPort
from .process import Process
from .trace import quote

log = logging.getLogger(__name__)

RESULT_CAP = 16 * 1024  # bytes of one tool result the model sees
READ_CAP = 256 * 1024  # bytes a Read takes from a file before it truncates
EDIT_CAP = 16 * 1024 * 1024  # an Edit never writes back a cut file
BASH_TIMEOUT = 120.0
BASH_TIMEOUT_MAX = 3600.0
SEARCH_TIMEOUT = 60.0  # seconds a Glob or Grep may walk before it ends truncated
SKILL_CAP = 64 * 1024  # a skill body is instructions: more room than a tool result
SKILL_FILES_SHOWN = 100
SKILL_SEARCH_HITS = 50

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
    "Skill": ("Load a skill's full instructions by name (from available_skills); "
              "or find skills: give query (words) instead of name.",
              {"name": _S, "query": _S}, []),
}
NAMES = tuple(SPECS)


def offered(allowed: list[str]) -> list[str]:
    """Tool names a process may call (a scoped grant offers its tool)."""
    names = grant_rules.tool_names(allowed)
    return [n for n in NAMES if not allowed or n in names]


def schemas(allowed: list[str]) -> list[dict]:
    """OpenAI function specs of the tools a process may call."""
    names = offered(allowed)
    return [{"type": "function", "function": {
        "name": n, "description": SPECS[n][0],
        "parameters": {"type": "object", "properties": SPECS[n][1], "required": SPECS[n][2]}}}
        for n in names]


def answer_schema(allowed: list[str]) -> dict:
    """The JSON a schema-constrained model must answer with (weak models)."""
    names = offered(allowed)
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


def _denied(cause: str, syscall: str, device: str = "") -> SyscallError:
    return SyscallError(Code.PERMISSION, f"permission denied: {cause}", syscall=syscall, device=device)


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


class McpPort(Protocol):
    """MCP servers as the agents see them (rnixfs/devices/mcp/device.py)."""

    async def tool_specs(self, servers: list[str], inline: dict) -> tuple[list[dict], list[str]]: ...

    async def call_tool(self, server: str, tool: str, args: dict, limit: int) -> tuple[str, bool]: ...


class Tools:
    """Runs tool calls for processes of one kernel."""

    def __init__(self, workspace, shell, *, kernel: KernelPort, tracer: TracerPort, project,
                 mount: str = "", env: dict | None = None, skills=None, open_root=None,
                 mcp: McpPort | None = None):
        self.kernel = kernel
        self.tracer = tracer
        self.project = Path(project)
        self.ws = workspace
        self.shell = shell
        self.mount = mount
        self.env = dict(os.environ if env is None else env)  # without provider keys
        self.skills = skills  # () -> skills Resolution (cached by the catalog), or None
        # (scope root, skill dir) -> a read-only confined view of the skill
        # (rnixfs.fileio.confined_dir: reached by the fd-relative walk)
        self._open_root = open_root
        self.mcp = mcp

    async def call(self, proc: Process, name: str, args) -> str:
        tracer = self.tracer
        if not isinstance(args, dict):
            args = {}
        if name.startswith("mcp__") and self._mcp_tool(proc, name):
            return await self._mcp(proc, name, args)
        if name not in SPECS:
            err = SyscallError(Code.INVALID, f"unknown tool {name[:40]!r}; tools: {', '.join(NAMES)}",
                               syscall="Tool", pid=proc.pid)
            tracer.emit(proc, "Tool", quote(name), f"-1 {err}", dur_ms=0, error=err)
            return f"error: {err.cause}"
        if not grant_rules.Grants(proc.allowed_tools).allows_tool(name):
            err = SyscallError(Code.PERMISSION,
                               f"{name} is not allowed (allowed tools: {', '.join(proc.allowed_tools)})",
                               syscall=name, pid=proc.pid, device=_DEVICE.get(name, ""))
            tracer.emit(proc, name, _summary(args), f"-1 {err}", dur_ms=0, error=err)
            return f"error: permission denied: {err.cause}"
        try:
            return cap(await getattr(self, "_" + name.lower())(proc, args),
                       SKILL_CAP if name == "Skill" else RESULT_CAP)
        except ToolError as exc:
            err = SyscallError(Code.INVALID, str(exc), syscall=name, pid=proc.pid)
            tracer.emit(proc, name, _summary(args), f"-1 {err}", dur_ms=0, error=err)
            return f"error: {exc}"
        except SyscallError as exc:  # already traced by the syscall that failed
            return f"error: {exc.cause}"

    # -- MCP tools ---------------------------------------------------------------------
    async def mcp_specs(self, proc: Process) -> list[dict]:
        """The process's MCP tools as function specs (fetched once, at its
        first step: the servers start then); the grants filter them."""
        if proc.mcp_tools is None:
            specs: list[dict] = []
            if proc.mcp_servers and self.mcp is not None:
                async with self.tracer.syscall(
                        proc, "Open", quote(",".join(f"/dev/mcp/{s}" for s in proc.mcp_servers)),
                        device="/dev/mcp") as c:
                    specs, errors = await self.mcp.tool_specs(proc.mcp_servers, proc.mcp_inline)
                    c.result = f"{len(specs)} tools" + (f" ({'; '.join(errors)})" if errors else "")
            grants = grant_rules.Grants(proc.allowed_tools)
            proc.mcp_tools = [s for s in specs if grants.allows_tool(s["function"]["name"])]
        return proc.mcp_tools

    def _mcp_tool(self, proc: Process, name: str) -> bool:
        return any(s["function"]["name"] == name for s in proc.mcp_tools or ())

    async def _mcp(self, proc: Process, name: str, args: dict) -> str:
        """mcp__<server>__<tool>: one traced call, an fd while it runs, the
        result capped like any tool's; kill cancels it."""
        _, server, tool = name.split("__", 2)
        if not grant_rules.Grants(proc.allowed_tools).allows_tool(name):
            err = _denied(f"{name} is not allowed", name, f"/dev/mcp/{server}")
            err.pid = proc.pid
            self.tracer.emit(proc, "Call", quote(name), f"-1 {err}", dur_ms=0, error=err)
            return f"error: {err.cause}"
        payload = json.dumps(args, ensure_ascii=False)
        device = f"/dev/mcp/{server}/tools/{tool}/call"
        fd = proc.alloc_fd(device)
        try:
            async with self.tracer.syscall(
                    proc, "Call", f"{quote(name)}, {len(payload.encode())} bytes",
                    device=f"/dev/mcp/{server}") as c:
                text, is_error = await self.mcp.call_tool(server, tool, args, RESULT_CAP)
                c.result = f"{len(text.encode())} bytes" + (" (tool error)" if is_error else "")
        except SyscallError as exc:
            return f"error: {exc.cause}"
        finally:
            proc.fds.pop(fd, None)
        return cap(f"error: {text}" if is_error else text)

    # -- workspace ---------------------------------------------------------------------
    def relative(self, path: str) -> str:
        """Models like absolute paths: /dev/fs/x, $RNIXFS_MOUNT/dev/fs/x and the
        project's own absolute path all name workspace-relative x."""
        prefixes = ["/dev/fs/"]
        if self.mount:
            prefixes.append(self.mount.rstrip("/") + "/dev/fs/")
        prefixes.append(str(self.project).rstrip("/") + "/")
        for prefix in prefixes:
            if path.startswith(prefix):
                return path[len(prefix):] or "."
        if path in ("/dev/fs", str(self.project)):
            return "."
        return path

    # -- skill files (read-only) -----------------------------------------------------------
    def usable_skills(self, proc: Process) -> dict:
        """name -> Skill for every skill ``proc`` may load or read (blocking)."""
        if self.skills is None:
            return {}
        loaded = set(proc.skills)
        out = {}
        for name, s in self.skills().skills.items():
            if name in loaded:
                out[name] = s
            elif proc.usable_skills is not None:
                if name in proc.usable_skills:
                    out[name] = s
            elif not getattr(s, "disable_model_invocation", False):
                out[name] = s
        return out

    def skill_target(self, proc: Process, raw: str):
        """(skill, path inside it, the base as written) when ``raw`` names a
        file of a skill ``proc`` may use outside the project; else None."""
        if self.skills is None or not isinstance(raw, str):
            return None
        p = os.path.expanduser(raw) if raw.startswith("~") else raw
        if not p.startswith("/") or self.relative(p) != p or p == "/dev/fs":
            return None  # workspace paths: a project skill is a workspace file (protected paths apply)
        virtual = ["/skills/"] + ([self.mount.rstrip("/") + "/skills/"] if self.mount else [])
        usable = None
        for prefix in virtual:
            if p.startswith(prefix):
                name, _, rest = p[len(prefix):].partition("/")
                usable = self.usable_skills(proc)
                if name not in usable:
                    raise SyscallError(Code.NOT_FOUND, f'no skill "{name}" this process may use',
                                       syscall="Open", device=p)
                return usable[name], rest.strip("/") or ".", prefix + name
        usable = self.usable_skills(proc) if usable is None else usable
        for s in usable.values():
            try:
                real = os.path.realpath(s.path)
            except OSError:   # realpath races a swap (EINVAL): the path as written only
                real = str(s.path)
            for base in dict.fromkeys((str(s.path), real)):
                if p == base or p.startswith(base.rstrip("/") + "/"):
                    return s, p[len(base):].strip("/") or ".", base
        return None

    def _skill_root(self, skill):
        """A confined, read-only view of one skill directory, reached from
        its scope root by the race-free walk (docs/skills.md)."""
        if self._open_root is None:
            raise SyscallError(Code.INTERNAL, "skill files are not served here", syscall="Open")
        try:
            return self._open_root(skill.scope_root, skill.path)
        except PermissionError:
            raise SyscallError(Code.PERMISSION, f'skill "{skill.name}" leaves its scope',
                               syscall="Open") from None

    async def _target(self, proc: Process, raw: str, tool: str):
        """(workspace, rel, device root, owned) for a path argument; an owned
        workspace (a skill's) is the caller's to close."""
        try:
            hit = await trio.to_thread.run_sync(self.skill_target, proc, raw)
        except SyscallError as err:
            err.pid = proc.pid
            self.tracer.emit(proc, "Open", quote(raw), f"-1 {err}", dur_ms=0, error=err)
            raise
        if hit is None:
            return self.ws, self.relative(raw), "/dev/fs", False
        skill, rel, base = hit
        root = f"/skills/{skill.name}"
        if tool not in ("Read", "Glob", "Grep"):
            err = _denied(f"skill files are read-only ({base})", tool, f"{root}/{rel}")
            err.pid = proc.pid
            self.tracer.emit(proc, tool, quote(raw), f"-1 {err}", dur_ms=0, error=err)
            raise err
        try:
            ws = await trio.to_thread.run_sync(self._skill_root, skill)
        except SyscallError as err:
            err.pid = proc.pid
            self.tracer.emit(proc, "Open", quote(raw), f"-1 {err}", dur_ms=0, error=err)
            raise
        return ws, rel, root, True

    def _check_workspace(self, proc: Process, tool: str, path: str) -> None:
        """Grants on a canonical workspace path; raises PERMISSION."""
        grants = grant_rules.Grants(proc.allowed_tools)
        why = grants.check_path(tool, path)
        if why:
            raise _denied(why, tool)
        if tool in ("Write", "Edit") and grant_rules.protected(path) and not grants.names_protected(tool, path):
            raise _denied(f"{path} holds agent limits (.rnix/, .agents/skills/, .mcp.json); "
                          f"{tool} needs a grant naming it, e.g. {tool}(.rnix/**)", tool)

    async def _open(self, proc: Process, raw: str, mode: str, tool: str = "Read"):
        ws, rel, root, owned = await self._target(proc, raw, tool)
        device = f"{root}/{rel}"
        try:
            async with self.tracer.syscall(proc, "Open", f"{quote(device)}, {mode}", device=device) as c:
                if not owned and isinstance(rel, str) and not rel.startswith("/"):
                    # the path as written first (its directory may not exist yet), then the real one
                    self._check_workspace(proc, tool, os.path.normpath(rel))
                path = await trio.to_thread.run_sync(ws.resolve, rel)
                if not owned:
                    self._check_workspace(proc, tool, path)
                label = f"{root}/{path}"
                fd = proc.alloc_fd(label)
                c.result = f"FD({fd})"
        except BaseException:
            if owned:
                ws.close()
            raise
        return fd, path, ws, label

    async def _close(self, proc: Process, fd: int) -> None:
        async with self.tracer.syscall(proc, "Close", f"FD({fd})"):
            proc.fds.pop(fd, None)

    async def _read(self, proc: Process, args: dict) -> str:
        rel = _arg(args, "path")
        offset = _arg(args, "offset", int, required=False) or 0
        limit = _arg(args, "limit", int, required=False)
        fd, path, ws, label = await self._open(proc, rel, "O_RDONLY")
        try:
            async with self.tracer.syscall(proc, "Read", f"FD({fd})", device=label) as c:
                data, truncated = await trio.to_thread.run_sync(ws.read_file, path, READ_CAP)
                c.result = f"{len(data)} bytes" + (" (truncated)" if truncated else "")
        finally:
            if ws is not self.ws:
                ws.close()
            await self._close(proc, fd)
        text = data.decode("utf-8", "replace")
        if offset or limit:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[offset: offset + limit if limit else None])
        return text + (f"\n[truncated: file is larger than {READ_CAP} bytes]" if truncated else "")

    async def _write(self, proc: Process, args: dict) -> str:
        rel, content = _arg(args, "path"), _arg(args, "content")
        fd, path, _ws, label = await self._open(proc, rel, "O_WRONLY|O_CREAT|O_TRUNC", "Write")
        data = content.encode()
        try:
            async with self.tracer.syscall(proc, "Write", f"FD({fd}), {len(data)} bytes",
                                                  device=label) as c:
                await trio.to_thread.run_sync(self.ws.write_file, path, data)
                c.result = str(len(data))
        finally:
            await self._close(proc, fd)
        return f"wrote {len(data)} bytes to {path}"

    async def _edit(self, proc: Process, args: dict) -> str:
        rel, old, new = _arg(args, "path"), _arg(args, "old_string"), _arg(args, "new_string")
        if not old:
            raise ToolError("old_string must not be empty")
        fd, path, _ws, device = await self._open(proc, rel, "O_RDWR", "Edit")
        try:
            async with self.tracer.syscall(proc, "Read", f"FD({fd})", device=device) as c:
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
            async with self.tracer.syscall(proc, "Write", f"FD({fd}), {len(out)} bytes",
                                                  device=device) as c:
                await trio.to_thread.run_sync(self.ws.write_file, path, out)
                c.result = str(len(out))
        except UnicodeDecodeError:
            raise ToolError(f"{path} is not UTF-8 text") from None
        finally:
            await self._close(proc, fd)
        return f"edited {path}: replaced 1 occurrence"

    async def _glob(self, proc: Process, args: dict) -> str:
        raw = _arg(args, "pattern")
        ws, pattern, root, owned = await self._target(proc, raw, "Glob")
        try:
            async with self.tracer.syscall(proc, "Glob", quote(pattern if not owned else raw),
                                                  device=root) as c:
                matches = await _search(ws.glob, pattern, 1000)
                stopped = _stopped(matches)
                matches = self._filter(proc, "Glob", matches, owned)
                c.result = f"{len(matches)} matches" + (" (timeout)" if stopped else "")
        finally:
            if owned:
                ws.close()
        if owned:
            shown = raw[:len(raw) - len(pattern)].rstrip("/")
            matches = [f"{shown}/{m}" for m in matches]
        return ("\n".join(matches) if matches else "(no matches)") + stopped

    async def _grep(self, proc: Process, args: dict) -> str:
        pattern, glob = _arg(args, "pattern"), _arg(args, "glob", required=False) or "**"
        ws, rel_glob, root, owned = await self._target(proc, glob, "Grep")
        try:
            async with self.tracer.syscall(proc, "Grep", f"{quote(pattern)}, {quote(glob)}",
                                                  device=root) as c:
                hits = await _search(ws.grep, pattern, rel_glob, 500)
                stopped = _stopped(hits)
                hits = self._filter(proc, "Grep", hits, owned)
                c.result = f"{len(hits)} matches" + (" (timeout)" if stopped else "")
        finally:
            if owned:
                ws.close()
        shown = glob[:len(glob) - len(rel_glob)].rstrip("/") + "/" if owned else ""
        return ("\n".join(f"{shown}{rel}:{n}: {line}" for rel, n, line in hits) if hits else "(no matches)"
                ) + stopped

    def _filter(self, proc: Process, tool: str, found, owned: bool):
        """A scoped Glob/Grep grant sees only the paths it names."""
        pats = None if owned else grant_rules.Grants(proc.allowed_tools).patterns(tool)
        if pats is None:
            return found
        key = (lambda m: m) if tool == "Glob" else (lambda m: m[0])
        return [m for m in found if any(grant_rules.path_matches(p, key(m)) for p in pats)]


    # -- shell ---------------------------------------------------------------------------
    async def _bash(self, proc: Process, args: dict) -> str:
        command = _arg(args, "command")
        timeout = _arg(args, "timeout", int, required=False) or BASH_TIMEOUT
        timeout = min(max(1, timeout), BASH_TIMEOUT_MAX)
        tracer = self.tracer
        grants = grant_rules.Grants(proc.allowed_tools)
        why = grants.check_command(command)
        if why is None:
            why = grant_rules.check_bash_protected(command, grants)  # best effort: see docs/skills.md
        if why:
            err = _denied(why, "Bash", "/dev/shell")
            err.pid = proc.pid
            tracer.emit(proc, "Bash", quote(command), f"-1 {err}", dur_ms=0, error=err)
            raise err
        async with tracer.syscall(proc, "Open", '"/dev/shell", O_RDWR', device="/dev/shell") as c:
            fd = proc.alloc_fd("/dev/shell")
            c.result = f"FD({fd})"
        try:
            async with tracer.syscall(proc, "Write", f"FD({fd}), {quote(command)}", device="/dev/shell") as c:
                c.result = str(len(command.encode()))
            env = {**self.env, **proc.env, "RNIXFS_PID": str(proc.pid), "RNIXFS_MOUNT": self.mount}
            cwd = self.project / await trio.to_thread.run_sync(self.ws.resolve, proc.cwd)
            hosts: list[int] = []

            async def started(host_pid: int) -> None:
                hosts.append(host_pid)
                await self.kernel.host_started(host_pid, proc.pid)

            try:
                async with tracer.syscall(proc, "Read", f"FD({fd})", device="/dev/shell") as c:
                    res = await self.shell.run(command, cwd=cwd, env=env, timeout=timeout,
                                               output_limit=RESULT_CAP, on_start=started)
                    status = f"exit={res.exit_code}" if res.signal is None else f"signal={res.signal}"
                    c.result = f"{len(res.output)} bytes {status}" + (" timeout" if res.timed_out else "") \
                        + (f" sandbox={res.sandbox}" if getattr(res, "sandbox", "") else "")
            finally:
                for h in hosts:
                    self.kernel.host_ended(h)
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
        async with self.tracer.syscall(proc, "Spawn", f"{quote(intent)}, agent={agent or 'default'}",
                                              device="/proc/new") as c:
            child = await self.kernel.spawn_child(proc, intent, agent)
            c.result = f"PID({child})"
        return f"spawned PID {child}"

    async def _wait(self, proc: Process, args: dict) -> str:
        pid = _arg(args, "pid", int)
        if not await self.kernel.is_child(proc, pid):
            err = SyscallError(Code.NOT_FOUND, f"PID {pid} is not a child of this process",
                               syscall="Wait", pid=proc.pid)
            self.tracer.emit(proc, "Wait", f"PID({pid})", f"-1 {err}", dur_ms=0, error=err)
            raise err
        async with self.tracer.syscall(proc, "Wait", f"PID({pid})") as c:
            line, result = await self.kernel.wait_child(proc, pid)
            c.result = line.strip()
        return line + result


    # -- skills ------------------------------------------------------------------------------
    async def _skill(self, proc: Process, args: dict) -> str:
        name = (_arg(args, "name", required=False) or "").strip().lstrip("/")
        query = (_arg(args, "query", required=False) or "").strip()
        if not name and not query:
            raise ToolError('missing argument "name" (or "query" to search skills)')
        tracer = self.tracer
        if not name:
            async with tracer.syscall(proc, "Skill", f"query={quote(query)}", device="/skills") as c:
                usable = await trio.to_thread.run_sync(self.usable_skills, proc)
                words = query.lower().split()
                hits = sorted((s for s in usable.values()
                               if all(w in f"{s.name} {s.description}".lower() for w in words)),
                              key=lambda s: s.name)
                c.result = f"{len(hits)} matches"
            if not hits:
                return f"no skill matches {query!r}"
            lines = [f"{s.name}: {s.description[:200]} ({s.skill_md})" for s in hits[:SKILL_SEARCH_HITS]]
            more = len(hits) - SKILL_SEARCH_HITS
            return "\n".join(lines) + (f"\n[{more} more; narrow the query]" if more > 0 else "")
        async with tracer.syscall(proc, "Skill", quote(name), device=f"/skills/{name}") as c:
            skill = await trio.to_thread.run_sync(self._activatable, proc, name)
            body = await trio.to_thread.run_sync(self._body, skill)
            files = await trio.to_thread.run_sync(skill.resources)
            granted, refused = self._join_grants(proc, skill)
            c.result = f"{len(body.encode())} bytes" + (f", +{' '.join(granted)}" if granted else "")
        if granted:
            tracer.emit(proc, "Grant", quote(" ".join(granted)), f"0 (skill {skill.name})", dur_ms=0)
        if skill.name not in proc.skills:
            proc.skills.append(skill.name)
        head = [f"Base directory for this skill: {skill.path}"]
        if files:
            shown = ", ".join(f for f in files[:SKILL_FILES_SHOWN] if f != "SKILL.md")
            extra = f" (and {len(files) - SKILL_FILES_SHOWN} more)" if len(files) > SKILL_FILES_SHOWN else ""
            head.append(f"Files (read-only; Read/Glob/Grep them under the base directory): {shown}{extra}")
        if granted:
            head.append(f"Tools granted by this skill: {', '.join(granted)}")
        if refused:
            head.append(f"Tools this skill asks for but not granted: {', '.join(refused[0])} ({refused[1]})")
        return "\n".join(head) + "\n\n" + body

    def _activatable(self, proc: Process, name: str):
        usable = self.usable_skills(proc)
        if name in usable:
            return usable[name]
        found = self.skills().winners.get(name) if self.skills is not None else None
        if found is None:
            raise SyscallError(Code.NOT_FOUND, f'skill "{name}" not found')
        if not found.valid:
            raise SyscallError(Code.INVALID, f'skill "{name}" is not loadable: {found.error}')
        if getattr(found, "disable_model_invocation", False):
            raise _denied(f'skill "{name}" sets disable-model-invocation: only agent.yaml or a '
                          "spawn request can load it", "Skill")
        raise _denied(f'skill "{name}" is not among the skills this agent may use', "Skill")

    @staticmethod
    def _body(skill) -> str:
        try:
            return skill.body()
        except Exception as exc:  # SkillInvalid: the bytes changed since resolution
            raise SyscallError(Code.INVALID, str(exc)) from None

    def _join_grants(self, proc: Process, skill) -> tuple[list[str], tuple[list[str], str] | None]:
        """An activated skill's allowed-tools join the grants only when the
        agent's policy allows (docs/skills.md): the process is restricted, its
        agent sets no explicit ``tools``, and never beyond the parent's grants."""
        wanted = list(getattr(skill, "allowed_tools", []) or [])
        if not wanted or not proc.allowed_tools:
            return [], None  # nothing asked, or unrestricted already
        if not proc.skill_grants:
            return [], (wanted, "the agent's tools list is explicit")
        new = grant_rules.union(proc.allowed_tools, wanted)
        if proc.tool_ceiling is not None:
            new = grant_rules.intersect(new, proc.tool_ceiling) or list(proc.allowed_tools)
        added = [t for t in new if t not in proc.allowed_tools]
        left = [t for t in wanted if t not in new]
        if added:
            proc.allowed_tools = new
        return added, ((left, "beyond the parent's grants") if left else None)


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
