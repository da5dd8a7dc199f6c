"""Tier 2: the FUSE adapter against a live kernel, without a mount.

Operations methods are called directly (as pyfuse3 would), so errno
mapping and cache policy are checked without the kernel's VFS in between.
"""
from __future__ import annotations

import errno
import json
import os
import stat
from types import SimpleNamespace

import pyfuse3
import pytest
import trio

from rnixfs.fuse import inodes
from rnixfs.fuse.ops import Operations
from rnixfs.kernel.procfs import ProcFiles
from tests.kernelutil import run_with_kernel
from tests.t2_kernel import providers

ME = SimpleNamespace(pid=os.getpid(), uid=0, gid=0, umask=0o22)
GONE = SimpleNamespace(pid=2**22 + 12345, uid=0, gid=0, umask=0o22)  # no such host pid


def with_ops(tmp_path, url, body, *, max_blocking=16):
    async def inner(kernel, nursery):
        ops = Operations(kernel, kernel.providers, nursery, daemon_info=lambda: {"pid": 1},
                         max_blocking=max_blocking)
        return await body(ops, kernel)

    return run_with_kernel(tmp_path, lambda: providers(url, tmp_path), inner, with_nursery=True)


async def fuse_errno(coro) -> int:
    with pytest.raises(pyfuse3.FUSEError) as exc:
        await coro
    return exc.value.errno


async def spawn(ops, data: bytes):
    fi = await ops.open(inodes.PROC_NEW, os.O_RDWR, ME)
    await ops.write(fi.fh, 0, data)
    pid = int((await ops.read(fi.fh, 0, 100)).decode())
    await ops.release(fi.fh)
    return pid


def test_tree_and_modes(tmp_path, scripted_server):
    async def body(ops, k):
        proc = await ops.lookup(inodes.ROOT, b"proc")
        new = await ops.lookup(inodes.PROC, b"new")
        llm = await ops.lookup(await_ino(await ops.lookup(inodes.ROOT, b"dev")), b"llm")
        scripted = await ops.lookup(llm.st_ino, b"scripted")
        missing = await fuse_errno(ops.lookup(inodes.PROC, b"999"))
        zero = await fuse_errno(ops.lookup(inodes.PROC, b"01"))
        xattr = json.loads(await ops.getxattr(inodes.ROOT, b"user.rnixfs.daemon", ME))
        return proc, new, scripted, missing, zero, xattr

    proc, new, scripted, missing, zero, xattr = with_ops(tmp_path, scripted_server.url, body)
    assert stat.S_ISDIR(proc.st_mode) and stat.S_IMODE(new.st_mode) == 0o600
    assert stat.S_ISREG(scripted.st_mode)
    assert missing == zero == errno.ENOENT
    assert xattr == {"pid": 1}


def await_ino(attr):
    return attr.st_ino


def test_spawn_errors_and_readback(tmp_path, scripted_server):
    async def body(ops, k):
        fi = await ops.open(inodes.PROC_NEW, os.O_RDWR, ME)
        codes = [
            await fuse_errno(ops.write(fi.fh, 0, b'{"agent": "nope", "intent": "x"}')),
            await fuse_errno(ops.write(fi.fh, 0, b"{bad json")),
            await fuse_errno(ops.write(fi.fh, 0, b"x" * (64 * 1024 + 1))),
        ]
        await ops.write(fi.fh, 0, b"first")
        await ops.write(fi.fh, 0, b"second")
        text = (await ops.read(fi.fh, 0, 4096)).decode()
        eof = await ops.read(fi.fh, 0, 4096)
        await ops.release(fi.fh)
        return codes, text, eof, len(k.table)

    codes, text, eof, count = with_ops(tmp_path, scripted_server.url, body)
    assert codes == [errno.ENOENT, errno.EINVAL, errno.EFBIG]
    lines = text.splitlines()
    assert lines[0] == 'error: agent "nope" not found'
    assert lines[1].startswith("error: bad JSON") and lines[2].startswith("error: request is")
    assert lines[3:] == ["1", "2"] and eof == b"" and count == 2


