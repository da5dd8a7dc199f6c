"""dev/shell — command execution with a bounded lifetime.

``run()`` executes one command line with ``bash -c`` and returns its exit
status and combined stdout/stderr; ``ShellSession`` is the per-open state of
the mount's ``dev/shell`` file (write a command line, read its output and a
status trailer). The agents' Bash tool and the mount share this code.

How a command runs::

    daemon ── python shim (new session, child subreaper) ── bash -c CMD ── …

The shim is a few lines of Python (``_SHIM``) started with
``start_new_session=True``. It marks itself ``PR_SET_CHILD_SUBREAPER``, so
every process the command starts stays below it, even one that double-forks
or calls ``setsid`` (an orphan is reparented to the shim, not to init). It
forks bash with stdin on /dev/null and stdout+stderr on one pipe to us,
reports bash's wait status on a private pipe, reaps orphans, and stays alive
until we close its control pipe (its stdin). If the daemon dies, that pipe
closes and the shim SIGKILLs everything below it (a dead man's switch).

When bash exits, on timeout, or when the caller's trio scope is cancelled
(``kill`` of an agent), the whole tree goes: every descendant of the shim
(psutil) and the process group get SIGTERM (and SIGCONT, so stopped ones see
it), a short grace, then SIGKILL until none is left; only then is the shim
released. A command therefore never leaves a process behind, background
jobs included: dev/shell is not a way to start services. See
docs/devices.md for the exit-status trailer and the limits.

The command text never appears in an argv (``ps`` shows every argv to every
local user): it reaches bash through an inherited memfd on fd 3, which a
fixed bootstrap (``_BOOT``) reads, closes and evaluates. Where bubblewrap
works, the shim and everything below it run in a sandbox (``sandbox``: own
PID namespace and /proc, read-only system, the project and the mount
read-write, private /tmp)::

    daemon ── bwrap ── bwrap (pid 1) ── shim ── bash ── …

No pyfuse3 here.
"""
from __future__ import annotations

import inspect
import logging
import math
import os
import shutil
import signal as _signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import psutil
import trio

from rnixfs.kernel.errors import Code, SyscallError

from . import sandbox as _sandbox

log = logging.getLogger(__name__)

DEVICE = "/dev/shell"
KILL_GRACE = 0.5            # seconds between SIGTERM and SIGKILL
DRAIN = 2.0                 # seconds to wait for output EOF once the tree is dead
MAX_COMMAND = 64 * 1024     # bytes per command line (one argv string)
MAX_QUEUE = 16              # commands waiting on one dev/shell handle

BASH = shutil.which("bash") or "/bin/bash"
MARK = "rnixfs-shell-supervisor"   # in the shim's argv: kill_tree spares it

# bash's -c text: the command comes from fd 3 (a memfd), never from an argv.
# ``eval`` parses and runs it as ``bash -c`` would (line by line, $0 = bash).
_BOOT = 'IFS= read -r -d "" __rnix_cmd <&3; exec 3<&-; eval "unset -v __rnix_cmd; $__rnix_cmd"'

