"""One open proc/new handle: collects writes into spawn requests.

Each write is one request (README.md, "proc/new"), except where
``request.framing`` knows a writer cuts one request into several writes;
a bad request fails the write that completes it, nothing is half spawned,
and the handle reads back one line per request: the PID or ``error: why``.
The FUSE adapter only forwards bytes and maps errors to errnos.
"""
from __future__ import annotations

import logging
from typing import Callable, Protocol

import trio

from . import request
from .errors import Code, SyscallError
from .process import Process
from .request import SpawnRequest

log = logging.getLogger(__name__)


class Spawner(Protocol):
    """What a proc/new handle needs from the kernel."""

    def check(self, req: SpawnRequest) -> object:
        """Refuse a bad request (raises SyscallError); blocking, run in a thread."""

    async def spawn(self, req: SpawnRequest, *, ppid: int = 0) -> Process: ...


class SpawnWriter:
    def __init__(self, spawner: Spawner, *, ppid: int = 0,
                 on_spawn: Callable[[Process], None] | None = None):
        self.spawner = spawner
        self.ppid = ppid  # the agent whose Bash command opened proc/new, or 0
        self.on_spawn = on_spawn
        self.pending = bytearray()  # bytes of a request not yet complete
        self.out = bytearray()  # what reading the handle returns
        self.cursor = 0

    async def feed(self, buf: bytes) -> int:
        """Take one write(); spawns when it completes a request."""
        self.pending += buf
        if len(self.pending) > request.MAX_REQUEST_BYTES:
            size = len(self.pending)
            self.pending.clear()
            cap = request.MAX_REQUEST_BYTES
            reason = (f"request is over {size} bytes; the cap is {cap}" if size > len(buf)
                      else f"request is {size} bytes; the cap is {cap}")
            self._error(reason)
            raise SyscallError(Code.TOO_BIG, reason, syscall="Spawn", device="/proc/new")
        framing = request.framing(bytes(self.pending), len(buf))
        if framing == "now":
            await self.finish()
        elif framing == "later":
            await self._check_early()
        return len(buf)

    async def finish(self) -> None:
        """Spawn from the pending bytes (on flush or read); one line back."""
        if not self.pending:
            return
        data = bytes(self.pending)
        self.pending.clear()
        try:
            proc = await self.spawner.spawn(request.parse(data), ppid=self.ppid)
        except SyscallError as exc:
            self._error(exc.cause)
            raise
        if self.on_spawn is not None:
            self.on_spawn(proc)
        self.out += f"{proc.pid}\n".encode()

    async def read(self, size: int) -> bytes:
        """The next PIDs / error lines; a pending request completes first
        (its failure is the next line read, and the daemon log says why)."""
        if self.pending:
            try:
                await self.finish()
            except SyscallError as exc:
                log.info("%s", exc)  # the caller reads the reason
        data = bytes(self.out[self.cursor:self.cursor + size])
        self.cursor += len(data)
        return data

    async def _check_early(self) -> None:
        """A YAML request waits for its last line, but what is already wrong
        fails this write (a missing intent may still come)."""
        try:
            req = request.parse(bytes(self.pending))
            if req.intent == bytes(self.pending).decode().strip():
                return  # no "intent" yet: plain text so far
            await trio.to_thread.run_sync(self.spawner.check, req)
        except SyscallError as exc:
            self.pending.clear()
            self._error(exc.cause)
            raise

    def _error(self, reason: str) -> None:
        self.out += f"error: {reason}\n".encode()