def test_cache_policy_and_read_only_files(tmp_path, scripted_server):
    async def body(ops, k):
        pid = await spawn(ops, b"[[chunk-delay:0.2]] [[tokens:4]] slow")
        running = await ops.open(inodes.pid_ino(pid, inodes.K["result"]), os.O_RDONLY, ME)
        trace_attr = await ops.getattr(inodes.pid_ino(pid, inodes.K["trace"]))
        intent = await ops.open(inodes.pid_ino(pid, inodes.K["intent"]), os.O_RDONLY, ME)
        eacces = await fuse_errno(ops.open(inodes.pid_ino(pid, inodes.K["status"]), os.O_WRONLY, ME))
        trunc = await fuse_errno(ops.setattr(inodes.pid_ino(pid, inodes.K["status"]), pyfuse3.EntryAttributes(),
                                             SimpleNamespace(update_size=True), None, ME))
        await k.table[pid].exited_event.wait()
        done = await ops.open(inodes.pid_ino(pid, inodes.K["result"]), os.O_RDONLY, ME)
        result = await ops.read(done.fh, 0, 4096)
        done_attr = await ops.getattr(inodes.pid_ino(pid, inodes.K["result"]))
        return running, trace_attr, intent, eacces, trunc, done, result, done_attr

    running, trace_attr, intent, eacces, trunc, done, result, done_attr = with_ops(
        tmp_path, scripted_server.url, body)
    assert running.direct_io and not running.keep_cache
    assert trace_attr.attr_timeout == 0
    assert intent.keep_cache and not intent.direct_io
    assert eacces == errno.EACCES and trunc == errno.EACCES
    assert done.keep_cache and done_attr.attr_timeout >= 60
    assert result == b"alpha bravo charlie delta\n" and done_attr.st_size == len(result)


def test_ctl_context_and_wait(tmp_path, scripted_server):
    async def body(ops, k):
        pid = await spawn(ops, b"[[chunk-delay:0.2]] [[tokens:5]] slow")
        ctl = await ops.open(inodes.pid_ino(pid, inodes.K["ctl"]), os.O_WRONLY, ME)
        ctx = await ops.open(inodes.pid_ino(pid, inodes.K["context"]), os.O_WRONLY, ME)
        bogus = await fuse_errno(ops.write(ctl.fh, 0, b"bogus\n"))
        empty = await fuse_errno(ops.write(ctx.fh, 0, b"  \n"))
        await ops.write(ctl.fh, 0, b"kill\n")
        wait = await ops.open(inodes.pid_ino(pid, inodes.K["wait"]), os.O_RDONLY, ME)
        line = await ops.read(wait.fh, 0, 4096)
        esrch = await fuse_errno(ops.write(ctl.fh, 0, b"term"))
        steer_dead = await fuse_errno(ops.write(ctx.fh, 0, b"hello"))
        await ops.write(ctl.fh, 0, b"reap")
        gone = await fuse_errno(ops.getattr(inodes.pid_ino(pid, inodes.K["status"])))
        return bogus, empty, line, esrch, steer_dead, gone

    bogus, empty, line, esrch, steer_dead, gone = with_ops(tmp_path, scripted_server.url, body)
    assert bogus == empty == errno.EINVAL
    assert line.startswith(b"exited(137) steps=1 ")
    assert esrch == steer_dead == errno.ESRCH
    assert gone == errno.ENOENT


