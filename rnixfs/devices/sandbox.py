"""The sandbox agents' commands (Bash, dev/shell) run in.

A command runs as the daemon's user, and the daemon holds what agents must
not see: provider keys in its environment (``/proc/<daemon>/environ``) and in
its memory (``/proc/<daemon>/mem``). With bubblewrap (``bwrap``) a command
gets its own PID namespace and a fresh ``/proc`` (the daemon is not in it),
the whole filesystem read-only except the project and the mount
(read-write), a private ``/tmp`` and a minimal ``/dev``. The network is
shared. This is the mode ``bwrap``.

Where bwrap is missing or cannot create namespaces (a container without
user namespaces, say), commands run unsandboxed: mode ``none``. The daemon
then only marks itself non-dumpable (``protect_daemon``): the kernel refuses
``/proc/<daemon>/environ``, ``mem`` and ptrace to processes without
CAP_SYS_PTRACE, so a command of an ordinary user is shut out, but a command
running as root is not, and every file the user may write stays writable.

``RNIXFS_SANDBOX`` chooses: ``auto`` (the default: bwrap when it works),
``require`` (a command refuses to run without bwrap) or ``off``. See
docs/devices.md, "The command sandbox".
"""
from __future__ import annotations

import ctypes
import logging
import os
import sys
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

log = logging.getLogger(__name__)

ENV = "RNIXFS_SANDBOX"
POLICIES = ("auto", "require", "off")
PROBE_TIMEOUT = 20.0


@dataclass(frozen=True)
class Sandbox:
    """The mode commands run in: ``bwrap`` or ``none`` (``reason`` says why)."""

    mode: str
    policy: str
    reason: str = ""
    bwrap: str | None = None

    @property
    def active(self) -> bool:
        return self.mode == "bwrap"

    def describe(self) -> dict:
        return {"mode": self.mode, "policy": self.policy, "reason": self.reason}

    def argv(self, inner: list[str], *, cwd: str, writable: list[str]) -> list[str]:
        """``inner`` wrapped in bwrap (unchanged in mode ``none``)."""
        if not self.active:
            return inner
        return [self.bwrap or "bwrap", *bwrap_args(cwd=cwd, writable=writable), "--", *inner]


def bwrap_args(*, cwd: str, writable: list[str]) -> list[str]:
    """bwrap's options: read-only root, own PID namespace and /proc, private
    /tmp, then the writable trees bound over it (after /tmp, so a project
    under /tmp stays visible)."""
    args = ["--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--ro-bind", "/", "/", "--dev", "/dev", "--tmpfs", "/dev/shm", "--proc", "/proc",
            "--tmpfs", "/tmp"]
    seen: set[str] = set()
    for path in writable:
        if not path:
            continue
        real = os.path.realpath(path)
        if real in seen or not os.path.isdir(real):
            continue
        seen.add(real)
        args += ["--bind", real, real]
        alias = os.path.abspath(path)
        if alias != real and alias.startswith("/tmp/"):   # a name the private /tmp would hide
            args += ["--symlink", real, alias]
    for path in _runtime_paths():  # the supervisor's Python and rnixfs, if /tmp hid them
        if path not in seen:
            args += ["--ro-bind", path, path]
    return args + ["--chdir", cwd]


def _runtime_paths() -> list[str]:
    """What the command's supervisor runs from, when it lives under /tmp (a
    checkout or virtualenv there, as in CI): the private /tmp would hide it."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../rnixfs
    here = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                          os.path.dirname(package))}
    return sorted(p for p in here if p.startswith("/tmp/"))


def policy_from_env(env: dict | None = None) -> str:
    value = (env if env is not None else os.environ).get(ENV, "auto").strip().lower() or "auto"
    if value not in POLICIES:
        log.warning("%s=%r is not one of %s; using auto", ENV, value, "/".join(POLICIES))
        return "auto"
    return value


def detect(policy: str | None = None) -> Sandbox:
    """Find out whether bwrap works here (runs it once: blocking, seconds at most)."""
    policy = policy or policy_from_env()
    if policy == "off":
        return Sandbox("none", policy, f"{ENV}=off")
    path = shutil.which("bwrap")
    if path is None:
        return Sandbox("none", policy, "bwrap is not installed (Debian package bubblewrap)")
    with tempfile.TemporaryDirectory(prefix="rnixfs-sandbox-probe-") as tmp:
        argv = [path, *bwrap_args(cwd=tmp, writable=[tmp]), "--", "/bin/sh", "-c",
                "[ $$ -lt 10 ] && touch ./ok"]   # a fresh PID namespace, a writable project
        try:
            res = subprocess.run(argv, capture_output=True, timeout=PROBE_TIMEOUT,
                                 stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Sandbox("none", policy, f"bwrap cannot run: {exc}")
        if res.returncode != 0 or not os.path.exists(os.path.join(tmp, "ok")):
            why = res.stderr.decode("utf-8", "replace").strip().splitlines()
            return Sandbox("none", policy, "bwrap cannot create its namespaces: "
                           + (why[-1][:200] if why else f"exit {res.returncode}"))
    return Sandbox("bwrap", policy, "own PID namespace and /proc; project and mount read-write, "
                   "the rest read-only; private /tmp", path)


def protect_daemon() -> bool:
    """Mark this process non-dumpable: its /proc environ and mem, and ptrace,
    are refused to processes without CAP_SYS_PTRACE. True if it took."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(4, 0, 0, 0, 0) == 0          # PR_SET_DUMPABLE, 0
    except (OSError, AttributeError):
        return False
