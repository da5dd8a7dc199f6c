"""Tier 3: blocking reads and signals on a real mount (README.md, "Blocking reads and Ctrl-C").

pyfuse3 drops FUSE_INTERRUPT, so the daemon must notice a reader's pending
signal itself. Here real readers (`cat`, `tail`, and a tiny C-level read() in
Python that shows the errno) block on `proc/<pid>/wait`, `dev/llm/<p>` and
`trace`, get SIGINT from the test, and must come back promptly; 200 blocked
readers must not stop `ls`/`stat`/`cat status` from answering.

The latency bound asserted is a loose 2 s (the design promises 200 ms); each
test prints what it measured (`pytest -s` shows it).
"""
from __future__ import annotations

import errno
import json
import os
import platform
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.mountutil import hanging_process, needs_fuse, served_mount, sh, wait_for

pytestmark = [needs_fuse, pytest.mark.mount]

EINTR_BOUND = 2.0  # seconds; loose on purpose (README.md measures under 100 ms)
HANG = json.dumps({"intent": "[[delay:60]] hang", "step_timeout": 0})
READ_NR = {"x86_64": 0, "aarch64": 63}.get(platform.machine())

# read(2) straight from libc, with a SIGINT handler installed without
# SA_RESTART (CPython's default), so an interrupted read returns -1/EINTR
# instead of being retried. Optionally writes a message first (dev/llm).
READER = r"""
import ctypes, json, os, signal, sys, time
libc = ctypes.CDLL(None, use_errno=True)
signal.signal(signal.SIGINT, lambda *a: None)
path = sys.argv[1]
msg = sys.argv[2] if len(sys.argv) > 2 else None
fd = os.open(path, os.O_RDWR if msg is not None else os.O_RDONLY)
if msg is not None:
    os.write(fd, msg.encode())
buf = ctypes.create_string_buffer(65536)
n = libc.read(fd, buf, 65536)
err = ctypes.get_errno() if n < 0 else 0
print(json.dumps({"n": n, "errno": err, "t": time.monotonic(), "data": buf.raw[:max(n, 0)].decode()}),
      flush=True)
"""


@pytest.fixture(scope="module")
def mnt(tmp_path_factory):
    """One mount for the module (overrides conftest's per-test `mnt`). The
    provider's HTTP timeout is raised so a `[[delay:60]]` step outlives every
    test here."""
    with served_mount(tmp_path_factory.mktemp("blocking"), timeout=300) as m:
        yield m


@pytest.fixture
def hang(mnt):
    """A process whose step never ends by itself; killed after the test."""
    with hanging_process(mnt, HANG) as pid:
        yield pid


def blocked_in_read(pid: int) -> bool:
    """The host process `pid` sleeps inside read(2) (on our mount)."""
    try:
        with open(f"/proc/{pid}/syscall") as f:
            first = f.read().split()[0]
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read()
    except (OSError, IndexError):
        return False
    if READ_NR is not None:
        return first == str(READ_NR)
    return "fuse" in wchan or "request_wait_answer" in wchan


def sigint_and_time(proc: subprocess.Popen, timeout: float = 30) -> float:
    """SIGINT to the reader; seconds until it has exited."""
    t0 = time.monotonic()
    os.kill(proc.pid, signal.SIGINT)
    proc.wait(timeout=timeout)
    return time.monotonic() - t0


def reader(path: str, message: str | None = None) -> subprocess.Popen:
    args = [sys.executable, "-c", READER, path] + ([message] if message is not None else [])
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def interrupt_reader(proc: subprocess.Popen, what: str) -> dict:
    """Wait until `proc` blocks in read(), SIGINT it, check EINTR and latency."""
    try:
        wait_for(lambda: blocked_in_read(proc.pid) or proc.poll() is not None, 30,
                 what=f"{what} reader to block")
        assert proc.poll() is None, f"reader did not block: {proc.communicate()}"
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    res = json.loads(out)
    latency = res["t"] - t0
    print(f"\n{what}: read() returned {res['n']} errno={errno.errorcode.get(res['errno'])} "
          f"{latency * 1000:.0f} ms after SIGINT")
    assert res["n"] == -1 and res["errno"] == errno.EINTR, res
    assert latency < EINTR_BOUND
    return res