# The supervisor between the daemon and bash. argv: bash, status fd, command fd, MARK.
# stdin is the control pipe (EOF = tear down); fds 1/2 are the output pipe,
# which the shim itself lets go of so that only the command holds it.
_SHIM = r"""
import os, signal, select, sys, time
def kids_of(me):
    ppid = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d, "rb") as f:
                    ppid[int(d)] = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    out, todo = [], [me]
    while todo:
        p = todo.pop()
        for c, pp in ppid.items():
            if pp == p:
                out.append(c)
                todo.append(c)
    return out
def reap():
    while True:
        try:
            p, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return None
        if p == 0:
            return None
        yield p, st
def main():
    bash, sfd, cfd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except Exception:
        pass
    rfd, wfd = os.pipe()
    os.set_blocking(wfd, False)
    signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda *a: None)
    pid = os.fork()
    if pid == 0:
        try:
            signal.set_wakeup_fd(-1)
            for s in (signal.SIGCHLD, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):
                signal.signal(s, signal.SIG_DFL)
            os.close(rfd); os.close(wfd); os.close(sfd)
            nul = os.open("/dev/null", os.O_RDONLY)
            os.dup2(nul, 0)
            os.close(nul)
            if cfd != 3:
                os.dup2(cfd, 3)
                os.close(cfd)
            os.set_inheritable(3, True)
            os.execv(bash, [bash, "-c", BOOT, "bash"])
        except BaseException:
            pass
        os._exit(127)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(s, signal.SIG_IGN)
    os.close(cfd)
    nul = os.open("/dev/null", os.O_WRONLY)
    os.dup2(nul, 1)
    os.dup2(nul, 2)
    os.close(nul)
    reported = False
    while True:
        for p, st in reap() or ():
            if p == pid and not reported:
                os.write(sfd, b"%d\n" % st)
                os.close(sfd)
                reported = True
        r = select.select([0, rfd], [], [])[0]
        if rfd in r:
            os.read(rfd, 512)
        if 0 in r and not os.read(0, 512):
            break
    for _ in range(200):
        try:
            os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break  # no child at all, hence no descendant (orphans come to us)
        left = kids_of(os.getpid())
        if not left:
            break
        for p in left:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01)
        for _ in reap() or ():
            pass
BOOT = @BOOT@
main()
os._exit(0)
""".replace("@BOOT@", repr(_BOOT))


@dataclass(frozen=True)
class ShellResult:
    """How one command ended.

    ``exit_code`` is bash's exit status, or None when it was killed by a
    signal (then ``signal`` is the signal number). ``output`` is stdout and
    stderr interleaved as written (one pipe), at most ``output_limit`` bytes
    of it plus one truncation marker line (``truncated``); ``total_bytes``
    is what the command wrote in all. ``pid`` is the supervisor's host pid:
    every process of the command descended from it.
    """

    exit_code: int | None
    signal: int | None
    output: bytes
    truncated: bool
    timed_out: bool
    duration: float
    total_bytes: int = 0
    pid: int = 0
    sandbox: str = ""          # "bwrap" or "none": the mode the command ran in

    @property
    def status(self) -> int:
        """The status as bash's ``$?`` shows it: the exit code, or 128 + signal."""
        if self.signal is not None:
            return 128 + self.signal
        return self.exit_code if self.exit_code is not None else 255

    @property
    def signal_name(self) -> str | None:
        if self.signal is None:
            return None
        try:
            return _signal.Signals(self.signal).name.removeprefix("SIG")
        except ValueError:
            return str(self.signal)

    def trailer(self, *, noeol: bool = False) -> bytes:
        """The dev/shell status line: ``[exit N signal=NAME timeout truncated noeol]\\n``."""
        parts = [f"exit {self.status}"]
        if self.signal is not None:
            parts.append(f"signal={self.signal_name}")
        if self.timed_out:
            parts.append("timeout")
        if self.truncated:
            parts.append("truncated")
        if noeol:
            parts.append("noeol")
        return ("[" + " ".join(parts) + "]\n").encode()


def _err(code: Code, cause: str, syscall: str = "Exec") -> SyscallError:
    return SyscallError(code, cause, syscall=syscall, device=DEVICE)


def _check_command(command: str | bytes) -> str:
    if isinstance(command, bytes):
        if b"\0" in command:
            raise _err(Code.INVALID, "NUL byte in command")
        command = os.fsdecode(command)
    if not isinstance(command, str):
        raise _err(Code.INVALID, f"command must be text, not {type(command).__name__}")
    if "\0" in command:
        raise _err(Code.INVALID, "NUL byte in command")
    try:
        size = len(os.fsencode(command))
    except UnicodeEncodeError:
        raise _err(Code.INVALID, "command is not encodable") from None
    if size > MAX_COMMAND:
        raise _err(Code.TOO_BIG, f"command is {size} bytes; the cap is {MAX_COMMAND}")
    return command


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _alive_descendants(root: psutil.Process | None, spare: frozenset[int] = frozenset()) -> list[psutil.Process]:
    if root is None:
        return []
    try:
        kids = root.children(recursive=True)
    except psutil.Error:
        return []
    out = []
    for k in kids:
        if k.pid in spare:
            continue
        try:
            if k.status() != psutil.STATUS_ZOMBIE:
                out.append(k)
        except psutil.Error:
            pass
    return out


