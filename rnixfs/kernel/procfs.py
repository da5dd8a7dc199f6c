"""What each proc/<pid> file holds: its bytes, its size, whether it can change.

The FUSE adapter only routes inodes to these answers (docs/architecture.md,
"proc/ files and their cache policy"). Rendering ``status`` is a JSON dump of
some forty fields, so the bytes are cached per process and rendered again
only after the process changed: the kernel reports changes through
``ProcFiles.changed`` (its ``on_change`` hook, called from every checkpoint
and trace commit), and a small fingerprint of the fields that move most
catches a change made between two hooks.
"""
from __future__ import annotations

import json
from enum import Enum

import trio

from .process import Process, State

# The names in a proc/<pid>/ directory, in listing order.
FILES = ("status", "intent", "context", "trace", "events", "ctl", "result", "wait", "fd", "plan")
WRITABLE = frozenset({"ctl", "context"})
CTL_HELP = b"term kill killtree pause resume reap\n"


class Kind(str, Enum):
    """How a file is read, which decides its cache policy in the adapter."""

    DIR = "dir"            # fd/
    SNAPSHOT = "snapshot"  # bytes taken at open: status, intent, context, ctl, result, plan
    STREAM = "stream"      # grows while the process runs: trace, events
    WAIT = "wait"          # blocks until exit


KINDS = {name: Kind.SNAPSHOT for name in FILES}
KINDS.update(fd=Kind.DIR, trace=Kind.STREAM, events=Kind.STREAM, wait=Kind.WAIT)


def _fingerprint(proc: Process) -> tuple:
    """Fields that change between checkpoints; cheap to read (no rendering)."""
    return (proc.state, proc.paused, proc.seq, len(proc.trace), proc.steps, proc.tokens_in,
            proc.tokens_out, len(proc.messages), len(proc.pending_input), proc.ppid, len(proc.fds),
            len(proc.children), proc.exit_code, proc.plan is None)


class _Rendered:
    __slots__ = ("key", "files")

    def __init__(self, key: tuple):
        self.key = key
        self.files: dict[str, bytes] = {}


class ProcFiles:
    """Rendered proc/<pid> files, cached per process until it changes."""

    def __init__(self) -> None:
        self._cache: dict[int, _Rendered] = {}
        self._watched: set[int] = set()
        self._dirty: set[int] = set()
        self._wake = trio.Event()

    def changed(self, proc: Process) -> None:
        """The kernel's ``on_change`` hook: ``proc`` changed. Its bytes are
        forgotten, and those of every ancestor (whose ``status`` shows what
        the tree spent); watched ones are reported by ``next_changes``."""
        pids = [proc.pid]
        if proc.account is not None:
            pids += [a.pid for a in proc.account.chain() if a.pid != proc.pid]
        for pid in pids:
            self._cache.pop(pid, None)
            if pid in self._watched:
                self._dirty.add(pid)
                self._wake.set()
        if proc.state == State.DEAD:
            self._watched.discard(proc.pid)

    def watch(self, pid: int) -> None:
        """Report the next change of ``pid`` (someone holds a cached copy)."""
        self._watched.add(pid)

    async def next_changes(self) -> set[int]:
        """Watched pids that changed since the last call (waits for one).
        They are no longer watched until ``watch`` is called again."""
        while not self._dirty:
            await self._wake.wait()
            self._wake = trio.Event()
        dirty, self._dirty = self._dirty, set()
        self._watched -= dirty
        return dirty

    def frozen(self, proc: Process, name: str | None = None) -> bool:
        """True once ``name`` (the directory itself if None) changes no
        more on its own: the intent always, everything of a zombie. (A
        zombie can still be reparented or reaped: ``changed`` reports it.)"""
        return name == "intent" or not proc.alive

    def content(self, proc: Process, name: str) -> bytes:
        """The bytes of a snapshot file (Kind.SNAPSHOT, and ``wait`` once exited)."""
        key = _fingerprint(proc)
        entry = self._cache.get(proc.pid)
        if entry is None or entry.key != key:
            entry = self._cache[proc.pid] = _Rendered(key)
        data = entry.files.get(name)
        if data is None:
            data = entry.files[name] = render(proc, name)
        return data

    def size(self, proc: Process, name: str) -> int:
        if name == "trace":
            return len(proc.trace)
        if name == "events":
            return len(proc.events)
        if name == "wait":
            return 0 if proc.alive else len(self.content(proc, "wait"))
        if name == "fd":
            return 0
        return len(self.content(proc, name))


def _text_file(text: str) -> bytes:
    return text.encode() + (b"" if text.endswith("\n") else b"\n")


def render(proc: Process, name: str) -> bytes:
    """The bytes of ``name`` right now, uncached."""
    if name == "status":
        return (json.dumps(proc.status(), indent=2, ensure_ascii=False) + "\n").encode()
    if name == "intent":
        return (proc.intent + "\n").encode()
    if name == "context":
        lines = [json.dumps(m, ensure_ascii=False) for m in proc.messages]
        lines += [json.dumps({"role": "user", "content": t, "pending": True}, ensure_ascii=False)
                  for t in proc.pending_input]
        return ("\n".join(lines) + "\n").encode() if lines else b""
    if name == "ctl":
        return CTL_HELP
    if name == "result":
        return b"" if proc.alive or proc.result is None else _text_file(proc.result)
    if name == "plan":  # agent.yaml planning: true; empty until the plan step answered
        return _text_file(proc.plan) if proc.plan else b""
    if name == "wait":
        return b"" if proc.alive else proc.wait_line().encode()
    raise KeyError(name)
