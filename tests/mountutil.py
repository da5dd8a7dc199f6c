"""Real mounts for tests: mount in tmp_path, drive with real processes,
always unmount in a finalizer (fusermount3 -u, then -z), never leave a
daemon behind."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.logcheck import watch_daemon_log

RNIXFS = [sys.executable, "-m", "rnixfs.cli"]
FUSERMOUNT = shutil.which("fusermount3") or "fusermount3"


def have_fuse() -> bool:
    return os.path.exists("/dev/fuse") and shutil.which("fusermount3") is not None


def rnixfs(*args: str, check: bool = True, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    res = subprocess.run([*RNIXFS, *args], capture_output=True, text=True, timeout=timeout,
                         stdin=subprocess.DEVNULL, **kw)
    if check and res.returncode != 0:
        raise AssertionError(f"rnixfs {' '.join(args)} failed ({res.returncode}): {res.stderr}")
    return res


def sh(script: str, *, timeout: float = 60, check: bool = False, **kw) -> subprocess.CompletedProcess:
    """Run a bash snippet the way a user would."""
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=timeout,
                         stdin=subprocess.DEVNULL, **kw)
    if check and res.returncode != 0:
        raise AssertionError(f"bash failed ({res.returncode}): {script}\n{res.stdout}\n{res.stderr}")
    return res


def wait_for(cond, timeout: float = 30.0, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def mounted_points() -> set[str]:
    with open("/proc/mounts") as f:
        return {line.split()[1] for line in f if " fuse.rnixfs " in line}


@dataclass
class Mount:
    path: Path
    project: Path
    state_dir: Path
    config_dir: Path
    daemon_pid: int

    def p(self, rel: str) -> str:
        return str(self.path / rel)

    def spawn(self, request: str) -> int:
        """Spawn through proc/new the shell way; return the PID read back."""
        res = sh(f'exec 3<>"{self.path}/proc/new"; printf "%s" "$REQ" >&3 && read -r pid <&3 && echo "$pid"',
                 env={**os.environ, "REQ": request}, check=True)
        return int(res.stdout.strip())

    def status(self, pid: int) -> dict:
        return json.loads((self.path / "proc" / str(pid) / "status").read_text())

    def wait(self, pid: int, timeout: float = 60) -> str:
        res = subprocess.run(["cat", self.p(f"proc/{pid}/wait")], capture_output=True, text=True,
                             timeout=timeout)
        assert res.returncode == 0, res.stderr
        return res.stdout

    def daemon_alive(self) -> bool:
        try:
            os.kill(self.daemon_pid, 0)
        except ProcessLookupError:
            return False
        return (self.path / "proc").is_dir()

    def log(self) -> str:
        p = self.state_dir / "daemon.log"
        return p.read_text() if p.exists() else ""


def write_providers(config_dir: Path, text: str) -> None:
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "providers.yaml").write_text(text)


def scripted_providers(url: str, default: str = "scripted", timeout: float = 10, **extra) -> str:
    lines = [f"default: {default}", "providers:", "  scripted:", "    type: openai",
             f"    base_url: {url}", "    model: scripted-model", f"    timeout: {timeout:g}",
             "    max_retries: 2", "    retry_initial: 0.01", "    retry_max: 0.05"]
    lines += [f"    {k}: {v}" for k, v in extra.items()]
    return "\n".join(lines) + "\n"


def do_mount(tmp: Path, providers_yaml: str | None, *extra: str, name: str = "mnt",
             state: str = "state") -> Mount:
    """Mount at tmp/name; mounts at the same time need their own ``state``
    (one daemon per state directory)."""
    mnt, project = tmp / name, tmp / "project"
    state_dir, config_dir = tmp / state, tmp / "config"
    for d in (mnt, project, state_dir, config_dir):
        d.mkdir(parents=True, exist_ok=True)
    if providers_yaml is not None:
        write_providers(config_dir, providers_yaml)
    watch_daemon_log(state_dir / "daemon.log")
    rnixfs("mount", str(mnt), "--project", str(project), "--state-dir", str(state_dir),
           "--config-dir", str(config_dir), *extra)
    info = json.loads(os.getxattr(mnt, "user.rnixfs.daemon"))
    return Mount(mnt, project, state_dir, config_dir, info["pid"])


@contextlib.contextmanager
def served_mount(tmp: Path, *, timeout: float = 10):
    """A scripted server and a mount whose default provider it is; both gone
    afterwards. For module-scoped fixtures (a mount costs ~2 s)."""
    from tests.scripted_server import ScriptedServer

    server = ScriptedServer().start()
    try:
        m = do_mount(tmp, scripted_providers(server.url, timeout=timeout))
        try:
            yield m
        finally:
            cleanup(m)
    finally:
        server.stop()


@contextlib.contextmanager
def hanging_process(m: Mount, request: str):
    """A process whose step does not end by itself; killed afterwards."""
    pid = m.spawn(request)
    wait_for(lambda: m.status(pid)["fds"], 30, what="the step to start")
    # the conversation reaches the record with the worker's next report
    wait_for(lambda: (m.path / "proc" / str(pid) / "context").read_text(), 30,
             what="the conversation to reach the record")
    try:
        yield pid
    finally:
        sh(f'echo kill > "{m.p(f"proc/{pid}/ctl")}"')


def cleanup(m: Mount) -> None:
    """Unmount and make sure the daemon is gone (by its PID only)."""
    if str(m.path) in mounted_points():
        res = subprocess.run([FUSERMOUNT, "-u", str(m.path)], capture_output=True)
        if res.returncode != 0:
            subprocess.run([FUSERMOUNT, "-u", "-z", str(m.path)], capture_output=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(m.daemon_pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    try:
        os.kill(m.daemon_pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


needs_fuse = pytest.mark.skipif(not have_fuse(), reason="needs /dev/fuse and fusermount3")


@pytest.fixture
def mount_factory(tmp_path, request):
    """mount_factory(providers_yaml, *extra_args, name=..., state=...) -> Mount."""
    mounts: list[Mount] = []

    def make(providers_yaml: str | None, *extra: str, name: str = "mnt", state: str = "state") -> Mount:
        m = do_mount(tmp_path, providers_yaml, *extra, name=name, state=state)
        mounts.append(m)
        return m

    yield make
    for m in mounts:
        cleanup(m)


@pytest.fixture
def mnt(scripted_server, mount_factory) -> Mount:
    """A real mount whose default provider is the scripted server. The server
    is set up first so that it is stopped last: agents still asking it at the
    end of a test are killed by the umount, not cut off mid-request (which
    the driver retries, with a warning in daemon.log)."""
    return mount_factory(scripted_providers(scripted_server.url))
