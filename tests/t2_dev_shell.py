"""dev/shell: real processes, no mocks.

Every test that starts something long-lived tags it with a unique
environment variable and asserts afterwards that no process carrying the tag
is left on the host: the whole tree died, whatever it did (background jobs,
nested shells, setsid, double fork, ignoring SIGTERM, stopping itself).
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
import trio

from rnixfs.devices import shell
from rnixfs.devices.sandbox import Sandbox
from rnixfs.devices.shell import ShellResult, ShellSession, kill_tree
from rnixfs.kernel.errors import Code, SyscallError

TRAILER = re.compile(rb"^\[exit (\d+)((?: [a-z]+(?:=[A-Z0-9]+)?)*)\]$")


def tagged_env(tag: str) -> dict:
    return {**os.environ, "RNIXFS_TEST_TAG": tag}


def tagged(tag: str) -> list[psutil.Process]:
    """Live (non-zombie) processes carrying ``RNIXFS_TEST_TAG=tag``."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            if p.environ().get("RNIXFS_TEST_TAG") == tag:
                out.append(p)
        except psutil.Error:
            continue
    return out


def assert_none_left(tag: str, within: float = 1.0) -> None:
    deadline = time.monotonic() + within
    while True:
        left = tagged(tag)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert [(p.pid, p.cmdline()) for p in left] == []


async def wait_for_tagged(tag: str, n: int, within: float = 5.0) -> list[psutil.Process]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = tagged(tag)
        if len(found) >= n:
            return found
        await trio.sleep(0.02)
    raise AssertionError(f"expected {n} tagged processes, saw {len(tagged(tag))}")


def go(fn, *args):
    return trio.run(fn, *args)


async def sh(command: str, *, timeout: float | None = 10, output_limit: int = 1 << 20,
             cwd: Path | str = "/tmp", env: dict | None = None, **kw) -> ShellResult:
    return await shell.run(command, cwd=cwd, env=env, timeout=timeout, output_limit=output_limit, **kw)


# -- run(): status, output, environment -----------------------------------------------------
def test_exit_code_and_combined_output():
    r = go(sh, "echo out; echo err >&2; echo more; exit 3")
    assert (r.exit_code, r.signal, r.status) == (3, None, 3)
    assert r.output == b"out\nerr\nmore\n"          # one pipe: written order is kept
    assert not r.truncated and not r.timed_out and r.total_bytes == 13
    assert 0 < r.duration < 5


def test_killed_by_a_signal():
    r = go(sh, "echo before; kill -TERM $$")
    assert (r.exit_code, r.signal, r.status, r.signal_name) == (None, 15, 143, "TERM")
    assert r.output == b"before\n"
    assert r.trailer() == b"[exit 143 signal=TERM]\n"


def test_stdin_is_dev_null_and_cwd_env(tmp_path):
    (tmp_path / "here.txt").write_text("x")
    r = go(lambda: sh('cat; read line; echo "read=$?"; ls; echo "$GREETING"; readlink /proc/self/ns/pid',
                      cwd=tmp_path, env={**os.environ, "GREETING": "hello"}))
    lines = r.output.decode().splitlines()
    assert lines[:3] == ["read=1", "here.txt", "hello"]
    assert lines[3] != os.readlink("/proc/self/ns/pid")   # bwrap: its own pid namespace


def test_the_supervisor_leads_a_session_of_its_own(unsandboxed):
    """Read with host pids: a sandboxed command sees 0 for a leader outside its namespace,
    and so may the test itself when it runs in a container."""
    seen = []
    r = go(lambda: sh('cut -d" " -f6 /proc/$$/stat', on_start=seen.append))
    sid = int(r.output)
    assert sid == seen[0] == r.pid and sid != os.getsid(0)


@pytest.fixture
def unsandboxed():
    """Commands run without bwrap (host pids are then what the command sees)."""
    saved = shell._current
    shell.configure(Sandbox("none", "off", "test"))
    yield
    shell._current = saved


def test_on_start_gets_the_supervisor_every_process_descends_from(unsandboxed):
    seen = []
    r = go(lambda: sh('echo "$PPID $$"; bash -c \'echo "$PPID"; true\'; true', on_start=seen.append))
    supervisor, bash, inner_parent = (int(x) for x in r.output.split())
    assert seen == [supervisor] == [r.pid]
    assert inner_parent == bash                     # nested: further down, same root