def _supervisors(root: psutil.Process | None) -> frozenset[int]:
    """In a sandbox, the chain bwrap (pid 1) ── shim below ``root`` (bwrap):
    they reap and report, so ``kill_tree`` spares them like the root. Only
    bwrap processes and, below them, the first process carrying ``MARK``
    qualify; anything the command starts is below the shim."""
    if root is None:
        return frozenset()
    chain: list[int] = []
    level = [root]
    for _ in range(3):
        nxt = []
        for p in level:
            try:
                nxt += p.children()
            except psutil.Error:
                pass
        for p in nxt:
            try:
                if p.name() == "bwrap":          # its argv holds the shim's, MARK included
                    chain.append(p.pid)
                elif MARK in p.cmdline():
                    return frozenset(chain + [p.pid])
            except psutil.Error:
                pass
        level = [p for p in nxt if p.pid in chain]
        if not level:
            break
    return frozenset(chain)


async def kill_tree(root_pid: int, *, grace: float = KILL_GRACE, root: psutil.Process | None = None,
                    sandboxed: bool = False) -> int:
    """SIGTERM every descendant of ``root_pid`` and its process group, wait up
    to ``grace`` seconds, then SIGKILL until none is left. The root itself
    is spared (it is the supervisor, which reaps); ``sandboxed``: the root
    is bwrap, and bwrap's pid 1 and the shim below it are spared instead of
    the process group being signalled. Returns how many processes were
    signalled. Safe to call again; a no-op once the tree is gone.
    """
    if root is None:
        try:
            root = psutil.Process(root_pid)
        except psutil.Error:
            root = None
    spare = _supervisors(root) if sandboxed else frozenset()
    procs = _alive_descendants(root, spare)
    termed: set[int] = set()

    def term(ps: list[psutil.Process]) -> None:
        for p in ps:
            if p.pid in termed:
                continue
            termed.add(p.pid)
            try:
                p.terminate()     # psutil checks the pid was not reused
                p.resume()        # a stopped process must run to see SIGTERM
            except psutil.Error:
                pass

    if procs:
        term(procs)
        if not sandboxed:
            _killpg(root_pid, _signal.SIGTERM)   # the shim ignores SIGTERM (bwrap would not)
        deadline = trio.current_time() + grace
        while procs and trio.current_time() < deadline:
            await trio.sleep(0.01)
            procs = _alive_descendants(root, spare)
            term(procs)
    rounds = 0
    while procs and rounds < 500:
        for p in procs:
            try:
                p.kill()
            except psutil.Error:
                pass
        termed.update(p.pid for p in procs)
        await trio.sleep(0.005)
        procs = _alive_descendants(root, spare)
        rounds += 1
    return len(termed)


async def _read_status(stream: trio.lowlevel.FdStream) -> int | None:
    buf = b""
    while True:
        data = await stream.receive_some(64)
        if not data:
            break
        buf += data
    try:
        return int(buf.strip())
    except ValueError:
        return None


