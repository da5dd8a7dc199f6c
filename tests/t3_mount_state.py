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

@pytest.mark.expect_log('mount refused: state directory .* is in use')
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


# ------------------------------------------------------------- damaged store

def _db(m) -> sqlite3.Connection:
    return sqlite3.connect(m.state_dir / "rnixfs.db", timeout=30, isolation_level=None)


@pytest.mark.expect_log('status is damaged')
def test_damaged_rows_are_skipped_and_reported(mount_factory, scripted_server):
    yaml = scripted_providers(scripted_server.url)
    m = mount_factory(yaml)
    good = m.spawn("a good one")
    assert m.wait(good).startswith("exited(0) ")
    rnixfs("umount", str(m.path))
    with _db(m) as db:
        row = db.execute("SELECT * FROM processes WHERE pid=?", (good,)).fetchone()
        damaged = {900: "not json {", 901: "[]", 902: json.dumps({"pid": 902}), 903: "null"}
        for pid, text in damaged.items():
            db.execute("INSERT INTO processes VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                       (pid, "u", 0, "running" if pid % 2 else "dead", "other-daemon", "x",
                        row[6], None, None, None, text))
        db.execute("INSERT INTO events VALUES (?,?,?,?)", (good, 999, "junk line\n", "{broken"))
    sd = ("--state-dir", str(m.state_dir))
    for args in (("ps", "--all"), ("ps", "--all", "--json"), ("ps",)):
        res = rnixfs(*args, *sd, check=False)
        assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
        assert (str(good) in res.stdout) == ("--all" in args)
        shown = [pid for pid in damaged if f"process {pid}: damaged record skipped" in res.stderr]
        assert shown == ([900, 901, 902, 903] if "--all" in args else [901, 903]), res.stderr
    for pid in damaged:
        res = rnixfs("show", str(pid), *sd, check=False)
        assert f"process {pid}" in error_line(res) and "damaged" in res.stderr
    res = rnixfs("show", str(good), "--json", *sd)
    assert [e["syscall"] for e in json.loads(res.stdout)["events"]][-1] == "Exit"
    assert "damaged event" in res.stderr

    # the mount works on such a store; the damaged live rows are retired as they are
    m2 = mount_factory(yaml, name="again")
    assert m2.wait(m2.spawn("after damage")).startswith("exited(0) ")
    with _db(m2) as db:
        states = dict(db.execute("SELECT pid, state FROM processes WHERE pid BETWEEN 900 AND 903"))
        assert states == {900: "dead", 901: "dead", 902: "dead", 903: "dead"}
        assert db.execute("SELECT status FROM processes WHERE pid=900").fetchone()[0] == "not json {"


@pytest.mark.parametrize("counter", ["abc", "-5", "0", "1e400", "9" * 40, ""])
@pytest.mark.expect_log('meta.next_pid', 'store commit failed', 'degraded to read-only', '\\[READ_ONLY\\]', 'status is damaged')
def test_a_bad_pid_counter_does_not_break_spawn(mount_factory, scripted_server, counter):
    yaml = scripted_providers(scripted_server.url)
    m = mount_factory(yaml)
    first = m.spawn("before")
    m.wait(first)
    rnixfs("umount", str(m.path))
    with _db(m) as db:
        db.execute("INSERT OR REPLACE INTO meta VALUES ('next_pid', ?)", (counter,))
    m2 = mount_factory(yaml, name="again")
    pid = m2.spawn("after")
    assert pid > first
    assert m2.wait(pid).startswith("exited(0) ")


def test_a_new_store_has_no_pid_counter_warning(mount_factory, scripted_server):
    # A fresh state directory has no counter yet: that is not damage to warn about.
    m = mount_factory(scripted_providers(scripted_server.url))
    assert m.wait(m.spawn("first")).startswith("exited(0) ")
    assert "next_pid" not in m.log()


@pytest.mark.expect_log('rnixfs\\.store: ', '\\[READ_ONLY\\]', '\\[NO_SPACE\\]')
def test_a_store_that_cannot_be_written_degrades_and_umount_ends(mount_factory, scripted_server):
    m = mount_factory(scripted_providers(scripted_server.url))
    hang = m.spawn(HANG)
    wait_for(lambda: m.status(hang)["state"] == "running", 30, what="running")
    with _db(m) as db:  # a permanent error: the table the daemon writes is replaced
        db.execute("DROP TABLE events")
        db.execute("CREATE TABLE events (x)")
    pid = m.spawn("written into the broken store")
    m.wait(pid, timeout=90)  # ends (in memory) although nothing reaches the disk
    info = wait_for(lambda: (i := json.loads(rnixfs("status", str(m.path), "--json").stdout))
                    .get("store_degraded") and i, 60, what="the store to degrade")
    assert "events" in info["store_degraded"]
    assert "DEGRADED" in rnixfs("status", str(m.path)).stdout
    res = sh(f'echo "one more" > "{m.p("proc/new")}"')
    assert res.returncode != 0 and "Read-only file system" in res.stderr, res.stderr
    assert "degraded to read-only" in m.log()
    # what ran goes on, and can still be killed and read
    assert m.status(hang)["state"] == "running"
    sh(f'echo kill > "{m.p(f"proc/{hang}/ctl")}"', check=True)
    assert m.wait(hang).startswith("exited(137) ")
    res = rnixfs("umount", str(m.path), check=False, timeout=120)
    assert res.returncode == 0, res.stderr
    assert not psutil.pid_exists(m.daemon_pid) or \
        psutil.Process(m.daemon_pid).status() == psutil.STATUS_ZOMBIE


@pytest.fixture
def tiny_state_dir(tmp_path):
    """The state directory on a 2 MiB tmpfs, to fill it up."""
    state = tmp_path / "state"
    state.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(state)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    yield state
    subprocess.run(["umount", "-l", str(state)], capture_output=True)


def test_disk_full_refuses_spawns_and_umount_ends(tiny_state_dir, mount_factory, scripted_server):
    m = mount_factory(scripted_providers(scripted_server.url))
    assert m.state_dir == tiny_state_dir
    assert m.wait(m.spawn("while there is room")).startswith("exited(0) ")
    sh(f'dd if=/dev/zero of="{tiny_state_dir}/filler" bs=64k 2>/dev/null; true', timeout=60)

    def refused():
        res = sh(f'echo "fill me {"x" * 2000}" > "{m.p("proc/new")}"')
        return res.returncode != 0 and res.stderr
    reason = wait_for(refused, 90, interval=0.5, what="spawns to be refused")
    assert "No space left on device" in reason, reason
    info = json.loads(rnixfs("status", str(m.path), "--json").stdout)
    assert "full" in info["store_degraded"]
    res = rnixfs("umount", str(m.path), check=False, timeout=120)
    assert res.returncode == 0 and "unmounted" in res.stdout, res.stderr
    assert str(m.path) not in mounted_points()


def test_a_store_that_is_not_a_database(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "rnixfs.db").write_bytes(b"not sqlite at all\n" * 100)
    for args in (("ps", "--all"), ("show", "1")):
        res = rnixfs(*args, "--state-dir", str(state), check=False)
        assert "not a database" in error_line(res)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    res = rnixfs("mount", str(mnt), "--project", str(tmp_path), "--state-dir", str(state),
                 "--config-dir", str(tmp_path / "config"), check=False, timeout=120)
    assert "not a database" in error_line(res)
    assert str(mnt) not in mounted_points()
