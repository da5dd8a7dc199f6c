"""claude-cli and cursor-cli: a model behind a command-line agent.

Protocol (what both CLIs document for headless use): the command runs as
``COMMAND -p --output-format json [--model MODEL] [--effort LEVEL] [ARGS...]``
(``--effort``: claude only, from agent.yaml ``models.reasoning_effort``) with the whole
conversation, rendered as text, on standard input; it prints one JSON object
``{"type": "result", "is_error": false, "result": "...", "usage":
{"input_tokens": N, "output_tokens": M}}`` (usage optional) and exits 0.
The reply arrives whole, so it is one chunk. rnixfs asks for its own tools
through the schema prompt (tool_mode "schema", the default for these
drivers), and the CLI's own built-in tools are bounded by the process's
grants: claude gets ``--allowedTools``/``--disallowedTools`` built from them
(its permission rules speak the same ``Bash(git:*)`` language); cursor-agent
has no such flags, so a process with grants narrower than "all" is refused
unless the provider entry says ``unbounded_tools: true`` (docs/devices.md).
On cancel the CLI's whole process group is killed.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
from typing import AsyncIterator

import trio

from ...config import ProviderConfig
from .base import ChatChunk, LLMError, LLMTimeout, Usage

log = logging.getLogger(__name__)

OUTPUT_CAP = 16 * 1024 * 1024
# Claude Code's built-in tools, and the grant each follows when not named itself.
CLAUDE_TOOLS = {
    "Bash": "Bash", "BashOutput": "Bash", "KillShell": "Bash", "KillBash": "Bash",
    "Read": "Read", "NotebookRead": "Read", "LS": "Glob", "Glob": "Glob", "Grep": "Grep",
    "Write": "Write", "Edit": "Edit", "MultiEdit": "Edit", "NotebookEdit": "Edit",
    "WebFetch": "WebFetch", "WebSearch": "WebSearch", "Task": "Agent", "Agent": "Agent",
    "TodoWrite": "TodoWrite", "Skill": "Skill", "SlashCommand": "SlashCommand",
    "ExitPlanMode": "ExitPlanMode",
}
# args that switch claude's permission checks off: grants could not bound it
_BYPASS = ("--dangerously-skip-permissions", "bypassPermissions", "--allow-dangerously-skip-permissions")


class UnboundedTools(LLMError):
    """The CLI cannot be limited to the process's grants."""


def claude_tool_flags(grants: list[str]) -> list[str]:
    """--allowedTools/--disallowedTools for claude from a process's grants
    ([] = unrestricted: no flags)."""
    if not grants:
        return []
    from ...kernel.grants import Grants  # the one grant model

    g = Grants(grants)
    allowed: list[str] = []
    disallowed: list[str] = []
    for tool, follows in CLAUDE_TOOLS.items():
        own = tool if any(e.tool == tool for e in g.entries) else follows
        pats = g.patterns(own) if g.allows_tool(own) else []
        if pats is None:
            allowed.append(tool)
        elif pats and own == tool:
            allowed += [f"{tool}({p})" for p in pats]   # claude enforces the patterns itself
        else:
            disallowed.append(tool)
    flags = []
    if allowed:
        flags += ["--allowedTools", ",".join(allowed)]
    if disallowed:
        flags += ["--disallowedTools", ",".join(disallowed)]
    return flags
# OpenAI's effort names that claude's --effort (low, medium, high, xhigh, max) lacks
CLAUDE_EFFORT = {"none": "low", "minimal": "low"}


def render(messages: list[dict]) -> str:
    """The conversation as one prompt: system first, then the turns."""
    parts = []
    for m in messages:
        role = m.get("role", "user")
        content = m.get("content") or ""
        if role == "system":
            parts.append(content)
        elif role == "tool":
            parts.append(f"[tool result]\n{content}")
        else:
            parts.append(f"[{role}]\n{content}")
    return "\n\n".join(parts) + "\n"


