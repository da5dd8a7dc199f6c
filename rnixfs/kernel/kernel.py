"""The process table and everything that acts on it: spawn, signals,
wait, reap, steering, zombie linger, shutdown.

A service with ``run()``: it owns the nursery in which processes run.
"""
from __future__ import annotations

import bisect
import os
import collections
import logging
import time
from pathlib import Path
from typing import Callable

import psutil
import trio

from ..limits import Limits
from .errors import Code, SyscallError
from .loop import DEFAULT_SYSTEM_PROMPT, budget_error, outcome
from .process import (
    EXIT_ERROR, EXIT_KILLED, EXIT_MAX_TIME, Account, Budget, Process, State,
)
from .grants import intersect
from .plan import SpawnPlan
from .request import SpawnRequest
from .runner import InlineRunner, Runner
from .trace import Tracer, quote

log = logging.getLogger(__name__)

SIGNALS = ("term", "kill", "killtree", "pause", "resume", "reap")
PID_BLOCK = 64
NO_TOOLS = "(none)"  # an allowed_tools entry no tool has: empty would mean unrestricted


def bare_plan(req: SpawnRequest, *, default_provider: str, driver_models, cwd) -> SpawnPlan:
    """Without an agent catalog only the built-in default agent exists."""
    if req.agent not in (None, "default"):
        raise SyscallError(Code.NOT_FOUND, f'agent "{req.agent}" not found', syscall="Spawn",
                           device="/proc/new")
    for skill in req.skills:
        raise SyscallError(Code.NOT_FOUND, f'skill "{skill}" not found', syscall="Spawn",
                           device="/proc/new")
    return SpawnPlan(agent="default", provider=req.provider or default_provider, model=req.model,
                     skills=[], allowed_tools=[], system_prompt=DEFAULT_SYSTEM_PROMPT)


