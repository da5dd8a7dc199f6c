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
EXIT_MAX_TIME = 14
EXIT_WORKER_LOST = 15  # the worker process running the loop died (docs/architecture.md)
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
    max_time: float | None = None  # wall-clock seconds; None = off
    ctx_size: int | None = None  # message slots kept; None = all


@dataclass(eq=False)
class Account:
    """What a process and all its descendants spent, like a cgroup.

    A child's account points at its parent's for the child's whole life
    (reparenting to 0 does not free a child from its parent's budget):
    every token and dollar is charged up the chain, and every limit on the
    chain binds the child.
    """

    pid: int
    max_tokens: int | None = None
    max_cost: float | None = None
    deadline: float | None = None  # time.monotonic() when max_time runs out
    parent: "Account | None" = None
    tokens: int = 0
    cost: float = 0.0
    descendants: int = 0  # processes spawned below this one, all levels

    def chain(self):
        a = self
        while a is not None:
            yield a
            a = a.parent

    def charge(self, tokens: int, cost: float) -> None:
        for a in self.chain():
            a.tokens += tokens
            a.cost += cost

    def remaining_tokens(self) -> int | None:
        left = [a.max_tokens - a.tokens for a in self.chain() if a.max_tokens is not None]
        return min(left) if left else None

    def remaining_cost(self) -> float | None:
        left = [a.max_cost - a.cost for a in self.chain() if a.max_cost is not None]
        return min(left) if left else None

    def over(self, *, strict: bool) -> tuple[str, "Account"] | None:
        """The first exhausted budget on the chain: ("max_tokens" | "max_cost", owner).

        ``strict``: over the limit (after a step); else at or over it (before one)."""
        for a in self.chain():
            if a.max_tokens is not None and (a.tokens > a.max_tokens if strict else a.tokens >= a.max_tokens):
                return "max_tokens", a
            if a.max_cost is not None and (a.cost > a.max_cost if strict else a.cost >= a.max_cost):
                return "max_cost", a
        return None


@dataclass
class Process:
    pid: int
    intent: str
    ppid: int = 0
    agent: str = "default"
    skills: list[str] = field(default_factory=list)
    provider: str = "local"
    model: str | None = None
    # fallbacks not tried yet (agent.yaml models.fallback / fallback_provider)
    spare_model: str | None = None
    spare_provider: str | None = None
    # what answers now: the spawn's provider/model until a fallback switches
    active_provider: str | None = None
    active_model: str | None = None
    fell_back: bool = False
    reasoning_effort: str = ""
    planning: bool = False
    plan: str | None = None
    warnings: list[str] = field(default_factory=list)
    allowed_tools: list[str] = field(default_factory=list)
    usable_skills: list[str] | None = None   # see SpawnPlan
    skill_grants: bool = True
    tool_ceiling: list[str] | None = None    # the parent's grants at spawn (None: no ceiling)
    mcp_servers: list[str] = field(default_factory=list)
    mcp_inline: dict = field(default_factory=dict)  # name -> server config (not persisted)
    mcp_tools: list[dict] | None = None  # function specs, fetched at the first step
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
    spawned: int = 0  # children started over its life (max_children)
    account: Account | None = None
    fds: dict[int, str] = field(default_factory=dict)
    messages: list[dict] = field(default_factory=list)
    tool_results: set[int] = field(default_factory=set)  # indices of user-role tool results
    pinned: int = 2  # leading messages never dropped: system prompt, task (and the plan)
    slots_dropped: int = 0  # messages dropped to keep ctx_size
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

    def __post_init__(self) -> None:
        if self.active_provider is None:
            self.active_provider = self.provider
        if self.active_model is None and not self.fell_back:
            self.active_model = self.model
        if self.account is None:
            self.account = Account(self.pid, self.budget.max_tokens, self.budget.max_cost)

    def move_to(self, state: State) -> None:
        """Transitions only go forward (README.md, "proc/<pid>/")."""
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
            # the fallback in force, if any (provider/model stay the spawn's choice)
            "fallback_provider": self.active_provider if self.fell_back else None,
            "fallback_model": self.active_model if self.fell_back else None,
            "reasoning_effort": self.reasoning_effort or None,
            "planning": self.planning,
            "warnings": list(self.warnings),
            "allowed_tools": list(self.allowed_tools),
            "mcp_servers": list(self.mcp_servers),
            "steps": self.steps,
            "tokens": {"in": self.tokens_in, "out": self.tokens_out},
            "cost": round(self.cost, 6),
            "budget": {
                "max_steps": self.budget.max_steps,
                "max_tokens": self.budget.max_tokens,
                "max_cost": self.budget.max_cost,
                "step_timeout": self.budget.step_timeout,
                "context_budget": self.budget.context_budget,
                "max_time": self.budget.max_time,
                "ctx_size": self.budget.ctx_size,
            },
            # spend of this process and all its descendants (children draw on it)
            "tree": {"tokens": self.account.tokens, "cost": round(self.account.cost, 6),
                     "descendants": self.account.descendants},
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
