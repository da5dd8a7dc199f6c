"""Noticing that a FUSE caller has a pending signal.

pyfuse3 drops FUSE_INTERRUPT, so a handler that waits polls the caller's
``/proc/<tid>/status`` instead: a pending, unblocked signal (or a caller
that is gone) means "return EINTR now" (README.md, "Blocking reads
and Ctrl-C").
"""
from __future__ import annotations

import os
import time

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


def reader_interrupted(opener: int, depth: int = 4) -> bool:
    """pyfuse3 gives a read no caller pid, so look at the process that opened
    the file and its descendants (the usual reader: `exec 3<>f; cat <&3`).

    True when the opener is gone, or it or a descendant has a signal pending.
    """
    if signal_pending(opener):
        return True
    tree = _children_map()
    level = tree.get(opener, [])
    for _ in range(depth):
        if not level:
            return False
        for pid in level:
            if os.path.exists(f"/proc/{pid}") and signal_pending(pid):
                return True
        level = [c for pid in level for c in tree.get(pid, [])]
    return False
