"""Who runs a process's agent loop (docs/architecture.md, "Workers and the
kernel protocol").

The kernel keeps the authoritative ``Process`` record; a ``Runner`` runs the
loop for it. ``InlineRunner`` runs it on the kernel's own trio loop
(``workers: 0``: the unit tests, and a documented fallback);
``rnixfs.worker.pool.WorkerPool`` runs it in a worker process.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol

from ..limits import Limits
from .driver import ModelDriver, Usage
from .loop import run as run_loop
from .ports import KernelPort, StepContext, ToolsPort, TracerPort
from .process import Account, Process

if TYPE_CHECKING:
    from .kernel import Kernel

# make_tools(kernel=…, tracer=…, project=…) -> the tools of the processes it runs
ToolsFactory = Callable[..., ToolsPort]


class Runner(Protocol):
    async def run(self, kernel: "Kernel", proc: Process) -> int:
        """Run ``proc``'s loop to its end: its exit code, or ProcessExit /
        SyscallError. Cancelling the call (kill) stops the loop, bounded."""
        ...

    def signal(self, proc: Process, command: str) -> None:
        """``term``/``kill``/``pause``/``resume``, after the kernel has
        applied it to its record."""
        ...

    def steer(self, proc: Process, text: str) -> None:
        """New user input, after the kernel queued it on its record."""
        ...

    def owner_of(self, host_pid: int) -> int | None:
        """When ``host_pid`` runs loops (a worker process): the one process
        of it running a Bash command, if exactly one does; else None."""
        ...

    def describe(self) -> dict: ...


class InlineContext:
    """The StepContext of a loop that runs on the kernel's own loop."""

    def __init__(self, kernel: "Kernel", tools: ToolsPort | None):
        self._kernel = kernel
        self.tracer: TracerPort = kernel.tracer
        self.limits: Limits = kernel.limits
        self.project: Path = kernel.project
        self.tools = tools

    def checkpoint(self, proc: Process) -> None:
        self._kernel.checkpoint(proc)

    def driver(self, provider: str) -> ModelDriver:
        return self._kernel.providers.get(provider)

    def price(self, proc: Process, usage: Usage) -> float:
        return self._kernel.price(proc, usage)

    def system_prompt(self, proc: Process) -> str:
        return self._kernel.system_prompt(proc)

    async def account(self, proc: Process) -> Account:
        return proc.account

    async def charge(self, proc: Process, tokens: int, cost: float) -> Account:
        return self._kernel.charge(proc, tokens, cost)


class InlineRunner:
    """Runs every loop on the kernel's trio loop. The record and the loop's
    process are one object, so signals and steering need no forwarding."""

    def __init__(self, make_tools: ToolsFactory | None = None):
        self._make_tools = make_tools
        self._ctx: StepContext | None = None

    def context(self, kernel: "Kernel") -> StepContext:
        """Built at the first run: the tools need the kernel as their port."""
        if self._ctx is None:
            port: KernelPort = kernel
            tools = None if self._make_tools is None else self._make_tools(
                kernel=port, tracer=kernel.tracer, project=kernel.project)
            self._ctx = InlineContext(kernel, tools)
        return self._ctx

    async def run(self, kernel: "Kernel", proc: Process) -> int:
        return await run_loop(self.context(kernel), proc)

    def signal(self, proc: Process, command: str) -> None:
        pass

    def steer(self, proc: Process, text: str) -> None:
        pass

    def owner_of(self, host_pid: int) -> int | None:
        return None  # commands are the daemon's children: their pids are registered in time

    def describe(self) -> dict:
        return {"workers": 0}
