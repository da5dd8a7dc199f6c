"""The daemon side of the workers: ``WorkerPool`` is a kernel ``Runner``
that runs each process's loop in a worker process (docs/architecture.md,
"Workers and the kernel protocol").

The pool starts ``python -m rnixfs.worker`` children, each with one end of a
socketpair, and gives each new process to the least-loaded worker. It
answers the workers' requests against the kernel (trace lines, status,
charges, spawns, waits, host pids, MCP) on the daemon's loop, where each is
a dictionary update or an await — never a model request, a tool or disk
I/O. A worker that dies takes only its processes: they exit with
``EXIT_WORKER_LOST`` and a replacement starts.
"""
from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

import trio

from ..kernel.errors import Code, SyscallError
from ..kernel.loop import ProcessExit
from ..kernel.process import EXIT_OK, EXIT_WORKER_LOST, Process
from . import protocol, spec
from .channel import Channel
from .host import error_from_dict
from .protocol import ProtocolError

log = logging.getLogger(__name__)

KILL_WAIT = 15.0      # seconds a killed loop has to report its exit before it counts as lost
START_TIMEOUT = 60.0  # seconds a new worker has to say hello
STOP_GRACE = 5.0      # seconds a worker has to leave after its socket closes
RESTART_PAUSE = 1.0   # between replacements of a worker that keeps dying at start
START_FAILURES = 3    # workers in a row that never became ready: spawns fail instead of waiting


@dataclass(eq=False)
class RemoteRun:
    proc: Process
    worker: "Worker"
    done: trio.Event = field(default_factory=trio.Event)
    exit: protocol.Exit | None = None
    lost: str | None = None


@dataclass(eq=False)
class Worker:
    index: int
    process: trio.Process
    channel: Channel
    runs: dict[int, RemoteRun] = field(default_factory=dict)
    requests: dict[int, trio.CancelScope] = field(default_factory=dict)  # req -> its answer's scope
    ready: bool = False
    gone: bool = False

    @property
    def pid(self) -> int:
        return self.process.pid


