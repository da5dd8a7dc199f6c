"""Start an MCP server so that it cannot outlive the daemon.

    python -m rnixfs.devices.mcp.launch COMMAND [ARG...]

The server runs in its own process group (the SDK starts this launcher with
a new session); the launcher stays as its parent and watches the daemon. If
the daemon dies, even by SIGKILL, the launcher kills the whole group. A
prctl death signal would not do: the daemon spawns from a worker thread,
whose exit would fire it.
"""
from __future__ import annotations

import os
import signal
import sys
import time

POLL = 0.5


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m rnixfs.devices.mcp.launch COMMAND [ARG...]", file=sys.stderr)
        return 2
    if argv and argv[0].startswith("--tag="):  # lets the daemon find its launcher
        argv = argv[1:]
    if not argv:
        return 2
    daemon = os.getppid()
    try:
        child = os.fork()
    except OSError as exc:
        print(f"launch: fork failed: {exc}", file=sys.stderr)
        return 127
    if child == 0:
        try:
            os.execvp(argv[0], argv)
        except OSError as exc:
            print(f"launch: cannot run {argv[0]!r}: {exc.strerror}", file=sys.stderr)
            os._exit(127)
    # Only the server talks on stdin/stdout: our copies would hide its EOF.
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)

    def forward(signum, _frame):
        try:
            os.kill(child, signum)
        except OSError:
            pass
    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            pid, status = os.waitpid(child, os.WNOHANG)
        except ChildProcessError:
            return 0
        if pid == child:
            return os.waitstatus_to_exitcode(status) & 0xFF
        if os.getppid() != daemon:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.killpg(os.getpgrp(), signal.SIGKILL)
        time.sleep(POLL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