class Kernel:
    def __init__(
        self,
        store,
        providers,
        *,
        daemon_id: str,
        linger: float = 600.0,
        project: Path | None = None,
        planner: Callable[..., SpawnPlan] | None = None,
        limits: Limits | None = None,
        runner: Runner | None = None,
        on_change: Callable[[Process], object] | None = None,
    ):
        self.store = store
        self.providers = providers
        self.daemon_id = daemon_id
        self.linger = linger
        self.project = (project or Path.cwd()).resolve()
        self.planner = planner or bare_plan
        self.limits = limits or Limits()  # defaults for what neither request nor agent sets
        self.tracer = Tracer(store, self._committed)
        self.runner = runner or InlineRunner()  # where agent loops run
        self._on_change = on_change or (lambda proc: None)  # what proc/ shows changed (kernel/procfs.py)
        self.host_pids: dict[int, int] = {}  # host pid of a running Bash command -> its agent
        self.table: dict[int, Process] = {}
        self._sorted: list[int] = []
        self._pids: collections.deque[int] = collections.deque()
        self._pid_lock = trio.Lock()
        self._nursery: trio.Nursery | None = None
        self._zombies: collections.deque[tuple[float, int]] = collections.deque()
        self._zombie_added = trio.Event()
        self.started = time.time()

    # -- service ---------------------------------------------------------------
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._reaper)
            task_status.started()
            await trio.sleep_forever()

    async def shutdown(self) -> None:
        """Kill what runs, retire zombies, and wait for the records to commit."""
        for proc in list(self.table.values()):
            if proc.alive:
                proc.error = SyscallError(Code.INTERNAL, "daemon shutting down", syscall="Exit",
                                          pid=proc.pid).to_dict()
                proc.cancel_scope.cancel()
        for proc in list(self.table.values()):
            await proc.exited_event.wait()
        for pid in list(self.table):
            self.reap(pid, quiet=True)
        await self.barrier()

    # -- queries -----------------------------------------------------------------
    def get(self, pid: int) -> Process:
        proc = self.table.get(pid)
        if proc is None:
            raise SyscallError(Code.NOT_FOUND, f"no process {pid}", pid=pid)
        return proc

    def pids(self) -> list[int]:
        return self._sorted

    def counts(self) -> dict[str, int]:
        c = collections.Counter(p.state.value for p in self.table.values())
        c["paused"] = sum(1 for p in self.table.values() if p.paused)
        return dict(c)

    def system_prompt(self, proc: Process) -> str:
        return proc.system_prompt or DEFAULT_SYSTEM_PROMPT

    def price(self, proc: Process, usage) -> float:
        return self.providers.price(proc.active_provider, proc.active_model, usage)

    def charge(self, proc: Process, tokens: int, cost: float) -> Account:
        """A step's spend, charged up the account chain (ancestors pay too)."""
        proc.account.charge(tokens, cost)
        return proc.account

    # -- ports.KernelPort: what the Spawn, Wait and Bash tools ask ---------------------
    async def spawn_child(self, parent: Process, intent: str, agent: str | None) -> int:
        child = await self.spawn(SpawnRequest(intent=intent, agent=agent), ppid=parent.pid)
        return child.pid

    async def is_child(self, parent: Process, pid: int) -> bool:
        child = self.table.get(pid)
        return child is not None and child.ppid == parent.pid

    async def wait_child(self, parent: Process, pid: int) -> tuple[str, str]:
        child = self.get(pid)
        await child.exited_event.wait()
        return child.wait_line(), child.result or ""

    async def host_started(self, host_pid: int, pid: int) -> None:
        self.host_pids[host_pid] = pid

    def host_ended(self, host_pid: int) -> None:
        self.host_pids.pop(host_pid, None)

    # -- spawn ---------------------------------------------------------------------
    def check(self, req: SpawnRequest) -> tuple[SpawnPlan, object, str]:
        """Validate a request against agents, providers, skills and the
        project; returns (plan, driver, cwd). Raises, spawns nothing."""
        cwd = self._check_cwd(req.cwd)
        drivers = {n: self.providers.get(n).default_model for n in self.providers.names()}
        plan = self.planner(req, default_provider=self.providers.default_name,
                            driver_models=drivers, cwd=self.project / cwd)
        provider = plan.provider or self.providers.default_name
        try:
            driver = self.providers.get(provider)
        except KeyError:
            raise SyscallError(Code.NOT_FOUND, f'provider "{provider}" not found', syscall="Spawn",
                               device="/proc/new") from None
        plan.provider = provider
        return plan, driver, cwd

    def _check_cached(self, req: SpawnRequest) -> tuple[SpawnPlan, object, str] | None:
        """``check`` from the planner's cache, without touching the disk, or
        None. A planner may offer ``cached`` (``catalog.PlanCache``)."""
        cached = getattr(self.planner, "cached", None)
        if cached is None or req.cwd is not None:  # a cwd is resolved on disk
            return None
        drivers = {n: self.providers.get(n).default_model for n in self.providers.names()}
        plan = cached(req, default_provider=self.providers.default_name, driver_models=drivers,
                      cwd=self.project)
        if plan is None:
            return None
        provider = plan.provider or self.providers.default_name
        try:
            driver = self.providers.get(provider)
        except KeyError:
            return None  # check() says why
        plan.provider = provider
        return plan, driver, "."

    async def spawn(self, req: SpawnRequest, *, ppid: int = 0) -> Process:
        """Validate everything first, so a bad request spawns nothing."""
        # Resolving agents and skills reads the disk: not on the event loop,
        # unless the planner has this plan already (a burst of spawns).
        checked = self._check_cached(req)
        plan, driver, cwd = checked or await trio.to_thread.run_sync(self.check, req)
        parent = self.table.get(ppid) if ppid else None
        if parent is None or not parent.alive:
            ppid, parent = 0, None
        ceiling = None
        if parent is not None and parent.allowed_tools:
            # a child never holds a tool its parent lacks (empty = unrestricted)
            ceiling = list(parent.allowed_tools)
            plan.allowed_tools = intersect(plan.allowed_tools, parent.allowed_tools) or [NO_TOOLS]
        if self._nursery is None:
            raise SyscallError(Code.INTERNAL, "kernel is not running", syscall="Spawn")
        self.store.check_writable()  # a degraded store refuses spawns (ENOSPC/EROFS)
        if parent is not None:
            self._check_child_limits(parent)
        budget = self._budget(req, plan)
        account = self._account(budget, parent)
        # counted before the next await, so concurrent spawns cannot all pass the caps
        self._count_child(parent, +1)
        try:
            pid = await self._next_pid()
        except BaseException:
            self._count_child(parent, -1)
            raise
        account.pid = pid
        proc = Process(
            pid=pid, intent=req.intent, ppid=ppid, agent=plan.agent, skills=list(plan.skills),
            provider=plan.provider, model=plan.model or getattr(driver, "default_model", None),
            allowed_tools=list(plan.allowed_tools), system_prompt=plan.system_prompt,
            usable_skills=plan.usable_skills, skill_grants=plan.skill_grants, tool_ceiling=ceiling,
            mcp_servers=list(plan.mcp_servers), mcp_inline=dict(plan.mcp_inline),
            spare_model=plan.fallback_model, spare_provider=plan.fallback_provider,
            reasoning_effort=plan.reasoning_effort, planning=plan.planning,
            warnings=list(plan.warnings), budget=budget, account=account,
            cwd=cwd, env=dict(req.env), daemon=self.daemon_id,
        )
        self.table[pid] = proc
        self._sorted.append(pid)  # PIDs grow, so appending keeps it sorted
        if ppid:
            self.table[ppid].children.add(pid)
        parent = f", ppid={ppid}" if ppid else ""
        self.tracer.emit(proc, "Spawn", f"{quote(proc.intent)}, agent={plan.agent}, provider={plan.provider}{parent}",
                         f"PID({pid})", dur_ms=0)
        for warning in proc.warnings:  # what the manifest asks and rnixfs does not do: never silent
            self.tracer.emit(proc, "Warning", quote(warning, 200), "0", dur_ms=0)
        self.checkpoint(proc)
        self.store.put_audit(self.daemon_id, "spawn", {"pid": pid, "ppid": ppid, "agent": plan.agent,
                                                       "provider": plan.provider})
        self._nursery.start_soon(self._run_process, proc)
        return proc

    def _budget(self, req: SpawnRequest, plan: SpawnPlan) -> Budget:
        """The request's budgets over the agent manifest's over the daemon's
        Limits: unset (None) or 0 in a manifest means "the default", never
        unlimited; a request's 0 turns a duration off."""
        b, limits = plan.budget, self.limits

        def pick(name, zero_is_off=False):
            for value in (getattr(req, name, None), b.get(name)):
                if value is None or (value == 0 and not zero_is_off):
                    continue  # unset, or a count of 0: the next level decides
                return value or None  # a duration of 0: off
            return getattr(limits, name)

        return Budget(max_steps=pick("max_steps"), max_tokens=pick("max_tokens"),
                      max_cost=pick("max_cost"), step_timeout=pick("step_timeout", True),
                      context_budget=pick("context_budget"), max_time=pick("max_time", True),
                      ctx_size=b.get("ctx_size") or None)

    def _check_child_limits(self, parent: Process) -> None:
        """A parent may not start children past its caps or its budgets."""
        def refuse(cause: str):
            return SyscallError(Code.AGAIN, cause, syscall="Spawn", pid=parent.pid, device="/proc/new")

        limits = self.limits
        if parent.spawned >= limits.max_children:
            raise refuse(f"PID {parent.pid} has started {parent.spawned} children; "
                         f"max_children is {limits.max_children}")
        for a in parent.account.chain():
            if a.descendants >= limits.max_descendants:
                raise refuse(f"PID {a.pid} has {a.descendants} descendants; "
                             f"max_descendants is {limits.max_descendants}")
        over = parent.account.over(strict=False)
        if over is not None:
            name, owner = over
            raise refuse(f"{name} of PID {owner.pid} is used up: no budget left for a child")
        deadline = min((a.deadline for a in parent.account.chain() if a.deadline is not None), default=None)
        if deadline is not None and time.monotonic() >= deadline:
            raise refuse(f"max_time of PID {parent.pid} has run out: no time left for a child")

    @staticmethod
    def _count_child(parent: Process | None, n: int) -> None:
        if parent is not None:
            parent.spawned += n
            for a in parent.account.chain():
                a.descendants += n

    def _account(self, budget: Budget, parent: Process | None) -> Account:
        """A child's limits are min(its own, what its ancestors have left)."""
        account = Account(0, budget.max_tokens, budget.max_cost, parent=parent.account if parent else None)
        if parent is not None:
            left = parent.account.remaining_tokens()
            if left is not None:
                budget.max_tokens = max(0, min(left, budget.max_tokens or left))
            left_cost = parent.account.remaining_cost()
            if left_cost is not None:
                budget.max_cost = max(0.0, min(left_cost, budget.max_cost or left_cost))
            deadline = min((a.deadline for a in parent.account.chain() if a.deadline is not None),
                           default=None)
            if deadline is not None:
                left_time = max(0.001, deadline - time.monotonic())
                budget.max_time = min(left_time, budget.max_time or left_time)
        return account

    def _check_cwd(self, cwd: str | None) -> str:
        if cwd is None:
            return "."
        try:
            target = Path(os.path.realpath(self.project / cwd))  # never raises on loops
        except (OSError, ValueError):
            raise SyscallError(Code.INVALID, f"cwd {cwd!r} cannot be resolved", syscall="Spawn") from None
        if target != self.project and self.project not in target.parents:
            raise SyscallError(Code.PERMISSION, f"cwd {cwd!r} is outside the project", syscall="Spawn")
        if not target.is_dir():
            raise SyscallError(Code.NOT_FOUND, f"cwd {cwd!r} is not a directory", syscall="Spawn")
        return str(target.relative_to(self.project)) or "."

    async def _next_pid(self) -> int:
        if self._pids and not self._pid_lock.locked():
            return self._pids.popleft()  # no checkpoint: a spawn burst never yields here
        async with self._pid_lock:
            if not self._pids:
                block = await trio.to_thread.run_sync(self.store.reserve_pids, PID_BLOCK)
                self._pids.extend(block)
            return self._pids.popleft()

    async def _run_process(self, proc: Process) -> None:
        code, error = EXIT_ERROR, None
        with proc.cancel_scope:
            proc.move_to(State.RUNNING)
            proc.started = time.time()
            if proc.budget.max_time is not None:
                proc.account.deadline = time.monotonic() + proc.budget.max_time
            self.checkpoint(proc)
            timer = trio.CancelScope(deadline=trio.current_time() + (proc.budget.max_time or float("inf")))
            try:
                with timer:  # max_time: wall clock, steps and waits included
                    code = await self.runner.run(self, proc)
                if timer.cancelled_caught:
                    raise budget_error(proc, "max_time", f"ran {proc.budget.max_time:g}s", EXIT_MAX_TIME)
            except Exception as exc:  # ProcessExit, SyscallError, or a bug: never the daemon's end
                code, error = outcome(exc, proc.pid)
        if proc.cancel_scope.cancelled_caught:
            code = EXIT_KILLED
            if proc.error is None:
                error = SyscallError(Code.INTERRUPTED, "killed", syscall="Exit", pid=proc.pid)
        await self._exit(proc, code, error)

    async def _exit(self, proc: Process, code: int, error: SyscallError | None) -> None:
        proc.exit_code = code
        proc.exited = time.time()
        if error is not None:
            error.pid = proc.pid
            proc.error = error.to_dict()
        for child in proc.children:
            if child in self.table:
                self.table[child].ppid = 0
                self.checkpoint(self.table[child])
        proc.children.clear()  # reparented: they are no longer this process's
        self.tracer.emit(proc, "Exit", str(code), "?", dur_ms=0, error=error)
        # Zombie only once the exit record is durable: a reader that sees the
        # zombie can trust the store has it.
        proc.paused = False
        record = proc.status()
        record["state"] = State.ZOMBIE.value
        done = trio.Event()
        self.store.put_process(record, proc.result, on_commit=done.set)
        with trio.CancelScope(shield=True):
            await done.wait()
        proc.move_to(State.ZOMBIE)
        self._on_change(proc)
        proc.exited_event.set()
        proc.trace_event.set()
        self._zombies.append((time.monotonic() + self.linger, proc.pid))
        self._zombie_added.set()

    def changed(self, proc: Process) -> None:
        """The record changed outside the kernel (a worker's status report):
        what proc/ shows is rendered again."""
        self._on_change(proc)

    def checkpoint(self, proc: Process) -> None:
        """Queue the current status for the store (batched, off the loop)."""
        self.store.put_process(proc.status(), proc.result)
        self._on_change(proc)

    def _committed(self, proc: Process, line: str, js: str) -> None:
        proc.trace += line.encode()
        proc.events += js.encode()
        self._on_change(proc)
        proc.trace_event.set()
        proc.trace_event = trio.Event()

    async def barrier(self) -> None:
        done = trio.Event()
        self.store.put_barrier(done.set)
        with trio.CancelScope(shield=True):
            await done.wait()

    # -- signals ---------------------------------------------------------------------
    async def signal(self, pid: int, command: str) -> None:
        command = command.strip()
        if command not in SIGNALS:
            raise SyscallError(Code.INVALID, f"unknown command {command[:40]!r}; use one of: {' '.join(SIGNALS)}",
                               syscall="Signal", pid=pid)
        proc = self.get(pid)
        if command == "reap":
            if proc.alive:
                raise SyscallError(Code.BUSY, "process is still running; term or kill it first",
                                   syscall="Signal", pid=pid)
            self.reap(pid)
            return
        if not proc.alive:
            raise SyscallError(Code.NO_PROCESS, f"process {pid} has already exited", syscall="Signal", pid=pid)
        self.tracer.emit(proc, "Signal", command, "0", dur_ms=0)
        self.store.put_audit(self.daemon_id, "signal", {"pid": pid, "command": command})
        if command == "term":
            proc.term_requested = True
            proc.resume_event.set()
        elif command == "kill":
            proc.cancel_scope.cancel()
        elif command == "killtree":
            for p in self._descendants(proc):
                if p.alive:
                    self.tracer.emit(p, "Signal", "kill", "0", dur_ms=0)
                    p.cancel_scope.cancel()
                    self.runner.signal(p, "kill")
            proc.cancel_scope.cancel()
        elif command == "pause":
            proc.paused = True
        elif command == "resume":
            proc.paused = False
            proc.resume_event.set()
        self.runner.signal(proc, "kill" if command == "killtree" else command)
        self.checkpoint(proc)

    def _descendants(self, proc: Process) -> list[Process]:
        out, todo = [], list(proc.children)
        while todo:
            child = self.table.get(todo.pop())
            if child is not None:
                out.append(child)
                todo.extend(child.children)
        return out

    def agent_of(self, host_pid: int) -> int | None:
        """The agent whose Bash command is ``host_pid`` or one of its ancestors."""
        pid = host_pid
        for _ in range(64):
            if pid in self.host_pids:
                owner = self.host_pids[pid]
                return owner if owner in self.table else None
            owner = self.runner.owner_of(pid)  # a worker whose command's pid is not here yet
            if owner is not None:
                return owner if owner in self.table else None
            try:
                pid = psutil.Process(pid).ppid()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                return None
            if pid <= 1:
                return None
        return None

    async def steer(self, pid: int, text: str) -> None:
        proc = self.get(pid)
        if not proc.alive:
            raise SyscallError(Code.NO_PROCESS, f"process {pid} has already exited", syscall="Steer", pid=pid)
        proc.pending_input.append(text)
        self._on_change(proc)
        proc.input_event.set()
        proc.input_event = trio.Event()
        self.runner.steer(proc, text)

    def reap(self, pid: int, *, quiet: bool = False) -> None:
        proc = self.table.pop(pid, None)
        if proc is None:
            return
        i = bisect.bisect_left(self._sorted, pid)
        if i < len(self._sorted) and self._sorted[i] == pid:
            del self._sorted[i]
        proc.move_to(State.DEAD)
        self._on_change(proc)
        self.store.put_process(proc.status(), proc.result)
        if proc.ppid in self.table:
            self.table[proc.ppid].children.discard(pid)

    async def _reaper(self) -> None:
        """Zombies linger, then die; deadlines arrive in FIFO order."""
        while True:
            if not self._zombies:
                self._zombie_added = trio.Event()
                await self._zombie_added.wait()
                continue
            deadline, pid = self._zombies[0]
            now = time.monotonic()
            if deadline > now:
                with trio.move_on_after(deadline - now):
                    self._zombie_added = trio.Event()
                    await self._zombie_added.wait()
                continue
            self._zombies.popleft()
            proc = self.table.get(pid)
            if proc is not None and proc.state == State.ZOMBIE:
                self.reap(pid)