async def execute(command: str | bytes, *, cwd: Path | str, env: dict | None, timeout: float | None,
                  on_output: Callable[[bytes], Any], on_start: Callable[[int], Any] | None = None,
                  kill_grace: float = KILL_GRACE) -> tuple[int | None, int | None, bool, float, int]:
    """Run ``command``; feed its output to ``on_output(bytes)`` as it comes.

    Returns ``(exit_code, signal, timed_out, duration, root_pid)``. The
    building block of ``run`` and ``ShellSession``; cancellation-safe: when
    the calling scope is cancelled, the tree is killed (shielded, bounded)
    before ``Cancelled`` propagates.
    """
    command = _check_command(command)
    from ..skills.packages.script_guard import blocked_script   # installed skills' scripts (docs/packages.md)
    # in a thread: the command may name paths inside this daemon's own mount
    if (why := await trio.to_thread.run_sync(blocked_script, command, cwd)) is not None:
        raise _err(Code.PERMISSION, why)
    if env is None:
        env = dict(os.environ)
    box = await current_sandbox()
    if not box.active and box.policy == "require":
        raise _err(Code.PERMISSION, f"the command sandbox is required ({_sandbox.ENV}=require) "
                                    f"but unavailable: {box.reason}")
    cwd = os.fspath(cwd)
    if box.active and not os.path.isdir(cwd):
        raise _err(Code.NOT_FOUND, f"working directory {cwd!r} does not exist")
    limit = math.inf if not timeout or timeout <= 0 else float(timeout)
    # the command text goes through a memfd, not argv: see the module docstring
    cmd_fd = os.memfd_create("rnixfs-command", os.MFD_CLOEXEC)
    try:
        os.write(cmd_fd, command.encode("utf-8", "surrogateescape"))
        os.lseek(cmd_fd, 0, os.SEEK_SET)
    except OSError:
        os.close(cmd_fd)
        raise
    status_r, status_w = os.pipe()
    inner = [sys.executable, "-I", "-S", "-c", _SHIM, BASH, str(status_w), str(cmd_fd), MARK]
    writable = list(_writable) or [cwd]
    if not any(cwd == w or cwd.startswith(w.rstrip("/") + "/") for w in writable):
        writable.append(cwd)
    argv = box.argv(inner, cwd=cwd, writable=writable)
    if box.active and env.get("RNIXFS_MOUNT"):
        # the mount read-write, named as is: the daemon must not stat its own mount
        mount = os.path.abspath(env["RNIXFS_MOUNT"])
        i = argv.index("--chdir")
        argv[i:i] = ["--bind", mount, mount]
    try:
        proc = await trio.lowlevel.open_process(
            argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True, pass_fds=(status_w, cmd_fd))
    except (FileNotFoundError, NotADirectoryError):
        os.close(status_r)
        raise _err(Code.NOT_FOUND, f"working directory {cwd!r} does not exist") from None
    except PermissionError as exc:
        os.close(status_r)
        raise _err(Code.PERMISSION, f"cannot start the command: {exc.strerror}") from None
    except OSError as exc:
        os.close(status_r)
        raise _err(Code.INTERNAL, f"cannot start the command: {exc}") from None
    finally:
        os.close(status_w)
        os.close(cmd_fd)
    t0 = time.monotonic()
    try:
        root: psutil.Process | None = psutil.Process(proc.pid)
    except psutil.Error:
        root = None
    status_stream = trio.lowlevel.FdStream(status_r)
    wait_status: int | None = None
    timed_out = False
    duration = 0.0
    try:
        if on_start is not None:
            r = on_start(proc.pid)
            if inspect.isawaitable(r):
                await r
        async with trio.open_nursery() as nursery:
            eof = trio.Event()

            async def pump() -> None:
                try:
                    while True:
                        data = await proc.stdout.receive_some(65536)
                        if not data:
                            break
                        on_output(data)
                finally:
                    eof.set()

            nursery.start_soon(pump)
            with trio.move_on_after(limit) as cs:
                wait_status = await _read_status(status_stream)
            duration = time.monotonic() - t0
            timed_out = cs.cancelled_caught
            await kill_tree(proc.pid, grace=kill_grace, root=root, sandboxed=box.active)
            if timed_out:
                with trio.move_on_after(1.0):
                    wait_status = await _read_status(status_stream)
            if box.active:
                # bwrap's two processes hold the output pipe until the shim exits:
                # release the shim (the tree is dead) for the output to reach EOF
                await proc.stdin.aclose()
            with trio.move_on_after(DRAIN):
                await eof.wait()
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True) as shield:
            shield.deadline = trio.current_time() + kill_grace + 5
            try:
                await kill_tree(proc.pid, grace=kill_grace, root=root, sandboxed=box.active)
            except Exception:  # pragma: no cover - never let cleanup mask the cause
                pass
            if root is None or _alive_descendants(root, _supervisors(root) if box.active else frozenset()):
                # the supervisor is gone or something resisted: the process group goes.
                # Safe: the shim is not reaped yet, so its pgid cannot have been reused.
                _killpg(proc.pid, _signal.SIGKILL)
            for s in (proc.stdin, proc.stdout, status_stream):
                try:
                    await s.aclose()     # closing stdin releases the shim
                except Exception:
                    pass
            with trio.move_on_after(2.0):
                await proc.wait()
        if proc.returncode is None:      # a stuck shim
            _killpg(proc.pid, _signal.SIGKILL)
            proc.kill()
            with trio.CancelScope(shield=True):
                await proc.wait()
    if wait_status is None:
        if box.active and proc.returncode == 1 and not timed_out:
            # bwrap could not build the sandbox; its reason is in the output
            return 126, None, timed_out, duration, proc.pid
        return None, _signal.SIGKILL, timed_out, duration, proc.pid
    code = os.waitstatus_to_exitcode(wait_status)
    if code < 0:
        return None, -code, timed_out, duration, proc.pid
    return code, None, timed_out, duration, proc.pid