def test_on_start_gets_the_root_every_process_descends_from_in_the_sandbox():
    """In bwrap the command sees namespace pids; on the host, it is below ``on_start``'s pid."""
    seen, ancestors = [], []

    async def body():
        async def started(pid):
            seen.append(pid)

        async with trio.open_nursery() as n:
            async def probe():
                while not ancestors:
                    for p in psutil.Process(os.getpid()).children(recursive=True):
                        try:
                            if p.name() == "sleep":
                                ancestors.extend(a.pid for a in p.parents())
                        except psutil.Error:
                            pass
                    await trio.sleep(0.02)
            n.start_soon(probe)
            r = await sh("sleep 1.5; echo $$", on_start=started)
            n.cancel_scope.cancel()
        return r

    r = go(body)
    assert r.exit_code == 0 and seen == [r.pid] and r.pid in ancestors


def test_async_on_start():
    seen = []

    async def started(pid):
        await trio.sleep(0)
        seen.append(pid)

    r = go(lambda: sh("true", on_start=started))
    assert seen == [r.pid] and r.exit_code == 0


def test_sigpipe_is_default_in_the_command():
    r = go(sh, "yes | head -n 2; echo \"${PIPESTATUS[0]}\"")
    assert r.output == b"y\ny\n141\n"                # yes died of SIGPIPE, as in a terminal


def test_output_limit_keeps_head_and_tail():
    r = go(lambda: sh("seq 1 100000", output_limit=1000))
    assert r.truncated and r.total_bytes == len(b"\n".join(b"%d" % i for i in range(1, 100001))) + 1
    head, marker, tail = r.output.partition(b"[... output truncated: ")
    assert head.startswith(b"1\n2\n3\n") and len(head) <= 501
    assert tail.endswith(b"99999\n100000\n")
    assert marker and b"bytes omitted ...]\n" in tail
    assert len(r.output) < 1000 + 100


def test_big_output_is_drained_fast():
    t = time.monotonic()
    r = go(lambda: sh("head -c 20000000 /dev/zero", output_limit=4096))
    assert r.truncated and r.total_bytes == 20_000_000 and r.exit_code == 0
    assert time.monotonic() - t < 10


def test_small_output_untouched():
    r = go(lambda: sh("printf abc", output_limit=3))
    assert r.output == b"abc" and not r.truncated


def test_bad_requests():
    for cmd in ("echo a\0b", b"echo \0"):
        with pytest.raises(SyscallError) as info:
            go(sh, cmd)
        assert info.value.code is Code.INVALID and info.value.device == "/dev/shell"
    with pytest.raises(SyscallError) as info:
        go(sh, "x" * (shell.MAX_COMMAND + 1))
    assert info.value.code is Code.TOO_BIG
    with pytest.raises(SyscallError) as info:
        go(lambda: sh("true", cwd="/nonexistent-rnix-dir"))
    assert info.value.code is Code.NOT_FOUND


# -- the whole tree dies ----------------------------------------------------------------------
TREES = {
    "background": "sleep 600 & sleep 600",
    "nested": "bash -c \"bash -c 'sleep 600'\"",
    "setsid": "setsid sleep 600 & sleep 600",
    "double-fork": "(setsid sleep 600 &); (sleep 600 &); sleep 600",
    "nohup-disown": "nohup sleep 600 >/dev/null 2>&1 & disown; sleep 600",
    "new-pgid": "set -m; sleep 600 & sleep 600",
    "ignores-term": "trap '' TERM; sleep 600 & sleep 600",
    "stopped": "sleep 600 & kill -STOP $!; kill -STOP $$",
}
# (bash execs the last simple command of a list itself, so fewer bash processes than it looks)
MIN_TAGGED = {"background": 3, "nested": 2, "setsid": 3, "double-fork": 4, "nohup-disown": 3,
              "new-pgid": 3, "ignores-term": 3, "stopped": 3}   # supervisor + bash + sleeps


