"""What of a Process travels over the kernel protocol, and how.

The kernel's ``Process`` is the record the mount renders; the worker's is a
working copy. ``to_spec``/``from_spec`` carry a process to its worker at
start; ``StatusDiff`` sends back only the fields that changed (the
conversation as a tail); ``apply_fields`` applies them to the record.
Times travel as durations: each side has its own monotonic clock.
"""
from __future__ import annotations

import dataclasses
import time

from ..kernel.process import Account, Budget, Process

# Set by the daemon at spawn; the loop reads them.
SPEC_FIELDS = (
    "intent", "ppid", "agent", "skills", "provider", "model", "spare_model", "spare_provider",
    "active_provider", "active_model", "fell_back", "reasoning_effort", "planning", "plan",
    "warnings", "allowed_tools", "usable_skills", "skill_grants", "tool_ceiling", "mcp_servers",
    "mcp_inline", "system_prompt", "cwd", "env", "daemon", "uuid", "paused", "term_requested",
    "pending_input", "steps", "tokens_in", "tokens_out", "cost",
)
# Changed by the loop; the worker reports them back.
STATUS_FIELDS = (
    "steps", "tokens_in", "tokens_out", "cost", "fds", "plan", "result", "active_provider",
    "active_model", "spare_model", "spare_provider", "fell_back", "allowed_tools", "skills",
    "pending_input", "pinned", "slots_dropped", "tool_results",
)
CHEAP_FIELDS = ("steps", "tokens_in", "tokens_out", "cost", "fds")  # sent with trace lines too


def account_to_wire(account: Account) -> list[dict]:
    """The chain from ``account`` up, with time left instead of a deadline."""
    now = time.monotonic()
    return [{"pid": a.pid, "max_tokens": a.max_tokens, "max_cost": a.max_cost, "tokens": a.tokens,
             "cost": a.cost, "descendants": a.descendants,
             "time_left": None if a.deadline is None else a.deadline - now} for a in account.chain()]


def account_from_wire(chain: list[dict]) -> Account:
    now = time.monotonic()
    parent = None
    for a in reversed(chain):
        left = a.get("time_left")
        parent = Account(int(a["pid"]), a.get("max_tokens"), a.get("max_cost"),
                         deadline=None if left is None else now + float(left), parent=parent,
                         tokens=int(a.get("tokens") or 0), cost=float(a.get("cost") or 0.0),
                         descendants=int(a.get("descendants") or 0))
    if parent is None:
        raise ValueError("an account chain has at least the process's own account")
    return parent


def to_spec(proc: Process) -> dict:
    spec = {name: getattr(proc, name) for name in SPEC_FIELDS}
    # inline MCP servers: a reference the kernel resolves with its own record
    spec["mcp_inline"] = {name: {"pid": proc.pid} for name in proc.mcp_inline}
    spec["budget"] = dataclasses.asdict(proc.budget)
    spec["elapsed"] = time.monotonic() - proc.t0
    spec["account"] = account_to_wire(proc.account)
    return spec


def from_spec(pid: int, spec: dict) -> Process:
    fields = {k: spec[k] for k in SPEC_FIELDS if k in spec}
    budget = Budget(**spec.get("budget") or {})
    account = account_from_wire(spec["account"])
    proc = Process(pid=pid, budget=budget, account=account, **fields)
    proc.t0 = time.monotonic() - float(spec.get("elapsed") or 0.0)
    return proc


def _value(proc: Process, name: str):
    value = getattr(proc, name)
    if name == "fds":
        return {str(k): v for k, v in value.items()}
    if name == "tool_results":
        return sorted(value)
    if isinstance(value, list):
        return list(value)
    return value


def _copy(value):
    """A shallow copy of a field as the record holds it (to compare later)."""
    if isinstance(value, (list, dict, set)):
        return value.copy()
    return value


class StatusDiff:
    """What of one process changed since it was last sent. Fields are
    compared as the record holds them and converted for the wire only when
    they changed: this runs at every traced syscall."""

    def __init__(self, proc: Process):
        self.proc = proc
        self._sent = {name: _copy(getattr(proc, name)) for name in STATUS_FIELDS}
        self._messages: list[dict] = []

    def changed(self, names=STATUS_FIELDS, *, messages: bool = True) -> dict:
        out = {}
        sent, proc = self._sent, self.proc
        for name in names:
            value = getattr(proc, name)
            if value != sent[name]:
                sent[name] = _copy(value)
                out[name] = _value(proc, name)
        if messages:
            msgs = self.proc.messages
            at = 0
            while at < len(self._messages) and at < len(msgs) and msgs[at] == self._messages[at]:
                at += 1
            if at < len(msgs) or len(msgs) != len(self._messages):
                out["messages_at"] = at
                out["messages"] = tail = [dict(m) for m in msgs[at:]]
                self._messages[at:] = [dict(m) for m in tail]  # the sent prefix is kept
        return out


_COUNT, _TEXT, _NAMES = (int,), (str, type(None)), (list,)
# the type each reported field must have on the record (a count is never negative)
_TYPES = {
    "steps": _COUNT, "tokens_in": _COUNT, "tokens_out": _COUNT, "cost": (int, float),
    "plan": _TEXT, "result": _TEXT, "active_provider": _TEXT, "active_model": _TEXT,
    "spare_model": _TEXT, "spare_provider": _TEXT, "fell_back": (bool,), "allowed_tools": _NAMES,
    "skills": _NAMES, "pending_input": _NAMES, "pinned": _COUNT, "slots_dropped": _COUNT,
}


def _ok(name: str, value) -> bool:
    kinds = _TYPES[name]
    if isinstance(value, bool) and bool not in kinds:
        return False
    if not isinstance(value, kinds):
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value >= 0 and value == value and value != float("inf")
    if isinstance(value, list):
        return all(isinstance(v, str) for v in value)
    return True


def apply_fields(proc: Process, fields: dict) -> None:
    """Apply a worker's changed fields to the kernel's record; unknown or
    ill-typed ones are ignored, so what the mount renders stays well-formed."""
    for name, value in fields.items():
        if name == "fds" and isinstance(value, dict):
            proc.fds = {int(k): str(v) for k, v in value.items() if str(k).isdigit()}
        elif name == "tool_results" and isinstance(value, list):
            proc.tool_results = {i for i in value if isinstance(i, int) and not isinstance(i, bool)}
        elif name == "messages" and isinstance(value, list):
            at = fields.get("messages_at")
            if isinstance(at, int) and 0 <= at <= len(proc.messages):
                proc.messages[at:] = [m for m in value if isinstance(m, dict)]
        elif name in _TYPES and _ok(name, value):
            setattr(proc, name, value)
