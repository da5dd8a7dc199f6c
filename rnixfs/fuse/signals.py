"""Noticing that a FUSE caller has a pending signal.

pyfuse3 drops FUSE_INTERRUPT, so a handler that waits polls the caller's
``/proc/<tid>/status`` instead: a pending, unblocked signal (or a caller
that is gone) means "return EINTR now" (DESIGN.md §2).
"""
from __future__ import annotations

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