_current: _sandbox.Sandbox | None = None
_writable: tuple[str, ...] = ()


def configure(box: _sandbox.Sandbox | None = None, *, writable=()) -> _sandbox.Sandbox:
    """Set the sandbox commands run in (``sandbox.detect()`` when None) and the
    trees they may write (the project; the working directory when unset).
    Blocking when it detects: the daemon calls it once at start, in a thread."""
    global _current, _writable
    _current = box if box is not None else _sandbox.detect()
    _writable = tuple(os.fspath(w) for w in writable)
    return _current


async def current_sandbox() -> _sandbox.Sandbox:
    """The configured sandbox; detected (``RNIXFS_SANDBOX``) on first use."""
    global _current
    if _current is None:
        _current = await trio.to_thread.run_sync(_sandbox.detect)
    return _current


class _HeadTail:
    """Keep the first and last halves of at most ``limit`` bytes."""

    def __init__(self, limit: int):
        self.limit = max(0, int(limit))
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.limit // 2 + self.limit % 2 - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data and self.limit // 2:
            self.tail += data
            if len(self.tail) > self.limit // 2:
                del self.tail[: len(self.tail) - self.limit // 2]

    def result(self) -> tuple[bytes, bool]:
        if self.total <= self.limit:
            return bytes(self.head + self.tail), False
        omitted = self.total - len(self.head) - len(self.tail)
        nl = b"" if not self.head or self.head.endswith(b"\n") else b"\n"
        marker = b"%s[... output truncated: %d of %d bytes omitted ...]\n" % (nl, omitted, self.total)
        return bytes(self.head) + marker + bytes(self.tail), True


async def run(command: str, *, cwd: Path | str, env: dict | None, timeout: float | None,
              output_limit: int, on_start: Callable[[int], Any] | None = None,
              kill_grace: float = KILL_GRACE) -> ShellResult:
    """Run ``command`` with ``bash -c`` in ``cwd`` and return how it ended.

    stdin is /dev/null; stdout and stderr share one pipe. ``timeout``
    seconds (None or 0: none) after the start the whole tree is killed and
    ``timed_out`` is set. Output beyond ``output_limit`` bytes keeps its
    first and last halves around a marker line
    ``[... output truncated: N of M bytes omitted ...]``. ``on_start(pid)``
    (sync or async) gets the supervisor's host pid as soon as it exists.
    ``cwd`` must already be a resolved directory inside the workspace
    (``Workspace.resolve``); a missing one is NOT_FOUND. Cancelling the
    caller kills the tree before ``Cancelled`` propagates.
    """
    sink = _HeadTail(output_limit)
    code, sig, timed_out, duration, pid = await execute(
        command, cwd=cwd, env=env, timeout=timeout, on_output=sink.add, on_start=on_start,
        kill_grace=kill_grace)
    output, truncated = sink.result()
    box = await current_sandbox()
    return ShellResult(code, sig, output, truncated, timed_out, duration, sink.total, pid, box.mode)


_EOF = object()


class ShellSession:
    """The state behind one open ``dev/shell`` handle.

    ``write`` queues command lines (one per ``\\n``; a line ending in ``\\``
    continues on the next; blank lines are ignored). Commands run one after
    the other, each a fresh ``bash -c`` in ``cwd`` (no state such as ``cd``
    carries over). ``read`` streams the running command's output, then one
    trailer line ``[exit N …]``, then returns ``b""`` once (EOF); the next
    read continues with the next command. With nothing queued or running,
    ``read`` returns ``b""`` at once; an unterminated line is run when the
    handle is read. ``aclose`` kills whatever runs. See docs/devices.md.

    ``nursery`` runs the worker (the mount's long-lived nursery);
    ``on_start(pid, command)`` and ``on_exit(command, ShellResult)`` let the
    owner trace each command (sync or async).
    """

    def __init__(self, nursery: trio.Nursery, *, cwd: Path | str, env: dict | None,
                 timeout: float | None, output_limit: int, kill_grace: float = KILL_GRACE,
                 max_queue: int = MAX_QUEUE, max_command: int = MAX_COMMAND,
                 on_start: Callable[[int, str], Any] | None = None,
                 on_exit: Callable[[str, ShellResult], Any] | None = None):
        self._nursery = nursery
        self.cwd, self.env, self.timeout = cwd, env, timeout
        self.output_limit = max(0, int(output_limit))
        self.kill_grace = kill_grace
        self.max_queue, self.max_command = max_queue, max_command
        self._on_start, self._on_exit = on_start, on_exit
        self._partial = bytearray()
        self._queue: deque[str] = deque()
        self._out: deque = deque()
        self._running = False
        self._worker_on = False
        self._closed = False
        self._changed = trio.Event()
        self._scope = trio.CancelScope()
        self._worker_done = trio.Event()
        self._worker_done.set()
        self.results: list[ShellResult] = []
        self.current_pid: int | None = None

    # -- writing ---------------------------------------------------------------------------
    def write(self, data: bytes) -> int:
        """Queue the complete command lines in ``data``; return ``len(data)``.

        All or nothing: INVALID for NUL bytes or a closed session, TOO_BIG
        for a line over ``max_command`` bytes, BUSY when more than
        ``max_queue`` commands would wait.
        """
        if self._closed:
            raise _err(Code.INVALID, "the session is closed", "Write")
        data = bytes(data)
        if b"\0" in data:
            raise _err(Code.INVALID, "NUL byte in command", "Write")
        buf = self._partial + data
        lines = []
        start = 0
        while True:
            i = buf.find(b"\n", start)
            if i < 0:
                break
            if i > 0 and buf[i - 1:i] == b"\\" and not buf[:i].endswith(b"\\\\"):
                start = i + 1                 # backslash-newline: the line goes on
                continue
            lines.append(bytes(buf[:i]))
            del buf[: i + 1]
            start = 0
        if len(buf) > self.max_command or any(len(ln) > self.max_command for ln in lines):
            raise _err(Code.TOO_BIG, f"command line over {self.max_command} bytes", "Write")
        commands = [os.fsdecode(ln) for ln in lines if ln.strip()]
        if len(self._queue) + len(commands) > self.max_queue:
            raise _err(Code.BUSY, f"more than {self.max_queue} commands waiting", "Write")
        self._partial = buf
        self._submit(commands)
        return len(data)

    def _submit(self, commands: list[str]) -> None:
        if not commands:
            return
        self._queue.extend(commands)
        if not self._worker_on:
            self._worker_on = True
            self._worker_done = trio.Event()
            self._scope = trio.CancelScope()   # single-use, one per worker
            self._nursery.start_soon(self._worker)
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    # -- reading ---------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """A command is running or waiting."""
        return self._running or bool(self._queue)

    async def read(self, size: int = 65536) -> bytes:
        """Output of the current command, its trailer, then ``b""`` (see class doc)."""
        if self._partial.strip() and not self._closed:
            line, self._partial = bytes(self._partial), bytearray()
            self._submit([os.fsdecode(line)])
        while True:
            if self._out:
                if self._out[0] is _EOF:
                    self._out.popleft()
                    return b""
                parts, n = [], 0
                while self._out and self._out[0] is not _EOF and n < size:
                    item = self._out.popleft()
                    if n + len(item) > size:
                        self._out.appendleft(item[size - n:])
                        item = item[: size - n]
                    parts.append(item)
                    n += len(item)
                return b"".join(parts)
            if self._closed or not self.busy:
                return b""
            await self._changed.wait()

    # -- running ---------------------------------------------------------------------------
    async def _worker(self) -> None:
        try:
            with self._scope:
                while self._queue:
                    command = self._queue.popleft()
                    self._running = True
                    try:
                        await self._run_one(command)
                    except Exception as exc:  # never take the owner's nursery down
                        log.exception("dev/shell: command %r failed", command[:200])
                        msg = f"rnix: internal error: {type(exc).__name__}\n".encode()
                        result = ShellResult(126, None, msg, False, False, 0.0, len(msg), 0)
                        self._out.extend([msg, result.trailer(), _EOF])
                        self.results.append(result)
                    finally:
                        self._running = False
                        self.current_pid = None
                        self._notify()
        finally:
            self._worker_on = False
            self._worker_done.set()
            self._notify()

    async def _run_one(self, command: str) -> None:
        kept = 0
        total = 0
        last = b""

        def feed(data: bytes) -> None:
            nonlocal kept, total, last
            total += len(data)
            room = self.output_limit - kept
            if room > 0:
                piece = data[:room]
                kept += len(piece)
                if piece:
                    last = piece[-1:]
                    self._out.append(piece)
                    self._notify()

        async def started(pid: int) -> None:
            self.current_pid = pid
            if self._on_start is not None:
                r = self._on_start(pid, command)
                if inspect.isawaitable(r):
                    await r

        try:
            code, sig, timed_out, duration, pid = await execute(
                command, cwd=self.cwd, env=self.env, timeout=self.timeout, on_output=feed,
                on_start=started, kill_grace=self.kill_grace)
        except SyscallError as exc:
            msg = f"rnix: cannot run the command: {exc.cause}\n".encode()
            self._out.append(msg)
            result = ShellResult(126, None, msg, False, False, 0.0, len(msg), 0)
            self._out.extend([result.trailer(), _EOF])
            self.results.append(result)
            await self._report(command, result)
            return
        truncated = total > kept
        tail = b""
        noeol = bool(kept) and last != b"\n"
        if truncated:
            tail += (b"\n" if noeol else b"") + b"[... output truncated: %d of %d bytes omitted ...]\n" % (
                total - kept, total)
        elif noeol:
            tail += b"\n"
        result = ShellResult(code, sig, b"", truncated, timed_out, duration, total, pid,
                             (await current_sandbox()).mode)
        self._out.extend([tail + result.trailer(noeol=noeol), _EOF])
        self.results.append(result)
        await self._report(command, result)

    async def _report(self, command: str, result: ShellResult) -> None:
        if self._on_exit is None:
            return
        try:
            r = self._on_exit(command, result)
            if inspect.isawaitable(r):
                await r
        except Exception:
            log.exception("dev/shell: on_exit callback failed")

    async def aclose(self) -> None:
        """Kill the running command (its whole tree), drop the queue; idempotent."""
        self._closed = True
        self._queue.clear()
        self._scope.cancel()
        self._notify()
        with trio.CancelScope(shield=True):
            await self._worker_done.wait()