@pytest.mark.parametrize("kind", list(TREES))
def test_timeout_kills_the_whole_tree(kind):
    tag = uuid.uuid4().hex
    t = time.monotonic()
    r = go(lambda: sh(TREES[kind], timeout=0.6, env=tagged_env(tag), kill_grace=0.3))
    elapsed = time.monotonic() - t
    assert r.timed_out and r.exit_code is None and r.signal in (signal.SIGTERM, signal.SIGKILL)
    if kind == "ignores-term":
        assert r.signal == signal.SIGKILL
    assert elapsed < 0.6 + 0.3 + 1.5
    assert_none_left(tag)


@pytest.mark.parametrize("kind", ["background", "nested", "double-fork", "setsid", "ignores-term"])
def test_cancellation_kills_the_whole_tree(kind):
    """A `kill` of the agent cancels the trio scope that awaits run()."""
    tag = uuid.uuid4().hex

    async def main():
        with trio.move_on_after(5):
            async with trio.open_nursery() as nursery:
                async def victim():
                    await sh(TREES[kind], timeout=600, env=tagged_env(tag), kill_grace=0.3)
                nursery.start_soon(victim)
                await wait_for_tagged(tag, MIN_TAGGED[kind])
                t = time.monotonic()
                nursery.cancel_scope.cancel()
        return time.monotonic() - t

    assert go(main) < 2.0
    assert_none_left(tag)


def test_background_jobs_die_when_the_command_exits():
    tag = uuid.uuid4().hex
    t = time.monotonic()
    r = go(lambda: sh("sleep 600 & (setsid sleep 600 &); nohup sleep 600 >/dev/null 2>&1 & echo done",
                      env=tagged_env(tag)))
    assert r.exit_code == 0 and r.output == b"done\n" and not r.timed_out
    assert time.monotonic() - t < 3                  # did not wait for the sleeps
    assert_none_left(tag)


def test_many_children():
    tag = uuid.uuid4().hex
    r = go(lambda: sh("for i in $(seq 60); do sleep 600 & done; wait", timeout=0.8,
                      env=tagged_env(tag), kill_grace=0.2))
    assert r.timed_out
    assert_none_left(tag)


def test_daemon_death_takes_the_tree_along(tmp_path):
    """The supervisor's control pipe closes when the daemon dies: the tree is killed."""
    tag = uuid.uuid4().hex
    script = tmp_path / "daemon.py"
    script.write_text(
        "import trio\nfrom rnixfs.devices import shell\n"
        "trio.run(lambda: shell.run('sleep 600 & (setsid sleep 600 &); sleep 600', cwd='/tmp',"
        " env=None, timeout=600, output_limit=100))\n")
    root = Path(__file__).resolve().parent.parent
    daemon = subprocess.Popen([sys.executable, str(script)], env={**tagged_env(tag), "PYTHONPATH": str(root)})
    try:
        go(wait_for_tagged, tag, 5)                  # daemon, supervisor, bash, 3 sleeps (one orphan)
        daemon.kill()
        daemon.wait()
        assert_none_left(tag, within=3)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()


def test_kill_tree_is_idempotent():
    async def main():
        assert await kill_tree(os.getpid() + 10_000_000) == 0   # no such process: no-op
    go(main)


# -- ShellSession: the dev/shell handle --------------------------------------------------------
async def read_to_eof(sess: ShellSession, size: int = 65536) -> bytes:
    out = b""
    while True:
        chunk = await sess.read(size)
        if not chunk:
            return out
        out += chunk


def session_test(fn, **kw):
    async def main():
        async with trio.open_nursery() as nursery:
            opts = dict(cwd="/tmp", env=None, timeout=10, output_limit=1 << 20, kill_grace=0.3)
            opts.update(kw)
            sess = ShellSession(nursery, **opts)
            try:
                return await fn(sess)
            finally:
                await sess.aclose()
    return trio.run(main)


def test_session_output_then_trailer_then_eof():
    async def t(sess):
        assert await sess.read() == b""                   # nothing written: EOF at once
        assert sess.write(b"echo hello; echo world >&2\n") == 27
        assert await read_to_eof(sess) == b"hello\nworld\n[exit 0]\n"
        assert await sess.read() == b""                   # idle again
        sess.write(b"exit 7\n")
        assert await read_to_eof(sess) == b"[exit 7]\n"
        return sess.results
    results = session_test(t)
    assert [r.exit_code for r in results] == [0, 7]