async def _kill_group(process) -> None:
    """On cancel (kill, step timeout) the CLI's own children die with it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class CLIProvider:
    def __init__(self, cfg: ProviderConfig):
        self.cfg = cfg
        self.name = cfg.name
        self.default_model = cfg.model or None

    def describe(self) -> dict:
        return {"type": self.cfg.type, "command": self.cfg.command, "model": self.cfg.model or "(cli default)"}

    async def aclose(self) -> None:
        pass

    takes_grants = True  # the loop passes the process's grants (see the module docstring)

    def _tool_flags(self, grants: list[str] | None) -> list[str]:
        if not grants:
            return []
        narrowed = ", ".join(grants)
        bypass = any(a == b or a.endswith("=" + b) for a in self.cfg.args for b in _BYPASS)
        if self.cfg.type == "claude-cli" and not bypass:
            return claude_tool_flags(grants)
        if self.cfg.unbounded_tools:
            return []
        why = ("its args switch permission checks off" if bypass
               else "it has no flags to limit its own tools")
        raise UnboundedTools(
            f"provider {self.name} ({self.cfg.type}) cannot be limited to this process's tools "
            f"({narrowed}): {why}; set unbounded_tools: true on the provider in providers.yaml "
            f"to run it anyway", retryable=False)

    def _argv(self, model: str | None, grants: list[str] | None = None,
              effort: str | None = None) -> list[str]:
        flags = self._tool_flags(grants)
        exe = shutil.which(self.cfg.command or "")
        if exe is None:
            raise LLMError(f"{self.cfg.command!r} not found on PATH (provider {self.name}, type {self.cfg.type})")
        argv = [exe, "-p", "--output-format", "json"]
        if model:
            argv += ["--model", model]
        if effort and self.cfg.type == "claude-cli":  # agent.yaml models.reasoning_effort
            argv += ["--effort", CLAUDE_EFFORT.get(effort, effort)]
        return argv + list(self.cfg.args) + flags

    async def stream_chat(self, messages: list[dict], *, model: str | None = None,
                          max_tokens: int | None = None, extra: dict | None = None,
                          grants: list[str] | None = None) -> AsyncIterator[ChatChunk]:
        argv = self._argv(model or self.default_model, grants, (extra or {}).get("reasoning_effort"))
        prompt = render(messages).encode()
        try:
            with trio.fail_after(self.cfg.timeout):
                done = await trio.run_process(
                    argv, stdin=prompt, capture_stdout=True, capture_stderr=True, check=False,
                    env={**os.environ}, start_new_session=True, deliver_cancel=_kill_group)
        except trio.TooSlowError:
            raise LLMTimeout(f"{self.cfg.command} gave no answer within {self.cfg.timeout:g}s") from None
        except OSError as exc:
            raise LLMError(f"cannot run {self.cfg.command}: {exc.strerror}") from None
        out = done.stdout[:OUTPUT_CAP].decode("utf-8", "replace").strip()
        if done.returncode != 0:
            # not shortened here: the guard redacts secrets first, then shortens
            tail = done.stderr[-65536:].decode("utf-8", "replace").strip().splitlines()[-1:] or [out[:4096]]
            raise LLMError(f"{self.cfg.command} exited {done.returncode}: {tail[0][:4096]}",
                           retryable=False)
        try:
            obj = json.loads(out.splitlines()[-1] if out else "")
        except (json.JSONDecodeError, IndexError):
            raise LLMError(f"{self.cfg.command} printed no JSON result: {out[:4096]!r}") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("result"), str):
            raise LLMError(f"{self.cfg.command} printed JSON without a text \"result\"")
        if obj.get("is_error"):
            raise LLMError(f"{self.cfg.command} reported an error: {obj['result'][:4096]}")
        u = obj.get("usage") if isinstance(obj.get("usage"), dict) else {}
        usage = Usage(prompt_tokens=int(u.get("input_tokens") or 0),
                      completion_tokens=int(u.get("output_tokens") or 0))
        yield ChatChunk(text=obj["result"])
        yield ChatChunk(usage=usage, finish_reason="stop")