class WorkerPool:
    """A kernel Runner over ``size`` worker processes."""

    def __init__(self, size: int, configure: protocol.Configure, *, mcp=None, log_path: str = "",
                 log_level: str = "INFO", command: list[str] | None = None):
        if size < 1:
            raise ValueError("a worker pool has at least one worker (workers: 0 runs loops inline)")
        self.size = size
        self.configure = configure
        self.mcp = mcp
        self.log_path = log_path
        self.log_level = log_level
        # the worker program; it gets --fd N --log PATH --log-level LEVEL
        self.command = command or [sys.executable, "-m", "rnixfs.worker"]
        self.start_failures = 0  # in a row; a ready worker resets it
        self.last_failure = ""
        self.workers: list[Worker] = []
        self.kernel = None
        self._nursery: trio.Nursery | None = None
        self._changed = trio.Event()
        self._closing = False
        self.lost = 0  # workers lost since the start (rnixfs status)

    # -- service ---------------------------------------------------------------------------
    async def run_service(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Start the workers and keep ``size`` of them alive until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for i in range(self.size):
                nursery.start_soon(self._keep_worker, i)
            task_status.started()

    async def aclose(self) -> None:
        """End every worker and reap it (no orphan): close its socket, wait,
        then kill."""
        self._closing = True
        with trio.CancelScope(shield=True):
            for w in list(self.workers):
                await w.channel.aclose()
            for w in list(self.workers):
                with trio.move_on_after(STOP_GRACE):
                    await w.process.wait()
                if w.process.returncode is None:
                    w.process.kill()
                    await w.process.wait()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def describe(self) -> dict:
        return {"workers": self.size, "pids": [w.pid for w in self.workers if not w.gone],
                "ready": sum(1 for w in self.workers if w.ready),
                "running": {str(w.pid): len(w.runs) for w in self.workers if not w.gone},
                "lost": self.lost}

    async def _keep_worker(self, index: int) -> None:
        while not self._closing:
            started = time.monotonic()
            try:
                await self._one_worker(index)
            except Exception as exc:  # whatever a worker did, the daemon stays up
                if self._closing:
                    log.info("worker %d ended at umount: %s", index, _reason(exc))
                    return
                log.error("worker %d failed: %s", index, _reason(exc))
                self.start_failures += 1
                self.last_failure = _reason(exc)
                self._wake()
            if self._closing:
                return
            self.lost += 1
            if time.monotonic() - started < 5:
                await trio.sleep(RESTART_PAUSE)  # a worker that cannot start: no busy loop

    async def _one_worker(self, index: int) -> None:
        ours, theirs = socket.socketpair()
        with ours, theirs:
            cmd = [*self.command, "--fd", str(theirs.fileno()), "--log", self.log_path,
                   "--log-level", self.log_level]
            process = await trio.lowlevel.open_process(
                cmd, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, start_new_session=False)
            theirs.close()
            stream = trio.SocketStream(trio.socket.from_stdlib_socket(ours.dup()))
        w = Worker(index, process, Channel(stream, name=f"worker {process.pid}"))
        self.workers.append(w)
        reason = "its connection closed"
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(w.channel.writer)
                with trio.fail_after(START_TIMEOUT):
                    await w.channel.handshake("kernel", "worker", pid=os.getpid())
                    w.channel.send(self.configure)
                    ready = await w.channel.receive()
                if not isinstance(ready, protocol.Ready):
                    raise ProtocolError(f"expected ready, got {getattr(ready, 'kind', 'EOF')}")
                w.ready = True
                self.start_failures = 0
                self._wake()
                log.info("worker %d started (pid %d)", index, process.pid)
                try:
                    await self._serve(w, nursery)
                except ProtocolError as exc:
                    reason = f"it broke the protocol: {exc}"
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await w.channel.aclose()
                if process.returncode is None:
                    with trio.move_on_after(STOP_GRACE if self._closing else 0.5):
                        await process.wait()
                if process.returncode is None:
                    process.kill()
                    await process.wait()
            if process.returncode is not None and process.returncode < 0:
                reason = f"it died of signal {-process.returncode}"
            elif process.returncode:
                reason = f"it exited with status {process.returncode}"
            self._lose(w, reason)

    def _lose(self, w: Worker, reason: str) -> None:
        was_ready = w.ready
        w.gone, w.ready = True, False
        if w in self.workers:
            self.workers.remove(w)
        if was_ready and not self._closing:  # one that never started: _keep_worker says why
            log.error("worker pid %d lost (%s): %d processes end with exit %d", w.pid, reason,
                      len(w.runs), EXIT_WORKER_LOST)
        for scope in w.requests.values():
            scope.cancel()
        for run in list(w.runs.values()):
            run.lost = f"worker process {w.pid} was lost: {reason}"
            run.done.set()
        w.runs.clear()
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    # -- kernel.runner.Runner ----------------------------------------------------------------
    async def run(self, kernel, proc: Process) -> int:
        self.kernel = kernel
        w = await self._pick()
        w.channel.send(protocol.Start(pid=proc.pid, spec=spec.to_spec(proc)))  # raises before it counts
        run = w.runs[proc.pid] = RemoteRun(proc, w)
        try:
            await run.done.wait()
        except trio.Cancelled:
            # kill or max_time: the worker cancels the loop; its last lines come first
            w.channel.send(protocol.Signal(pid=proc.pid, command="kill"))
            with trio.CancelScope(shield=True), trio.move_on_after(KILL_WAIT):
                await run.done.wait()
            self._settle(run)
            raise  # the kernel decides the code: killed, or max_time
        return self._finish(run)

    def _settle(self, run: RemoteRun) -> None:
        """The record takes the loop's last fields and result."""
        run.worker.runs.pop(run.proc.pid, None)
        if run.exit is not None:
            spec.apply_fields(run.proc, run.exit.fields)
            run.proc.result = run.exit.result

    def _finish(self, run: RemoteRun) -> int:
        self._settle(run)
        if run.exit is None:
            raise ProcessExit(EXIT_WORKER_LOST, SyscallError(
                Code.INTERNAL, run.lost or "the worker did not report the exit", syscall="Exit",
                pid=run.proc.pid))
        msg = run.exit
        err = error_from_dict(msg.error)
        if msg.code == EXIT_OK and err is None:
            return EXIT_OK
        raise ProcessExit(msg.code, err)

    def signal(self, proc: Process, command: str) -> None:
        run = self._run_of(proc.pid)
        if run is not None and command in ("term", "kill", "pause", "resume"):
            run.worker.channel.send(protocol.Signal(pid=proc.pid, command=command))

    def steer(self, proc: Process, text: str) -> None:
        run = self._run_of(proc.pid)
        if run is not None:
            run.worker.channel.send(protocol.Steer(pid=proc.pid, text=text))

    def owner_of(self, host_pid: int) -> int | None:
        """A command's exact host pid reaches the kernel a message after the
        command started; a proc/new write from it in between walks up to its
        worker. The worker reported the /dev/shell fd before it started the
        command, so if one process of that worker has it open, that one ran it."""
        for w in self.workers:
            if w.pid == host_pid:
                shells = [r.proc.pid for r in w.runs.values() if "/dev/shell" in r.proc.fds.values()]
                return shells[0] if len(shells) == 1 else None
        return None

    def _run_of(self, pid: int) -> RemoteRun | None:
        for w in self.workers:
            if pid in w.runs:
                return w.runs[pid]
        return None

    async def _pick(self) -> Worker:
        """The ready worker with the fewest processes (waits for one to start)."""
        while True:
            ready = [w for w in self.workers if w.ready]
            if ready:
                return min(ready, key=lambda w: len(w.runs))
            if self._closing:
                raise SyscallError(Code.INTERNAL, "the daemon is shutting down", syscall="Spawn")
            if self.start_failures >= START_FAILURES:
                raise SyscallError(Code.INTERNAL, f"no worker process could start ({self.start_failures} "
                                   f"failed in a row; last: {self.last_failure}); see the daemon log",
                                   syscall="Spawn")
            await self._changed.wait()

    # -- the workers' requests -----------------------------------------------------------------
    async def _serve(self, w: Worker, nursery: trio.Nursery) -> None:
        while True:
            msg = await w.channel.receive()
            if msg is None:
                return
            if isinstance(msg, protocol.Cancel):
                scope = w.requests.get(msg.req)
                if scope is not None:
                    scope.cancel()
                continue
            if isinstance(msg, protocol.HostEnded):
                self.kernel.host_ended(msg.host_pid)
                continue
            if isinstance(msg, (protocol.McpSpecs, protocol.McpCall)):
                self._start_answer(w, nursery, None, msg)  # MCP sessions are shared: no process needed
                continue
            run = w.runs.get(getattr(msg, "pid", 0))
            if run is None:
                if hasattr(msg, "req"):
                    w.channel.answer(msg.req, error=SyscallError(
                        Code.NO_PROCESS, "the process has exited").to_dict())
                continue  # lines of a process already ended (killed past KILL_WAIT)
            proc = run.proc
            if isinstance(msg, protocol.Trace):
                if msg.fields:  # shown with the line: its commit renders proc/ again
                    spec.apply_fields(proc, msg.fields)
                self.kernel.tracer.emit(proc, msg.syscall, msg.args, msg.result, t=msg.t,
                                        dur_ms=msg.dur_ms, error=error_from_dict(msg.error))
            elif isinstance(msg, protocol.Status):
                spec.apply_fields(proc, msg.fields)
                if msg.checkpoint:
                    self.kernel.checkpoint(proc)
                else:
                    self.kernel.changed(proc)
            elif isinstance(msg, protocol.Exit):
                run.exit = msg
                run.done.set()
            elif isinstance(msg, protocol.AccountQuery):
                w.channel.answer(msg.req, spec.account_to_wire(proc.account))
            elif isinstance(msg, protocol.Charge):
                if msg.tokens < 0 or not 0 <= msg.cost < float("inf"):
                    raise ProtocolError(f"charge of {msg.tokens} tokens, ${msg.cost}: a spend is never negative")
                w.channel.answer(msg.req, spec.account_to_wire(self.kernel.charge(proc, msg.tokens, msg.cost)))
            elif isinstance(msg, (protocol.Spawn, protocol.IsChild, protocol.Wait, protocol.HostStarted)):
                self._start_answer(w, nursery, proc, msg)
            else:
                raise ProtocolError(f"a worker may not send {msg.kind}")

    def _start_answer(self, w: Worker, nursery: trio.Nursery, proc: Process | None, msg) -> None:
        if msg.req in w.requests:
            raise ProtocolError(f"request {msg.req} is already open")
        scope = w.requests[msg.req] = trio.CancelScope()
        nursery.start_soon(self._answer, w, proc, msg, scope)

    async def _answer(self, w: Worker, proc: Process | None, msg, scope: trio.CancelScope) -> None:
        """One request that awaits (a spawn, a wait, an MCP call): its own
        task, so the worker's other messages go on; a Cancel ends it."""
        kernel = self.kernel
        with scope:
            try:
                if isinstance(msg, protocol.McpSpecs):
                    value = list(await self._mcp().tool_specs(msg.servers, self._inline(msg.servers, msg.inline)))
                elif isinstance(msg, protocol.McpCall):
                    value = list(await self._mcp().call_tool(msg.server, msg.tool, msg.args, msg.limit))
                elif isinstance(msg, protocol.Spawn):
                    value = await kernel.spawn_child(proc, msg.intent, msg.agent)
                elif isinstance(msg, protocol.IsChild):
                    value = await kernel.is_child(proc, msg.child)
                elif isinstance(msg, protocol.Wait):
                    value = list(await kernel.wait_child(proc, msg.child))
                else:
                    value = await kernel.host_started(msg.host_pid, proc.pid)
                w.channel.answer(msg.req, value)
            except SyscallError as exc:
                w.channel.answer(msg.req, error=exc.to_dict())
            except Exception as exc:  # a bug answers the loop, never ends the daemon
                log.exception("answering %s of worker %d", msg.kind, w.pid)
                w.channel.answer(msg.req, error=SyscallError(Code.INTERNAL, repr(exc)[:300]).to_dict())
            finally:
                w.requests.pop(msg.req, None)

    def _inline(self, servers: list, refs: dict) -> dict:
        """Inline MCP servers travel to a worker as references to the
        process that declared them (``spec.to_spec``); the configs used are
        the kernel's own, never what a worker sends."""
        out = {}
        for name, ref in refs.items():
            pid = ref.get("pid") if isinstance(ref, dict) else None
            proc = self.kernel.table.get(pid) if isinstance(pid, int) else None
            if proc is not None and name in proc.mcp_inline and name in servers:
                out[name] = proc.mcp_inline[name]
        return out

    def _mcp(self):
        if self.mcp is None:
            raise SyscallError(Code.NOT_FOUND, "no MCP servers are configured", device="/dev/mcp")
        return self.mcp


def _reason(exc: BaseException) -> str:
    """One line for a failure, also when a nursery wrapped it in a group."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"[:300]