class Lines:
    """Lines of a child's stdout, collected by a thread, read with timeouts."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.q: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.q.put(line)

    def until(self, text: str, timeout: float = 30) -> list[str]:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.seen):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out waiting for {text!r}; saw {self.seen}")
            try:
                self.seen.append(self.q.get(timeout=left))
            except queue.Empty:
                pass
        return self.seen


# ------------------------------------------------------------------------ wait

def test_sigint_ends_a_blocked_cat_wait(mnt, hang):
    cat = subprocess.Popen(["cat", mnt.p(f"proc/{hang}/wait")], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
    try:
        wait_for(lambda: blocked_in_read(cat.pid), 30, what="cat to block in read")
        latency = sigint_and_time(cat)
    finally:
        if cat.poll() is None:
            cat.kill()
            cat.wait()
    print(f"\ncat proc/{hang}/wait: exited {latency * 1000:.0f} ms after SIGINT")
    assert cat.returncode == -signal.SIGINT
    assert cat.stdout.read() == b""
    assert latency < EINTR_BOUND
    # the process was not touched, and wait still works for the next reader
    assert mnt.status(hang)["state"] == "running"
    assert mnt.daemon_alive()


def test_sigint_gives_eintr_to_a_blocked_wait_read(mnt, hang):
    interrupt_reader(reader(mnt.p(f"proc/{hang}/wait")), "proc/<pid>/wait")
    assert mnt.status(hang)["state"] == "running"
    # a later reader still gets the exit line once the process ends
    later = reader(mnt.p(f"proc/{hang}/wait"))
    wait_for(lambda: blocked_in_read(later.pid), 30, what="second reader to block")
    assert sh(f'echo kill > "{mnt.p(f"proc/{hang}/ctl")}"').returncode == 0
    out, err = later.communicate(timeout=30)
    res = json.loads(out)
    assert res["errno"] == 0 and res["data"].startswith("exited(137) ")


# --------------------------------------------------------------------- dev/llm

def test_sigint_gives_eintr_to_a_blocked_llm_read(mnt):
    interrupt_reader(reader(mnt.p("dev/llm/scripted"), "[[delay:60]] take your time"), "dev/llm read")
    assert mnt.daemon_alive()
    # the device still answers other conversations
    res = sh(f'exec 3<>"{mnt.p("dev/llm/scripted")}"; echo "after ctrl-c" >&3; cat <&3', timeout=30)
    assert res.stdout == "echo: after ctrl-c\n", res.stderr


def test_sigint_ends_a_blocked_cat_on_dev_llm(mnt):
    script = 'exec 3<>"$DEV"; echo "[[delay:60]] slow answer" >&3; exec cat <&3'
    cat = subprocess.Popen(["bash", "-c", script], env={**os.environ, "DEV": mnt.p("dev/llm/scripted")},
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: _comm(cat.pid) == "cat" and blocked_in_read(cat.pid), 30,
                 what="cat to block on dev/llm")
        latency = sigint_and_time(cat)
    finally:
        if cat.poll() is None:
            cat.kill()
            cat.wait()
    print(f"\ncat dev/llm/scripted: exited {latency * 1000:.0f} ms after SIGINT")
    assert cat.returncode == -signal.SIGINT
    assert latency < EINTR_BOUND
    assert mnt.daemon_alive()


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


# ------------------------------------------------------- many blocked readers

def test_200_blocked_readers_do_not_stop_ls_and_stat(mnt, hang):
    done = mnt.spawn("a finished one")
    mnt.wait(done)
    readers: list[subprocess.Popen] = []
    try:
        for _ in range(200):
            readers.append(subprocess.Popen(["cat", mnt.p(f"proc/{hang}/wait")],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        wait_for(lambda: all(blocked_in_read(r.pid) for r in readers), 120, interval=0.2,
                 what="200 readers to block")
        checks = {
            "ls proc": f'ls "{mnt.p("proc")}"',
            "stat proc/new": f'stat -c %s "{mnt.p("proc/new")}"',
            "cat status": f'cat "{mnt.p(f"proc/{hang}/status")}"',
            "cat result": f'cat "{mnt.p(f"proc/{done}/result")}"',
            "ls -l fd": f'ls -l "{mnt.p(f"proc/{hang}/fd")}"',
            "getfattr": f'getfattr -n user.rnixfs.daemon --only-values "{mnt.path}"',
            "cat wait (exited)": f'cat "{mnt.p(f"proc/{done}/wait")}"',
        }
        timings = {}
        for name, script in checks.items():
            t0 = time.monotonic()
            res = sh(script, timeout=20)
            timings[name] = time.monotonic() - t0
            assert res.returncode == 0, f"{name}: {res.stderr}"
            if name == "ls proc":
                assert str(hang) in res.stdout.split() and "new" in res.stdout.split()
            if name == "cat status":
                assert json.loads(res.stdout)["state"] == "running"
            if name == "cat result":
                assert res.stdout == "echo: a finished one\n"
        # a spawn goes through too, and its own wait answers
        new = mnt.spawn("spawned while 200 wait")
        assert mnt.wait(new, timeout=30).startswith("exited(0) ")
        print("\nwith 200 blocked readers: " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in timings.items()))
        assert all(r.poll() is None for r in readers), "a reader stopped waiting on its own"
    finally:
        t0 = time.monotonic()
        for r in readers:
            if r.poll() is None:
                os.kill(r.pid, signal.SIGINT)
        for r in readers:
            try:
                r.wait(timeout=max(1.0, 60 - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                r.kill()
                r.wait()
        elapsed = time.monotonic() - t0
    print(f"200 readers gone {elapsed * 1000:.0f} ms after SIGINT")
    assert all(r.returncode == -signal.SIGINT for r in readers), [r.returncode for r in readers]
    assert mnt.daemon_alive()
    assert mnt.status(hang)["state"] == "running"


# ------------------------------------------------------------------- tail -f

def _tail(path: str) -> subprocess.Popen:
    return subprocess.Popen(["tail", "-f", "-s", "0.1", path], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_tail_f_trace_sees_the_exit_of_a_killed_process(mnt, hang):
    tail = _tail(mnt.p(f"proc/{hang}/trace"))
    try:
        lines = Lines(tail)
        lines.until("Write(")
        assert mnt.status(hang)["state"] == "running"
        assert not any("Exit(" in line for line in lines.seen)
        t0 = time.monotonic()
        assert sh(f'echo kill > "{mnt.p(f"proc/{hang}/ctl")}"').returncode == 0
        seen = lines.until("Exit(137)")
        latency = time.monotonic() - t0
    finally:
        _stop(tail)
    print(f"\ntail -f saw Exit {latency * 1000:.0f} ms after kill")
    names = [line.split("] ", 1)[1].split("(", 1)[0] for line in seen]
    assert names[0] == "Spawn" and names[-1] == "Exit"
    assert "Signal" in names and "Close" in names


def test_tail_f_trace_sees_a_process_finish_on_its_own(mnt):
    pid = mnt.spawn("[[chunk-delay:0.15]] [[tokens:12]]")
    tail = _tail(mnt.p(f"proc/{pid}/trace"))
    try:
        lines = Lines(tail)
        lines.until("Open(")
        seen = lines.until("Exit(0)")
    finally:
        _stop(tail)
    names = [line.split("] ", 1)[1].split("(", 1)[0] for line in seen]
    assert names == ["Spawn", "Open", "Write", "Read", "Close", "Exit"]
    assert seen == (mnt.path / "proc" / str(pid) / "trace").read_text().splitlines(keepends=True)
