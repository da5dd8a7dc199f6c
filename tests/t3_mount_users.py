"""Two users on one mount (--allow-other): a process's files belong to the
uid that spawned it and nobody else may read them; reads that wait are
counted per uid (see README.md, "Other users")."""
from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pyfuse3
import pytest
import trio

from rnixfs.fuse import inodes
from tests.mountutil import cleanup, do_mount, needs_fuse, scripted_providers, sh
from tests.t2_adapter import ME, fuse_errno, spawn, with_ops

NOBODY = 65534


def as_nobody(script: str, **kw):
    return sh(f"setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups bash -c {_quote(script)}", **kw)


def _quote(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


@pytest.fixture
def shared_mount(scripted_server):
    if os.getuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to act as a second user")
    base = Path(tempfile.mkdtemp(prefix="rnixfs-users-", dir="/tmp"))
    base.chmod(0o755)  # the second user must reach the mount point
    m = None
    try:
        m = do_mount(base, scripted_providers(scripted_server.url), "--allow-other")
        yield m
    finally:
        if m is not None:
            cleanup(m)
        shutil.rmtree(base, ignore_errors=True)


@needs_fuse
@pytest.mark.mount
def test_another_user_cannot_read_or_steer_my_processes(shared_mount):
    m = shared_mount
    (m.project / "secret.txt").write_text("TOPSECRET\n")
    (m.project / "secret.txt").chmod(0o600)
    done = m.spawn("remember TOPSECRET")
    m.wait(done)
    hang = m.spawn('{"intent": "[[delay:60]] TOPSECRET hang", "step_timeout": 0}')
    try:
        for pid in (done, hang):
            st = os.stat(m.p(f"proc/{pid}"))
            assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o500)
            for name, mode in (("status", 0o400), ("context", 0o600), ("ctl", 0o600), ("trace", 0o400),
                               ("events", 0o400), ("result", 0o400), ("intent", 0o400), ("wait", 0o400)):
                st = os.stat(m.p(f"proc/{pid}/{name}"))
                assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, mode), name
                assert "TOPSECRET" in (Path(m.p(f"proc/{pid}/intent")).read_text())  # root reads

        # the other user sees that the mount and the pids exist, nothing more
        res = as_nobody(f'ls "{m.p("proc")}"')
        assert res.returncode == 0 and str(hang) in res.stdout.split(), res.stderr
        for pid in (done, hang):
            for name in ("status", "context", "trace", "events", "result", "intent", "wait", "fd"):
                res = as_nobody(f'cat "{m.p(f"proc/{pid}/{name}")}"', timeout=30)
                assert res.returncode != 0 and "Permission denied" in res.stderr, (name, res)
                assert "TOPSECRET" not in res.stdout
            res = as_nobody(f'ls "{m.p(f"proc/{pid}")}"')
            assert res.returncode != 0 and "Permission denied" in res.stderr
        for target, data in ((f"proc/{hang}/context", "steer"), (f"proc/{hang}/ctl", "kill"),
                             ("proc/new", "spawn as root"), ("dev/shell", "id")):
            res = as_nobody(f'echo {data} > "{m.p(target)}"')
            assert res.returncode != 0 and "Permission denied" in res.stderr, (target, res)
        res = as_nobody(f'cat "{m.p("dev/fs/secret.txt")}"')
        assert res.returncode != 0 and "TOPSECRET" not in res.stdout
        assert m.status(hang)["state"] == "running"  # untouched
    finally:
        sh(f'echo kill > "{m.p(f"proc/{hang}/ctl")}"')


@needs_fuse
@pytest.mark.mount
def test_dev_fs_gives_new_files_to_their_creator(shared_mount):
    m = shared_mount
    shared = m.project / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    fs = m.p("dev/fs")
    res = as_nobody(f'cd "{fs}/shared" && touch mine && mkdir d && ln -s mine l && mkfifo f && umask 0 &&'
                    f' mkdir -m 0777 open')
    assert res.returncode == 0, res.stderr
    for name in ("mine", "d", "l", "f", "open"):
        st = os.lstat(shared / name)
        assert (st.st_uid, st.st_gid) == (NOBODY, NOBODY), name
    assert stat.S_IMODE(os.stat(shared / "open").st_mode) == 0o777  # the client's umask, once
    res = as_nobody(f'touch "{fs}/not-mine"')
    assert res.returncode != 0 and "Permission denied" in res.stderr
    assert not (m.project / "not-mine").exists()
    res = as_nobody(f'chown 123 "{fs}/shared/mine"')
    assert res.returncode != 0 and "Operation not permitted" in res.stderr
    assert os.stat(shared / "mine").st_uid == NOBODY
    assert sh(f'chown 123:456 "{fs}/shared/mine"').returncode == 0  # root may
    assert (os.stat(shared / "mine").st_uid, os.stat(shared / "mine").st_gid) == (123, 456)


def test_waiting_reads_are_counted_per_uid(tmp_path, scripted_server):
    """8 slots: the daemon's user may hold 6, other users 2 together, one each."""
    alice = SimpleNamespace(pid=os.getpid(), uid=1000, gid=1000, umask=0o22)
    bob = SimpleNamespace(pid=os.getpid(), uid=1001, gid=1001, umask=0o22)
    carol = SimpleNamespace(pid=os.getpid(), uid=1002, gid=1002, umask=0o22)

    async def body(ops, k):
        assert ops.uid == ME.uid
        pid = await spawn(ops, b'{"intent": "[[delay:30]] x", "step_timeout": 0}')
        ino = inodes.pid_ino(pid, inodes.K["wait"])
        out = {}
        async with trio.open_nursery() as n:
            async def hold(ctx):
                fi = await ops.open(ino, os.O_RDONLY, ctx)
                n.start_soon(ops.read, fi.fh, 0, 100)
                await trio.sleep(0.05)

            await hold(alice)
            out["alice_again"] = await fuse_errno(ops.read((await ops.open(ino, os.O_RDONLY, alice)).fh, 0, 100))
            await hold(bob)  # alice's slot does not cost bob his
            out["carol"] = await fuse_errno(ops.read((await ops.open(ino, os.O_RDONLY, carol)).fh, 0, 100))
            for _ in range(6):  # the daemon's user keeps its own share
                await hold(ME)
            out["me_seventh"] = await fuse_errno(ops.read((await ops.open(ino, os.O_RDONLY, ME)).fh, 0, 100))
            out["attr"] = await ops.getattr(inodes.PROC_NEW)
            n.cancel_scope.cancel()
        await k.signal(pid, "kill")
        return out

    out = with_ops(tmp_path, scripted_server.url, body, max_blocking=8)
    assert out["alice_again"] == out["carol"] == out["me_seventh"] == errno.EAGAIN
    assert out["attr"].st_ino == inodes.PROC_NEW
