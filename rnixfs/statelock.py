"""One daemon per state directory, enforced by a lock file.

Why: two daemons on one store each believe the other's live processes are
leftovers of a crash and mark them dead, then overwrite them again — states
would move backwards. The lock is an ``flock`` on ``<state>/daemon.lock``,
held for the daemon's lifetime; the kernel drops it when the daemon dies,
even by ``kill -9``, so a crashed daemon never blocks the next mount. The
file's text names the holder so the refusal can say who it is.
"""
from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

LOCK_NAME = "daemon.lock"


class StateDirBusy(Exception):
    """Another live daemon holds the state directory."""


class StateLock:
    def __init__(self, state_dir: Path):
        self.path = Path(state_dir) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self, *, mountpoint: Path) -> None:
        """Take the lock or raise StateDirBusy naming the holder."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(fd)
            os.close(fd)
            raise StateDirBusy(
                f"state directory {self.path.parent} is in use by {holder}; "
                "unmount it first or choose another --state-dir"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        text = json.dumps({"pid": os.getpid(), "mountpoint": str(mountpoint)}) + "\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, text.encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None


def _describe(fd: int) -> str:
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"the rnixfs daemon pid {int(holder['pid'])} mounted at {holder['mountpoint']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another rnixfs daemon (starting up)"
