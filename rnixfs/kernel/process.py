"""One agent run: its identity, budgets, counters, FDs and context."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum

import trio
import uuid6

# Exit codes, documented in README "Exit codes".
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_MAX_STEPS = 10
EXIT_MAX_TOKENS = 11
EXIT_MAX_COST = 12
EXIT_CONTEXT = 13
EXIT_TIMEOUT = 124
EXIT_KILLED = 137
EXIT_TERMINATED = 143
EXIT_REPLY_TOO_BIG = 20  # one reply went past its provider's max_reply_bytes


class State(str, Enum):
    CREATED = "created"
    RUNNING = "running"
    ZOMBIE = "zombie"
    DEAD = "dead"


_ORDER = {State.CREATED: 0, State.RUNNING: 1, State.ZOMBIE: 2, State.DEAD: 3}


@dataclass
class Budget:
    max_steps: int | None = None
    max_tokens: int | None = None
    max_cost: float | None = None
    step_timeout: float | None = 300.0  # seconds; None = off
    context_budget: int | None = None


@dataclass
class Process:
    pid: int
    intent: str
    ppid: int = 0
    agent: str = "default"
    skills: list[str] = field(default_factory=list)
    provider: str = "local"
    model: str | None = None
    fallback_model: str | None = None
    fallback_provider: str | None = None
    allowed_tools: list[str] = field(default_factory=list)
    usable_skills: list[str] | None = None   # see SpawnPlan
    skill_grants: bool = True
    tool_ceiling: list[str] | None = None    # the parent's grants at spawn (None: no ceiling)
    system_prompt: str = ""
    budget: Budget = field(default_factory=Budget)
    cwd: str = "."
    env: dict[str, str] = field(default_factory=dict)
    daemon: str = ""
    uuid: str = field(default_factory=lambda: str(uuid6.uuid7()))

    state: State = State.CREATED
    paused: bool = False
    created: float = field(default_factory=time.time)
    started: float | None = None
    exited: float | None = None
    exit_code: int | None = None
    error: dict | None = None
    steps: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0
    children: set[int] = field(default_factory=set)
    fds: dict[int, str] = field(default_factory=dict)
    messages: list[dict] = field(default_factory=list)
    tool_results: set[int] = field(default_factory=set)  # indices of user-role tool results
    pending_input: list[str] = field(default_factory=list)
    result: str | None = None

    # Committed trace/events: only what the store has made durable.
    trace: bytearray = field(default_factory=bytearray)
    events: bytearray = field(default_factory=bytearray)
    seq: int = 0

    t0: float = field(default_factory=time.monotonic)
    term_requested: bool = False
    cancel_scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    exited_event: trio.Event = field(default_factory=trio.Event)
    resume_event: trio.Event = field(default_factory=trio.Event)
    input_event: trio.Event = field(default_factory=trio.Event)
    trace_event: trio.Event = field(default_factory=trio.Event)

    def move_to(self, state: State) -> None:
        """Transitions only go forward (DESIGN.md §3)."""
        if _ORDER[state] < _ORDER[self.state]:
            raise ValueError(f"pid {self.pid}: {self.state.value} -> {state.value} goes backwards")
        self.state = state

    @property
    def alive(self) -> bool:
        return self.state in (State.CREATED, State.RUNNING)

    def alloc_fd(self, device: str) -> int:
        fd = 3
        while fd in self.fds:
            fd += 1
        self.fds[fd] = device
        return fd

    def elapsed(self) -> float:
        end = self.exited or time.time()
        return max(0.0, end - (self.started or self.created))

    def wait_line(self) -> str:
        return (
            f"exited({self.exit_code}) steps={self.steps} "
            f"tokens={self.tokens_in + self.tokens_out} elapsed={self.elapsed():.1f}s\n"
        )

    def status(self) -> dict:
        return {
            "pid": self.pid,
            "uuid": self.uuid,
            "ppid": self.ppid,
            "state": self.state.value,
            "paused": self.paused,
            "intent": self.intent,
            "agent": self.agent,
            "skills": list(self.skills),
            "provider": self.provider,
            "model": self.model,
            "allowed_tools": list(self.allowed_tools),
            "steps": self.steps,
            "tokens": {"in": self.tokens_in, "out": self.tokens_out},
            "cost": round(self.cost, 6),
            "budget": {
                "max_steps": self.budget.max_steps,
                "max_tokens": self.budget.max_tokens,
                "max_cost": self.budget.max_cost,
                "step_timeout": self.budget.step_timeout,
                "context_budget": self.budget.context_budget,
            },
            "cwd": self.cwd,
            "created": self.created,
            "started": self.started,
            "exited": self.exited,
            "exit_code": self.exit_code,
            "error": self.error,
            "children": sorted(self.children),
            "fds": {str(k): v for k, v in sorted(self.fds.items())},
            "daemon": self.daemon,
        }