def test_blocking_reads_notice_gone_callers_and_cap(tmp_path, scripted_server):
    async def body(ops, k):
        pid = await spawn(ops, b'{"intent": "[[delay:30]] x", "step_timeout": 0}')
        wait_gone = await ops.open(inodes.pid_ino(pid, inodes.K["wait"]), os.O_RDONLY, GONE)
        eintr = await fuse_errno(ops.read(wait_gone.fh, 0, 100))
        # One slot: a reader that waits holds it, the next one gets EAGAIN.
        held = await ops.open(inodes.pid_ino(pid, inodes.K["wait"]), os.O_RDONLY, ME)
        async with trio.open_nursery() as n:
            n.start_soon(ops.read, held.fh, 0, 100)
            await trio.sleep(0.2)
            second = await ops.open(inodes.pid_ino(pid, inodes.K["wait"]), os.O_RDONLY, ME)
            eagain = await fuse_errno(ops.read(second.fh, 0, 100))
            attr = await ops.getattr(inodes.PROC_NEW)  # non-blocking calls still answer
            n.cancel_scope.cancel()
        return eintr, eagain, attr

    eintr, eagain, attr = with_ops(tmp_path, scripted_server.url, body, max_blocking=1)
    assert eintr == errno.EINTR and eagain == errno.EAGAIN and attr.st_ino == inodes.PROC_NEW


def test_llm_conversation_handle(tmp_path, scripted_server):
    async def body(ops, k):
        ino = (await ops.lookup(inodes.DEV_LLM, b"scripted")).st_ino
        fi = await ops.open(ino, os.O_RDWR, ME)

        async def drain():
            out = b""
            while chunk := await ops.read(fi.fh, 0, 7):
                out += chunk
            return out

        await ops.write(fi.fh, 0, b"[[chunk-delay:0.05]] hello there")
        busy = await fuse_errno(ops.write(fi.fh, 0, b"too soon"))
        first = await drain()
        await ops.write(fi.fh, 0, b'{"role": "user", "content": "second"}')
        second = await drain()
        bad = await fuse_errno(ops.write(fi.fh, 0, b'{"role": "robot", "content": "x"}'))
        await ops.release(fi.fh)
        return busy, first, second, bad

    busy, first, second, bad = with_ops(tmp_path, scripted_server.url, body)
    assert busy == errno.EBUSY and bad == errno.EINVAL
    assert first == b"echo: hello there\n" and second == b"echo: second\n"
    body = scripted_server.requests[-1]
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]


def with_files(tmp_path, url, body):
    """with_ops, the kernel's on_change hook feeding the adapter's ProcFiles
    (as the daemon wires them)."""
    async def inner(parts):
        return await body(parts.ops, parts.kernel, parts.procfiles)

    return run_with_kernel(tmp_path, lambda: providers(url, tmp_path), inner, with_parts=True)


def test_zombie_files_are_page_cached_live_ones_direct(tmp_path, scripted_server):
    async def body(ops, k, files):
        pid = await spawn(ops, b'{"intent": "[[delay:30]] x", "step_timeout": 0}')
        ino = {name: inodes.pid_ino(pid, inodes.K[name]) for name in ("status", "trace", "wait", "intent")}
        live = {n: await ops.open(i, os.O_RDONLY, ME) for n, i in ino.items() if n != "wait"}
        live_attr = {n: await ops.getattr(i) for n, i in ino.items()}
        live_dir = await ops.getattr(inodes.pid_ino(pid))
        ctl = await ops.open(inodes.pid_ino(pid, inodes.K["ctl"]), os.O_WRONLY, ME)
        await ops.write(ctl.fh, 0, b"kill")
        await k.table[pid].exited_event.wait()
        dead = {n: await ops.open(i, os.O_RDONLY, ME) for n, i in ino.items()}
        dead_attr = {n: await ops.getattr(i) for n, i in ino.items()}
        dead_dir = await ops.getattr(inodes.pid_ino(pid))
        status = await ops.read(dead["status"].fh, 0, 65536)
        wait = await ops.read(dead["wait"].fh, 0, 4096)
        return live, live_attr, live_dir, dead, dead_attr, dead_dir, status, wait

    live, live_attr, live_dir, dead, dead_attr, dead_dir, status, wait = with_files(
        tmp_path, scripted_server.url, body)
    assert live["status"].direct_io and not live["status"].keep_cache
    assert live["trace"].direct_io and live_attr["trace"].attr_timeout == 0
    assert live_attr["status"].attr_timeout <= 1 and live_dir.entry_timeout <= 1
    assert live["intent"].keep_cache and live_attr["intent"].attr_timeout >= 60
    for name in ("status", "trace", "wait", "intent"):
        assert dead[name].keep_cache and not dead[name].direct_io, name
        assert dead_attr[name].attr_timeout >= 60 and dead_attr[name].entry_timeout >= 60, name
    assert dead_dir.attr_timeout >= 60
    assert json.loads(status)["state"] == "zombie" and dead_attr["status"].st_size == len(status)
    assert wait.startswith(b"exited(137) ") and dead_attr["wait"].st_size == len(wait)


