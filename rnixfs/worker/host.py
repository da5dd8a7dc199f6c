"""The worker side: runs agent loops for the kernel (docs/architecture.md,
"Workers and the kernel protocol").

A worker has its own trio loop, provider registry (its own HTTP clients),
workspace, shell and tools. Its loops see the kernel through proxies of the
ports in rnixfs/kernel/ports.py: trace lines, status changes, charges,
spawns, waits and MCP calls become protocol messages; the kernel's record
of each process stays the one the mount shows.
"""
from __future__ import annotations

import logging
import time
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from ..kernel.driver import ModelDriver, Usage
from ..kernel.errors import Code, SyscallError
from ..kernel.loop import DEFAULT_SYSTEM_PROMPT, outcome
from ..kernel.loop import run as run_loop
from ..kernel.process import EXIT_KILLED, Account, Process
from ..kernel.trace import Tracer
from ..limits import Limits
from . import protocol, spec
from .channel import Channel, PeerGone

log = logging.getLogger(__name__)


def error_from_dict(d: dict | None) -> SyscallError | None:
    """A SyscallError back from its ``to_dict()`` (an unknown code is INTERNAL)."""
    if not isinstance(d, dict):
        return None
    try:
        code = Code(d.get("code"))
    except ValueError:
        code = Code.INTERNAL
    pid = d.get("pid")
    return SyscallError(code, str(d.get("cause") or ""), syscall=str(d.get("syscall") or ""),
                        pid=pid if isinstance(pid, int) else None, device=str(d.get("device") or ""))


class Run:
    """One process this worker runs: its working copy and what was sent of it."""

    def __init__(self, proc: Process):
        self.proc = proc
        self.diff = spec.StatusDiff(proc)


class RemoteTracer(Tracer):
    """Trace lines go to the kernel, whose Tracer numbers and commits them."""

    def __init__(self, host: "WorkerHost"):
        super().__init__(None, None)
        self._host = host

    def emit(self, proc: Process, syscall: str, args: str, result: str, *, t: float | None = None,
             dur_ms: float | None = None, error: SyscallError | None = None) -> None:
        rel = (time.monotonic() - proc.t0) if t is None else t
        self._host.channel.send(protocol.Trace(
            pid=proc.pid, syscall=syscall, args=args, result=result, t=rel, dur_ms=dur_ms,
            error=error.to_dict() if error else None,
            fields=self._host.cheap_changes(proc)))  # fds, steps: as fresh as the line

    @asynccontextmanager
    async def syscall(self, proc: Process, syscall: str, args: str, *, device: str = ""):
        # the record catches up before anything that may wait: an fd opened
        # for the call shows in fd/ while it runs, the conversation a model
        # request sends shows in context
        self._host.sync(proc)
        async with super().syscall(proc, syscall, args, device=device) as call:
            yield call


class KernelProxy:
    """ports.KernelPort over the protocol."""

    def __init__(self, channel: Channel):
        self.channel = channel

    async def ask(self, make):
        try:
            reply = await self.channel.request(make)
        except PeerGone:
            raise SyscallError(Code.INTERNAL, "the kernel went away") from None
        err = error_from_dict(reply.error)
        if err is not None:
            raise err
        return reply.value

    async def spawn_child(self, parent: Process, intent: str, agent: str | None) -> int:
        return int(await self.ask(lambda req: protocol.Spawn(pid=parent.pid, req=req, intent=intent,
                                                              agent=agent)))

    async def is_child(self, parent: Process, pid: int) -> bool:
        return bool(await self.ask(lambda req: protocol.IsChild(pid=parent.pid, req=req, child=pid)))

    async def wait_child(self, parent: Process, pid: int) -> tuple[str, str]:
        line, result = await self.ask(lambda req: protocol.Wait(pid=parent.pid, req=req, child=pid))
        return str(line), str(result)

    async def host_started(self, host_pid: int, pid: int) -> None:
        await self.ask(lambda req: protocol.HostStarted(pid=pid, req=req, host_pid=host_pid))

    def host_ended(self, host_pid: int) -> None:
        self.channel.send(protocol.HostEnded(pid=0, host_pid=host_pid))

    # -- tools.McpPort: the MCP sessions stay in the daemon, shared by all callers --------
    async def tool_specs(self, servers: list[str], inline: dict) -> tuple[list[dict], list[str]]:
        specs, errors = await self.ask(lambda req: protocol.McpSpecs(pid=0, req=req, servers=list(servers),
                                                                      inline=dict(inline)))
        return list(specs), list(errors)

    async def call_tool(self, server: str, tool: str, args: dict, limit: int) -> tuple[str, bool]:
        text, is_error = await self.ask(lambda req: protocol.McpCall(
            pid=0, req=req, server=server, tool=tool, args=args, limit=limit))
        return str(text), bool(is_error)


