"""The small, typed ports the agent loop and its tools depend on instead of
the whole kernel (docs/architecture.md, "Workers and the kernel protocol").

With ``workers: 0`` the kernel answers them itself (``runner.InlineRunner``);
in a worker process they are proxies that speak the kernel protocol
(rnixfs/worker/). Either way the loop cannot tell the difference, and
nothing here may import devices, agents, pyfuse3 or httpx.
"""
from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Protocol

from ..limits import Limits
from .driver import ModelDriver, Usage
from .errors import SyscallError
from .process import Account, Process
from .trace import Call


class TracerPort(Protocol):
    """Where a process's syscall lines go (``trace.Tracer`` in the daemon)."""

    def emit(self, proc: Process, syscall: str, args: str, result: str, *, t: float | None = None,
             dur_ms: float | None = None, error: SyscallError | None = None) -> None: ...

    def syscall(self, proc: Process, syscall: str, args: str, *,
                device: str = "") -> AbstractAsyncContextManager[Call]: ...


class KernelPort(Protocol):
    """What the Spawn, Wait and Bash tools need from the process table."""

    async def spawn_child(self, parent: Process, intent: str, agent: str | None) -> int:
        """Start a child of ``parent``; its PID. Raises SyscallError."""
        ...

    async def is_child(self, parent: Process, pid: int) -> bool: ...

    async def wait_child(self, parent: Process, pid: int) -> tuple[str, str]:
        """Wait for ``pid`` to exit: (its wait line, its result)."""
        ...

    async def host_started(self, host_pid: int, pid: int) -> None:
        """A Bash command of ``pid`` runs as ``host_pid``: a ``proc/new``
        write from it (or its descendants) spawns a child of ``pid``."""
        ...

    def host_ended(self, host_pid: int) -> None: ...


class ToolsPort(Protocol):
    """The agent's tools (``tools.Tools``)."""

    async def call(self, proc: Process, name: str, args) -> str: ...

    async def mcp_specs(self, proc: Process) -> list[dict]: ...


class StepContext(Protocol):
    """Everything one agent loop needs besides its own Process."""

    tracer: TracerPort
    limits: Limits
    tools: ToolsPort | None
    project: Path

    def checkpoint(self, proc: Process) -> None:
        """The process's state changed: make it visible (and durable)."""
        ...

    def driver(self, provider: str) -> ModelDriver:
        """The model driver of ``provider``; KeyError when there is none."""
        ...

    def price(self, proc: Process, usage: Usage) -> float: ...

    def system_prompt(self, proc: Process) -> str: ...

    async def account(self, proc: Process) -> Account:
        """The spend of ``proc``'s account chain as it stands (its
        ancestors' budgets bind it too)."""
        ...

    async def charge(self, proc: Process, tokens: int, cost: float) -> Account:
        """Charge a step's spend up the chain; the chain afterwards."""
        ...
