"""The state directory under hostile conditions: a second daemon on it, damaged
rows, a store that cannot be written, a full disk (see README.md, "State
directory and store")."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess

import psutil
import pytest

from tests.mountutil import (
    cleanup, do_mount, mounted_points, needs_fuse, rnixfs, scripted_providers, sh, wait_for,
)

pytestmark = [needs_fuse, pytest.mark.mount]

HANG = json.dumps({"intent": "[[delay:60]] hang", "step_timeout": 0})


def daemons_for(path) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "mount" in cmd and str(path) in cmd and p.pid != os.getpid():
            found.append(p)
    return found


def error_line(res: subprocess.CompletedProcess) -> str:
    assert res.returncode != 0, res.stdout
    assert "Traceback" not in res.stderr, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1, res.stderr
    return lines[0]


# ------------------------------------------------------------- one daemon per state

def test_second_mount_on_the_same_state_dir_is_refused(mount_factory, scripted_server, tmp_path):
    yaml = scripted_providers(scripted_server.url)
    first = mount_factory(yaml, name="first")
    hang = first.spawn(HANG)
    wait_for(lambda: first.status(hang)["state"] == "running", 30, what="running")

    second = tmp_path / "second"
    second.mkdir()
    for extra in ((), ("--foreground",)):
        res = rnixfs("mount", str(second), "--project", str(first.project), "--state-dir",
                     str(first.state_dir), "--config-dir", str(first.config_dir), *extra,
                     check=False, timeout=120)
        reason = error_line(res)
        assert f"pid {first.daemon_pid}" in reason and str(first.path) in reason, reason
        assert str(first.state_dir) in reason
        assert str(second) not in mounted_points()
        wait_for(lambda: not daemons_for(second), 30, what="the refused daemon to exit")

    # the first keeps working, its process untouched in memory and in the store
    assert first.status(hang)["state"] == "running"
    rows = {r["pid"]: r for r in map(json.loads, rnixfs(
        "ps", "--all", "--json", "--state-dir", str(first.state_dir)).stdout.splitlines())}
    assert rows[hang]["state"] == "running" and rows[hang]["exit_code"] is None
    done = first.spawn("still here")
    assert first.wait(done).startswith("exited(0) ")
    sh(f'echo kill > "{first.p(f"proc/{hang}/ctl")}"', check=True)
    assert first.wait(hang).startswith("exited(137) ")
    assert first.status(hang)["state"] == "zombie"  # not turned back, not dead

    # once the first is gone, the directory is free again
    rnixfs("umount", str(first.path))
    again = mount_factory(yaml, name="second")
    assert again.wait(again.spawn("after")).startswith("exited(0) ")


def test_a_killed_daemon_does_not_keep_the_lock(mount_factory, scripted_server):
    yaml = scripted_providers(scripted_server.url)
    first = mount_factory(yaml, name="first")
    os.kill(first.daemon_pid, signal.SIGKILL)
    wait_for(lambda: not psutil.pid_exists(first.daemon_pid)
             or psutil.Process(first.daemon_pid).status() == psutil.STATUS_ZOMBIE, 30, what="death")
    rnixfs("umount", str(first.path))  # the stale mount
    second = mount_factory(yaml, name="second")
    assert second.wait(second.spawn("hello")).startswith("exited(0) ")