def test_session_one_eof_per_command_and_queueing():
    async def t(sess):
        sess.write(b"echo one\necho two\n\n   \necho three\n")   # blank lines run nothing
        outs = [await read_to_eof(sess) for _ in range(3)]
        assert outs == [b"one\n[exit 0]\n", b"two\n[exit 0]\n", b"three\n[exit 0]\n"]
        assert await sess.read() == b""
    session_test(t)


def test_session_trailer_tokens_are_parsable():
    async def t(sess):
        sess.write(b"printf partial\n")
        out = await read_to_eof(sess)
        assert out == b"partial\n[exit 0 noeol]\n"
        sess.write(b"kill -KILL $$\n")
        assert await read_to_eof(sess) == b"[exit 137 signal=KILL]\n"
        sess.write(b"seq 1 100000\n")
        out = await read_to_eof(sess)
        assert out.endswith(b"omitted ...]\n[exit 0 truncated]\n")
        last = out.splitlines()[-1]
        m = TRAILER.match(last)
        assert m and m.group(1) == b"0" and m.group(2) == b" truncated"
        assert len(out) < 1000 + 200
    session_test(t, output_limit=1000)


def test_session_timeout():
    async def t(sess):
        tag = uuid.uuid4().hex
        sess.env = tagged_env(tag)
        sess.write(b"echo started; sleep 600 & sleep 600\n")
        out = await read_to_eof(sess)
        assert out == b"started\n[exit 143 signal=TERM timeout]\n"
        assert_none_left(tag)
    session_test(t, timeout=0.5)


def test_session_streams_before_the_command_ends():
    async def t(sess):
        sess.write(b"echo first; sleep 0.5; echo second\n")
        t0 = time.monotonic()
        assert await sess.read() == b"first\n"
        assert time.monotonic() - t0 < 0.4
        assert await read_to_eof(sess) == b"second\n[exit 0]\n"
    session_test(t)


def test_session_small_reads_and_partial_line_runs_on_read():
    async def t(sess):
        sess.write(b"echo abcdef")                       # no newline yet
        assert sess.busy is False
        out = b""
        while chunk := await sess.read(3):
            out += chunk
        assert out == b"abcdef\n[exit 0]\n"
        sess.write(b"echo a \\\n b\n")                 # backslash-newline continues the line
        assert await read_to_eof(sess) == b"a b\n[exit 0]\n"
    session_test(t)


def test_session_close_kills_what_runs():
    tag = uuid.uuid4().hex

    async def t(sess):
        sess.env = tagged_env(tag)
        sess.write(b"sleep 600 & (setsid sleep 600 &); sleep 600\n")
        sess.write(b"echo never\n")
        await wait_for_tagged(tag, 4)                    # supervisor + 3 sleeps
        t0 = time.monotonic()
        await sess.aclose()
        assert time.monotonic() - t0 < 2
        assert await sess.read() == b""
        with pytest.raises(SyscallError):
            sess.write(b"echo again\n")
    session_test(t)
    assert_none_left(tag)


def test_session_write_errors_are_all_or_nothing():
    async def t(sess):
        for data, code in ((b"echo a\0\n", Code.INVALID), (b"x" * 5000 + b"\n", Code.TOO_BIG),
                           (b"true\n" * 5, Code.BUSY)):
            with pytest.raises(SyscallError) as info:
                sess.write(data)
            assert info.value.code is code and info.value.device == "/dev/shell"
        assert not sess.busy
        sess.write(b"true\n" * 4)
        for _ in range(4):
            assert await read_to_eof(sess) == b"[exit 0]\n"
    session_test(t, max_queue=4, max_command=4096)


def test_session_callbacks_and_bad_cwd():
    events = []

    async def t(sess):
        sess.write(b"echo hi\n")
        await read_to_eof(sess)
        sess.cwd = "/nonexistent-rnix-dir"
        sess.write(b"echo there\n")
        out = await read_to_eof(sess)
        assert out.startswith(b"rnix: cannot run the command:") and out.endswith(b"[exit 126]\n")

    session_test(t, on_start=lambda pid, cmd: events.append(("start", cmd, pid > 0)),
                 on_exit=lambda cmd, res: events.append(("exit", cmd, res.status)))
    assert events == [("start", "echo hi", True), ("exit", "echo hi", 0), ("exit", "echo there", 126)]
