"""Syscall events: one strace-style line and one JSON line per syscall.

Events go to the store first; the process's readable trace grows only when
the store reports the commit (see ``Store``), so nothing is ever dropped
and nothing visible is ever lost.
"""
from __future__ import annotations

import json
import time
from contextlib import asynccontextmanager

import trio

from .errors import Code, SyscallError
from .process import Process

MAX_ARG = 80


def quote(text: str, limit: int = MAX_ARG) -> str:
    """A short, one-line, double-quoted rendering of text (strace-like)."""
    short = text if len(text) <= limit else text[:limit] + "…"
    return json.dumps(short, ensure_ascii=False)


def format_line(t: float, syscall: str, args: str, result: str, dur_ms: float | None) -> str:
    dur = "" if dur_ms is None else f"    {dur_ms:.0f}ms"
    return f"[{t:7.3f}s] {syscall}({args}) = {result}{dur}\n"


def _cancelled(exc: BaseException) -> bool:
    """A kill: Cancelled, or a group of nothing but Cancelled (a cancelled nursery)."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(trio.Cancelled)[1] is None
    return isinstance(exc, trio.Cancelled)


class Call:
    """The mutable outcome of a traced syscall (set ``result`` inside)."""

    __slots__ = ("result",)

    def __init__(self) -> None:
        self.result = "0"


class Tracer:
    def __init__(self, store, on_commit):
        self._store = store
        self._on_commit = on_commit  # (proc, line, json) -> None, called on commit

    def emit(self, proc: Process, syscall: str, args: str, result: str,
             *, t: float | None = None, dur_ms: float | None = None,
             error: SyscallError | None = None) -> None:
        rel = (time.monotonic() - proc.t0) if t is None else t
        proc.seq += 1
        line = format_line(rel, syscall, args, result, dur_ms)
        event = {
            "pid": proc.pid,
            "seq": proc.seq,
            "ts": time.time(),
            "t": round(rel, 6),
            "syscall": syscall,
            "args": args,
            "result": result,
            "dur_ms": None if dur_ms is None else round(dur_ms, 3),
            "error": error.to_dict() if error else None,
        }
        js = json.dumps(event, ensure_ascii=False) + "\n"
        self._store.put_event(
            proc.pid, proc.seq, line, js,
            on_commit=lambda: self._on_commit(proc, line, js),
        )

    @asynccontextmanager
    async def syscall(self, proc: Process, syscall: str, args: str, *, device: str = ""):
        """Trace a syscall; a SyscallError inside is recorded and re-raised."""
        start = time.monotonic()
        call = Call()
        try:
            yield call
        except SyscallError as exc:
            exc.pid = proc.pid if exc.pid is None else exc.pid
            exc.syscall = exc.syscall or syscall
            exc.device = exc.device or device
            self._finish(proc, syscall, args, f"-1 {exc}", start, exc)
            raise
        except BaseException as exc:
            # Cancellation (kill) or a bug: still leave the line behind.
            err = SyscallError(Code.INTERNAL, type(exc).__name__, syscall=syscall,
                               pid=proc.pid, device=device)
            if _cancelled(exc):
                err = SyscallError(Code.INTERRUPTED, "killed", syscall=syscall,
                                   pid=proc.pid, device=device)
            self._finish(proc, syscall, args, f"-1 {err}", start, err)
            raise
        else:
            self._finish(proc, syscall, args, call.result, start, None)

    def _finish(self, proc, syscall, args, result, start, err) -> None:
        dur = (time.monotonic() - start) * 1000
        self.emit(proc, syscall, args, result, t=start - proc.t0, dur_ms=dur, error=err)
