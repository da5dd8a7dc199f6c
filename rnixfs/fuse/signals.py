"""Noticing that a FUSE caller has a pending signal.

pyfuse3 drops FUSE_INTERRUPT, so a handler that waits polls the caller's
``/proc/<tid>/status`` instead: a pending, unblocked signal (or a caller
that is gone) means "return EINTR now" (README.md, "Blocking reads
and Ctrl-C").
"""
from __future__ import annotations

import errno
import os
import time
from typing import Callable

import pyfuse3
import trio

POLL_INTERVAL = 0.1  # seconds; keeps EINTR well under the 200 ms promise


def signal_pending(tid: int) -> bool:
    try:
        with open(f"/proc/{tid}/status", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return True  # the caller is gone: nobody is waiting any more
    except OSError:
        return False
    pending = blocked = 0
    state = b""
    for line in data.split(b"\n"):
        if line.startswith((b"SigPnd:", b"ShdPnd:")):
            pending |= int(line.split()[1], 16)
        elif line.startswith(b"SigBlk:"):
            blocked = int(line.split()[1], 16)
        elif line.startswith(b"State:"):
            state = line.split()[1]
    if state in (b"Z", b"X"):
        return True
    return bool(pending & ~blocked)


_tree_at = 0.0
_tree: dict[int, list[int]] = {}


def _children_map() -> dict[int, list[int]]:
    """ppid -> children for the whole host, rebuilt at most twice per poll
    interval and shared by every waiting reader."""
    global _tree_at, _tree
    now = time.monotonic()
    if now - _tree_at < POLL_INTERVAL / 2:
        return _tree
    tree: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # the command name may hold spaces and parentheses: split after the last ")"
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1:
            tree.setdefault(int(fields[1]), []).append(int(name))
    _tree_at, _tree = now, tree
    return tree


def _has_children_files() -> bool:
    me = os.getpid()
    return os.path.exists(f"/proc/{me}/task/{me}/children")


_CHILDREN_FILES = _has_children_files()


def _children(pid: int) -> list[int]:
    """The children of ``pid``: from its threads' ``/proc/<pid>/task/<tid>/children``
    (a read per thread), else from ``_children_map`` (a scan of every
    process on the host, which cost the daemon ~10 % of its CPU while a
    ``wait`` read blocked, polled every POLL_INTERVAL)."""
    if not _CHILDREN_FILES:
        return _children_map().get(pid, [])
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    out: list[int] = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(x) for x in f.read().split())
        except (OSError, ValueError):
            continue
    return out


def reader_interrupted(opener: int, depth: int = 4) -> bool:
    """pyfuse3 gives a read no caller pid, so look at the process that opened
    the file and its descendants (the usual reader: `exec 3<>f; cat <&3`).

    True when the opener is gone, or it or a descendant has a signal pending.
    """
    if signal_pending(opener):
        return True
    level = _children(opener)
    for i in range(depth):
        if not level:
            return False
        for pid in level:
            if os.path.exists(f"/proc/{pid}") and signal_pending(pid):
                return True
        if i + 1 < depth:
            level = [c for pid in level for c in _children(pid)]
    return False


class BlockingSlots:
    """Reads that wait hold one of ``total`` slots, counted per uid so one
    user cannot take another's: the daemon's own user may use all but a
    quarter, which is kept for other users (each at most a quarter of it)."""

    def __init__(self, total: int, *, owner: int):
        self.total, self.owner = total, owner
        self.others_cap = total // 4
        self.per_other = max(1, self.others_cap // 4) if self.others_cap else 0
        self.held: dict[int, int] = {}
        self.others = 0
        self.mine = 0

    def acquire(self, uid: int) -> bool:
        if uid == self.owner:
            if self.mine >= self.total - self.others_cap:
                return False
            self.mine += 1
            return True
        if self.others >= self.others_cap or self.held.get(uid, 0) >= self.per_other:
            return False
        self.others += 1
        self.held[uid] = self.held.get(uid, 0) + 1
        return True

    def release(self, uid: int) -> None:
        if uid == self.owner:
            self.mine -= 1
            return
        self.others -= 1
        self.held[uid] -= 1
        if not self.held[uid]:
            del self.held[uid]


class Waits:
    """Reads that may wait (README.md, "Blocking reads and Ctrl-C"): each
    holds a slot, runs in a cancel scope watched every POLL_INTERVAL for a
    signal to its caller (then it is EINTR), and ends at shutdown."""

    def __init__(self, max_blocking: int, *, owner: int):
        self.slots = BlockingSlots(max_blocking, owner=owner)
        self._scopes: set[trio.CancelScope] = set()

    async def interruptible(self, uid: int, caller: int, work):
        if not self.slots.acquire(uid):
            raise pyfuse3.FUSEError(errno.EAGAIN)
        outcome: dict = {}
        scope = trio.CancelScope()
        self._scopes.add(scope)
        try:
            with scope:
                async with trio.open_nursery() as nursery:
                    async def watch():
                        while not reader_interrupted(caller):
                            await trio.sleep(POLL_INTERVAL)
                        scope.cancel()

                    async def run():
                        try:
                            outcome["value"] = await work()
                        except Exception as exc:  # re-raised below, outside the nursery
                            outcome["error"] = exc
                        nursery.cancel_scope.cancel()

                    nursery.start_soon(watch)
                    nursery.start_soon(run)
        finally:
            self._scopes.discard(scope)
            self.slots.release(uid)
        if "error" in outcome:
            raise outcome["error"]
        if "value" in outcome:
            return outcome["value"]
        raise pyfuse3.FUSEError(errno.EINTR)

    async def until(self, uid: int, caller: int, ready: Callable[[], bool],
                    changed: Callable[[], trio.Event]) -> None:
        """Wait until ``ready()``; EINTR as soon as the caller has a signal."""
        if ready():
            return

        async def until_ready():
            while not ready():
                await changed().wait()
            return True

        await self.interruptible(uid, caller, until_ready)

    def interrupt_all(self) -> None:
        """Shutdown: every waiting read answers EINTR now."""
        for scope in list(self._scopes):
            scope.cancel()