class WorkerContext:
    """ports.StepContext of a loop in a worker."""

    def __init__(self, host: "WorkerHost", tools):
        self._host = host
        self.tracer = host.tracer
        self.limits: Limits = host.limits
        self.project: Path = host.project
        self.tools = tools

    def checkpoint(self, proc: Process) -> None:
        self._host.sync(proc, checkpoint=True)

    def driver(self, provider: str) -> ModelDriver:
        return self._host.providers.get(provider)

    def price(self, proc: Process, usage: Usage) -> float:
        return self._host.providers.price(proc.active_provider, proc.active_model, usage)

    def system_prompt(self, proc: Process) -> str:
        return proc.system_prompt or DEFAULT_SYSTEM_PROMPT

    async def account(self, proc: Process) -> Account:
        if _unbounded(proc.account):
            return proc.account  # nothing on the chain could stop this step: no round trip
        chain = await self._host.kernel.ask(lambda req: protocol.AccountQuery(pid=proc.pid, req=req))
        proc.account = spec.account_from_wire(chain)
        return proc.account

    async def charge(self, proc: Process, tokens: int, cost: float) -> Account:
        if _unbounded(proc.account):
            # the kernel charges its chain all the same, in order with the
            # lines and the exit; the loop needs no answer to check nothing
            proc.account.charge(tokens, cost)
            self._host.channel.tell(
                lambda req: protocol.Charge(pid=proc.pid, req=req, tokens=tokens, cost=cost))
            return proc.account
        chain = await self._host.kernel.ask(
            lambda req: protocol.Charge(pid=proc.pid, req=req, tokens=tokens, cost=cost))
        proc.account = spec.account_from_wire(chain)
        return proc.account


def _unbounded(account: Account) -> bool:
    """No token, cost or time limit anywhere on the chain. Limits are fixed
    before a loop starts (``Kernel._account``, the deadline at start), so
    this holds for the loop's whole life, and the kernel's view of the
    spend could not change what the loop decides."""
    return all(a.max_tokens is None and a.max_cost is None and a.deadline is None
               for a in account.chain())


class WorkerHost:
    """Serves one kernel connection: runs the loops it starts."""

    def __init__(self, channel: Channel, cfg: protocol.Configure, providers, make_tools):
        self.channel = channel
        self.project = Path(cfg.project)
        self.limits = Limits(**cfg.limits)
        self.providers = providers
        self.tracer = RemoteTracer(self)
        self.kernel = KernelProxy(channel)
        self.ctx = WorkerContext(self, make_tools(kernel=self.kernel, tracer=self.tracer,
                                                  project=self.project, mcp=self.kernel))
        self.runs: dict[int, Run] = {}

    def cheap_changes(self, proc: Process) -> dict:
        """The ``spec.CHEAP_FIELDS`` that changed, for a trace line to carry."""
        run = self.runs.get(proc.pid)
        return {} if run is None else run.diff.changed(spec.CHEAP_FIELDS, messages=False)

    def sync(self, proc: Process, *, checkpoint: bool = False) -> None:
        run = self.runs.get(proc.pid)
        if run is None:
            return
        fields = run.diff.changed()
        if fields or checkpoint:
            self.channel.send(protocol.Status(pid=proc.pid, fields=fields, checkpoint=checkpoint))

    async def serve(self) -> None:
        """Until the kernel closes the connection (then every loop is killed)."""
        async with trio.open_nursery() as nursery:
            while True:
                msg = await self.channel.receive()
                if msg is None:
                    break
                if isinstance(msg, protocol.Start):
                    proc = spec.from_spec(msg.pid, msg.spec)
                    self.runs[msg.pid] = Run(proc)
                    nursery.start_soon(self._run, self.runs[msg.pid])
                    continue
                run = self.runs.get(getattr(msg, "pid", -1))
                if run is None:
                    continue  # a signal that crossed the exit
                if isinstance(msg, protocol.Signal):
                    _signal(run.proc, msg.command)
                elif isinstance(msg, protocol.Steer):
                    run.proc.pending_input.append(msg.text)
            log.info("kernel closed the connection: ending %d loops", len(self.runs))
            nursery.cancel_scope.cancel()

    async def _run(self, run: Run) -> None:
        proc = run.proc
        code, error = EXIT_KILLED, None
        with proc.cancel_scope:
            try:
                code = await run_loop(self.ctx, proc)
            except Exception as exc:
                code, error = outcome(exc, proc.pid)
        if proc.cancel_scope.cancelled_caught:
            code, error = EXIT_KILLED, SyscallError(Code.INTERRUPTED, "killed", syscall="Exit", pid=proc.pid)
        self.runs.pop(proc.pid, None)
        self.channel.send(protocol.Exit(pid=proc.pid, code=code, error=error.to_dict() if error else None,
                                        result=proc.result, fields=run.diff.changed()))


def _signal(proc: Process, command: str) -> None:
    if command == "kill":
        proc.cancel_scope.cancel()
    elif command == "term":
        proc.term_requested = True
        proc.resume_event.set()
    elif command == "pause":
        proc.paused = True
    elif command == "resume":
        proc.paused = False
        proc.resume_event.set()
