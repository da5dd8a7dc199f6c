"""Tier 3: proc/ cache policy on a real mount (docs/architecture.md, "proc/
files and their cache policy").

A zombie's files are page-cached with long timeouts, a live process's are
read fresh: these tests check that what `cat`, `stat` and `getfattr` see is
never stale — across exit, pause/resume, steering and reap.
"""
from __future__ import annotations

import json
import os

import pytest

from tests.mountutil import Mount, needs_fuse, served_mount, sh, wait_for

pytestmark = [needs_fuse, pytest.mark.mount]

SLOW = "[[chunk-delay:0.1]] [[tokens:6]] slow"
HANG = json.dumps({"intent": "[[delay:60]] hang", "step_timeout": 0})


@pytest.fixture(scope="module")
def mnt(tmp_path_factory):
    with served_mount(tmp_path_factory.mktemp("proccache")) as m:
        yield m


def run(m: Mount, script: str, timeout: float = 60):
    return sh(script, env={**os.environ, "M": str(m.path)}, timeout=timeout)


def ok(m: Mount, script: str, timeout: float = 60) -> str:
    res = run(m, script, timeout)
    assert res.returncode == 0, f"{script!r} failed ({res.returncode}): {res.stderr}"
    return res.stdout


def test_status_read_across_exit_is_whole_and_fresh(mnt):
    """`stat status` while running lets the kernel keep a live size for a
    moment; right after exit the zombie's status is page-cached: it must be
    read whole (never cut at the old size) and say zombie."""
    for _ in range(3):
        pid = mnt.spawn(HANG)
        d = f"$M/proc/{pid}"
        wait_for(lambda: json.loads(ok(mnt, f'cat "{d}/status"'))["fds"], 30, what="the step to start")
        out = ok(mnt, f'stat -c %s "{d}/status" "{d}/result" >/dev/null; echo kill > "{d}/ctl"; '
                      f'cat "{d}/wait" >/dev/null; cat "{d}/status"; echo "@@"; stat -c %s "{d}/status"')
        status_text, size = out.split("@@\n")
        status = json.loads(status_text)
        assert status["state"] == "zombie" and status["exit_code"] == 137
        assert int(size) == len(status_text.encode())


def test_result_of_a_finished_process(mnt):
    pid = mnt.spawn(SLOW)
    d = f"$M/proc/{pid}"
    out = ok(mnt, f'cat "{d}/result"; echo "@@"; cat "{d}/wait" >/dev/null; cat "{d}/result"')
    running, done = out.split("@@\n")
    assert running == "" and done == "alpha bravo charlie delta echo foxtrot\n"


def test_zombie_files_stay_right_until_reap_then_enoent(mnt):
    pid = mnt.spawn("quick")
    mnt.wait(pid)
    d = f"$M/proc/{pid}"
    first = ok(mnt, f'cat "{d}/status"')
    again = ok(mnt, f'cat "{d}/status"; cat "{d}/status"')
    assert again == first + first and json.loads(first)["state"] == "zombie"
    sizes = ok(mnt, f'stat -c "%n %s" "{d}/status" "{d}/trace" "{d}/wait" "{d}/intent"').split()
    assert int(sizes[1]) == len(first.encode())
    assert int(sizes[3]) == len(ok(mnt, f'cat "{d}/trace"').encode())
    assert ok(mnt, f'cat "{d}/wait"').startswith("exited(0) ")
    assert ok(mnt, f'cat "{d}/intent"') == "quick\n"
    ok(mnt, f'echo reap > "{d}/ctl"')
    # open always reaches the daemon: a reaped process's file is gone at once
    res = run(mnt, f'cat "{d}/status"')
    assert res.returncode == 1 and "No such file or directory" in res.stderr
    assert str(pid) not in ok(mnt, 'ls "$M/proc"').split()
    # and the kernel forgets the cached names (told in the background)
    wait_for(lambda: run(mnt, f'stat "{d}" "{d}/status"').returncode != 0, 10,
             what="the reaped process's names to go")


def test_live_status_and_context_show_each_change(mnt):
    pid = mnt.spawn(HANG)
    d = f"$M/proc/{pid}"
    try:
        wait_for(lambda: json.loads(ok(mnt, f'cat "{d}/status"'))["fds"], 30, what="the step to start")
        assert json.loads(ok(mnt, f'cat "{d}/status"'))["paused"] is False
        paused = ok(mnt, f'echo pause > "{d}/ctl" && cat "{d}/status"')
        assert json.loads(paused)["paused"] is True
        resumed = ok(mnt, f'echo resume > "{d}/ctl" && cat "{d}/status"')
        assert json.loads(resumed)["paused"] is False
        before = ok(mnt, f'cat "{d}/context"')
        after = ok(mnt, f'echo "look at the tests" >> "{d}/context" && cat "{d}/context"')
        assert after.startswith(before)
        last = json.loads(after.splitlines()[-1])
        assert last == {"role": "user", "content": "look at the tests", "pending": True}
        # stat's size catches up with the bytes (the kernel's copy is invalidated)
        wait_for(lambda: int(ok(mnt, f'stat -c %s "{d}/context"')) == len(after.encode()), 10,
                 what="context's size to follow its bytes")
    finally:
        run(mnt, f'echo kill > "{d}/ctl"')
    mnt.wait(pid)
    assert json.loads(ok(mnt, f'cat "{d}/status"'))["exit_code"] == 137


def test_xattr_queries_on_proc_answer_quickly(mnt):
    pid = mnt.spawn("quick")
    mnt.wait(pid)
    d = f"$M/proc/{pid}"
    res = run(mnt, f'getfattr -d "{d}" "{d}/status" "{d}/trace"')
    assert res.returncode == 0 and res.stdout == ""
    res = run(mnt, f'getfattr -n user.nope "{d}/status"')
    assert res.returncode == 1 and "No such attribute" in res.stderr
    # no ACLs or security labels in the mount: "not supported", so ls stops asking
    for name in ("security.selinux", "system.posix_acl_access", "trusted.x"):
        res = run(mnt, f'getfattr -n {name} "{d}/status"')
        assert res.returncode == 1 and "Operation not supported" in res.stderr, (name, res.stderr)
    # the daemon's own attribute is still served on the root
    assert json.loads(os.getxattr(mnt.path, "user.rnixfs.daemon"))["pid"] == mnt.daemon_pid
    # ls -l over many zombies: every entry listed with its attributes
    pids = [mnt.spawn(f"many {i}") for i in range(20)]
    mnt.wait(pids[-1])
    listing = ok(mnt, 'ls -l "$M/proc"')
    for p in pids:
        assert any(line.split()[-1] == str(p) and line.startswith("dr-x") for line in listing.splitlines())