def test_status_rendered_once_per_change(tmp_path, scripted_server):
    """The bytes are cached per process: the same object until the kernel
    reports a change (or a fingerprint field moves), then rendered anew."""
    async def body(ops, k, files):
        pid = await spawn(ops, b'{"intent": "[[delay:30]] x", "step_timeout": 0}')
        proc = k.table[pid]
        with trio.fail_after(10):
            while not proc.fds:
                await trio.sleep(0.02)
        files.watch(pid)
        first = files.content(proc, "status")
        same = files.content(proc, "status")
        await k.signal(pid, "pause")  # a checkpoint: on_change
        changed = await files.next_changes()
        paused = files.content(proc, "status")
        proc.pending_input.append("between two hooks")  # no hook: the fingerprint notices
        context = files.content(proc, "context")
        await k.signal(pid, "kill")
        return first, same, changed, paused, context

    first, same, changed, paused, context = with_files(tmp_path, scripted_server.url, body)
    assert same is first and changed == {1}
    assert json.loads(first)["paused"] is False and json.loads(paused)["paused"] is True
    assert b"between two hooks" in context


def test_proc_files_changes_reach_ancestors_and_forget_the_reaped():
    from rnixfs.kernel.process import Account, Process, State

    parent = Process(pid=1, intent="p")
    child = Process(pid=2, intent="c", ppid=1, account=Account(2, parent=parent.account))
    files = ProcFiles()
    before = files.content(parent, "status")
    files.watch(1)
    files.watch(2)
    child.account.charge(10, 0.0)  # the tree's spend shows in the parent's status
    files.changed(child)
    assert files.content(parent, "status") is not before
    assert json.loads(files.content(parent, "status"))["tree"]["tokens"] == 10

    async def drain():
        return await files.next_changes()

    assert trio.run(drain) == {1, 2}
    files.watch(2)
    child.state = State.DEAD
    files.changed(child)  # reaped while watched: reported once (its names go), then forgotten
    files.changed(child)

    async def drain_twice():
        first = await files.next_changes()
        with trio.move_on_after(0.2):
            return first, await files.next_changes()
        return first, None

    assert trio.run(drain_twice) == ({2}, None)


def test_truncate_to_zero_allowed_on_writable_proc_files_only(tmp_path, scripted_server):
    """`echo x > ctl` may truncate first (without atomic O_TRUNC): ctl and
    context accept size 0, read-only files refuse it."""
    async def body(ops, k):
        pid = await spawn(ops, b'{"intent": "[[delay:30]] x", "step_timeout": 0}')
        zero = pyfuse3.EntryAttributes()
        fields = SimpleNamespace(update_size=True)
        ok = [await ops.setattr(inodes.pid_ino(pid, inodes.K[n]), zero, fields, None, ME)
              for n in ("ctl", "context")]
        refused = [await fuse_errno(ops.setattr(inodes.pid_ino(pid, inodes.K[n]), zero, fields, None, ME))
                   for n in ("status", "trace", "intent")]
        await k.signal(pid, "kill")
        return ok, refused

    ok, refused = with_ops(tmp_path, scripted_server.url, body)
    assert [a.st_ino & 15 for a in ok] == [inodes.K["ctl"], inodes.K["context"]]
    assert refused == [errno.EACCES] * 3
