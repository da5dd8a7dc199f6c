"""Tier 3: the rnixfs command against real mounts (status, umount, remount,
ps/show from the store, stale mounts, mount failures, --help)."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess

import psutil
import pytest

from tests.mountutil import (
    FUSERMOUNT, Mount, mounted_points, needs_fuse, rnixfs, scripted_providers, sh, wait_for, write_providers,
)

pytestmark = [needs_fuse, pytest.mark.mount]

HANG = json.dumps({"intent": "[[delay:60]] hang", "step_timeout": 0})
SECRET = "sk-rnixfs-test-7f3a9c1e5d2b8046"
SECRET_VAR = "RNIXFS_TEST_API_KEY"


def one_line_error(res: subprocess.CompletedProcess) -> str:
    """A failed command: exit status non-zero and one readable reason line, no
    traceback. (click's usage errors add their "Usage:/Try --help" lines.)"""
    assert res.returncode != 0, res.stdout
    assert "Traceback" not in res.stderr, res.stderr
    lines = [line for line in res.stderr.strip().splitlines() if line]
    reasons = [line for line in lines if line.startswith("Error: ")]
    assert len(reasons) == 1, res.stderr
    if len(lines) > 1:
        assert lines[0].startswith("Usage: ") and res.returncode == 2, res.stderr
    return reasons[0]


def daemons_for(path) -> list[psutil.Process]:
    """Processes (daemons) whose command line names this mount point."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "mount" in cmd and str(path) in cmd and p.pid != os.getpid():
            found.append(p)
    return found


def xattr(m: Mount) -> dict:
    return json.loads(os.getxattr(m.path, "user.rnixfs.daemon"))


# ----------------------------------------------------------------------- status

@pytest.mark.expect_log('stamina.retry_scheduled')
def test_status_text_and_json(mnt):
    done = mnt.spawn("finish me")
    mnt.wait(done)
    hang = mnt.spawn(HANG)
    wait_for(lambda: mnt.status(hang)["state"] == "running", 30, what="running")

    info = json.loads(rnixfs("status", str(mnt.path), "--json").stdout)
    assert info["pid"] == mnt.daemon_pid == xattr(mnt)["pid"]
    assert "rnixfs" in " ".join(psutil.Process(info["pid"]).cmdline())
    assert info["mountpoint"] == str(mnt.path)
    assert info["state_dir"] == str(mnt.state_dir) and info["project"] == str(mnt.project)
    assert info["uptime"] >= 0
    assert info["processes"]["running"] == 1 and info["processes"]["zombie"] == 1
    assert info["processes"].get("paused", 0) == 0
    providers = info["providers"]
    assert providers["default"] == "scripted"
    assert set(providers["providers"]) == {"local", "scripted"}
    assert providers["providers"]["scripted"]["model"] == "scripted-model"
    later = json.loads(rnixfs("status", str(mnt.path), "--json").stdout)
    assert later["uptime"] >= info["uptime"] and later["pid"] == info["pid"]

    text = rnixfs("status", str(mnt.path)).stdout
    assert f"pid {mnt.daemon_pid}" in text
    assert str(mnt.path) in text
    assert "running=1" in text and "zombie=1" in text
    assert "scripted" in text and "local" in text and "scripted-model" in text
    # without a mount point: every mount, ours among them (unless some other
    # mount on this machine is stale, see test_status_of_all_mounts_with_a_stale_one)
    for args in (("status",), ("status", "--json")):
        res = rnixfs(*args, check=False)
        if res.returncode != 0 and str(mnt.path) not in res.stderr:
            continue  # another run's mount on this machine went stale or away (the BUG below)
        assert res.returncode == 0, res.stderr
        if "--json" in args:
            assert any(i["pid"] == mnt.daemon_pid for i in json.loads(res.stdout))
        else:
            assert str(mnt.path) in res.stdout


def _stale(point: str) -> bool:
    try:
        os.getxattr(point, "user.rnixfs.daemon")
    except OSError as exc:
        return exc.errno == errno.ENOTCONN
    return False


def test_status_of_all_mounts_with_a_stale_one(mount_factory, scripted_server):
    yaml = scripted_providers(scripted_server.url)
    live = mount_factory(yaml, name="live")
    dead = mount_factory(yaml, name="dead", state="state-dead")  # one daemon per state dir
    os.kill(dead.daemon_pid, signal.SIGKILL)
    wait_for(lambda: _stale(str(dead.path)), 30, what="the dead mount to go stale")
    res = rnixfs("status", check=False)
    assert str(live.path) in res.stdout, res.stderr
    assert str(dead.path) in res.stdout + res.stderr and "stale" in res.stdout + res.stderr
    res = rnixfs("status", "--json", check=False)
    assert any(i.get("pid") == live.daemon_pid for i in json.loads(res.stdout or "[]")), res.stderr


@pytest.mark.expect_log('stamina.retry_scheduled')
def test_api_keys_never_show(mount_factory, scripted_server, monkeypatch):
    monkeypatch.setenv(SECRET_VAR, SECRET)  # the environment of the mount command
    m = mount_factory(scripted_providers(scripted_server.url, api_key="${%s}" % SECRET_VAR))
    monkeypatch.delenv(SECRET_VAR)
    ok = m.spawn("use the key")
    failed = m.spawn("[[fault:500]] fail with the key")
    assert m.wait(ok).startswith("exited(0) ")
    assert m.wait(failed).startswith("exited(1) ")
    # the key was really used ...
    auth = [{k.lower(): v for k, v in h.items()}.get("authorization") for h in scripted_server.request_headers]
    assert f"Bearer {SECRET}" in auth
    # ... and is nowhere a user can look
    places = {
        "status": rnixfs("status", str(m.path)).stdout,
        "status --json": rnixfs("status", str(m.path), "--json").stdout,
        "xattr": os.getxattr(m.path, "user.rnixfs.daemon").decode(),
        "getfattr": sh(f'getfattr -d -m - "{m.path}"').stdout,
    }
    for pid in (ok, failed):
        for name in ("status", "trace", "events", "context", "result"):
            places[f"{pid}/{name}"] = (m.path / "proc" / str(pid) / name).read_text()
        places[f"show {pid}"] = rnixfs("show", str(pid), "--json", "--state-dir", str(m.state_dir)).stdout
    places["ps"] = rnixfs("ps", "--all", "--json", "--state-dir", str(m.state_dir)).stdout
    assert json.loads(places["status --json"])["providers"]["providers"]["scripted"].get("api_key") in (None, "set")
    rnixfs("umount", str(m.path))
    places["daemon.log"] = m.log()
    for path in m.state_dir.rglob("*"):
        if path.is_file():
            places[f"state file {path.name}"] = path.read_bytes().decode("latin-1")
    leaks = [where for where, text in places.items() if SECRET in text]
    assert not leaks, f"the API key shows in {leaks}"
    assert "mounted at" in places["daemon.log"]


# ----------------------------------------------------------- umount and remount

def test_umount_then_mount_again_keeps_history(mount_factory, scripted_server):
    yaml = scripted_providers(scripted_server.url)
    m1 = mount_factory(yaml)
    a, b = m1.spawn("first run"), m1.spawn("second run")
    m1.wait(a), m1.wait(b)
    assert sh(f'echo reap > "{m1.p(f"proc/{a}/ctl")}"').returncode == 0
    c = m1.spawn(HANG)
    wait_for(lambda: m1.status(c)["state"] == "running", 30, what="running")
    old = [a, b, c]

    res = rnixfs("umount", str(m1.path))
    assert "unmounted" in res.stdout
    assert str(m1.path) not in mounted_points()
    wait_for(lambda: not psutil.pid_exists(m1.daemon_pid)
             or psutil.Process(m1.daemon_pid).status() == psutil.STATUS_ZOMBIE, 30, what="daemon exit")
    assert os.listdir(m1.path) == []

    # without a mount: the store answers
    rows = {r["pid"]: r for r in map(json.loads, rnixfs(
        "ps", "--all", "--json", "--state-dir", str(m1.state_dir)).stdout.splitlines())}
    assert set(old) <= set(rows)
    assert all(rows[p]["state"] == "dead" for p in old)
    assert rows[a]["exit_code"] == 0 and rows[b]["exit_code"] == 0 and rows[c]["exit_code"] == 137
    assert rnixfs("ps", "--state-dir", str(m1.state_dir)).stdout.splitlines()[1:] == []  # none alive
    table = rnixfs("ps", "--all", "--state-dir", str(m1.state_dir)).stdout
    assert "first run" in table and "second run" in table

    shown = rnixfs("show", str(a), "--state-dir", str(m1.state_dir)).stdout
    assert "--- result\necho: first run\n" in shown
    assert "--- trace\n" in shown and "Spawn(\"first run\"" in shown and "Exit(0) = ?" in shown
    shown_json = json.loads(rnixfs("show", str(c), "--json", "--state-dir", str(m1.state_dir)).stdout)
    assert shown_json["exit_code"] == 137 and shown_json["error"]["cause"]
    assert [e["syscall"] for e in shown_json["events"]][0] == "Spawn"
    assert shown_json["events"][-1]["syscall"] == "Exit"

    # mount again on the same state: history stays, PIDs go on above
    m2 = mount_factory(yaml)
    assert m2.daemon_pid != m1.daemon_pid
    assert os.listdir(m2.p("proc")) == ["new"]
    new = m2.spawn("after the restart")
    assert new > max(old)
    assert m2.wait(new).startswith("exited(0) ")
    shown = rnixfs("show", str(b), "--state-dir", str(m2.state_dir)).stdout
    assert "--- result\necho: second run\n" in shown
    rows = {r["pid"]: r for r in map(json.loads, rnixfs(
        "ps", "--all", "--json", "--state-dir", str(m2.state_dir)).stdout.splitlines())}
    assert set(old) | {new} <= set(rows)
    live = [json.loads(x)["pid"] for x in rnixfs(
        "ps", "--json", "--state-dir", str(m2.state_dir)).stdout.splitlines()]
    assert live == [new]


def test_umount_of_a_stale_mount(mount_factory, scripted_server):
    m = mount_factory(scripted_providers(scripted_server.url))
    daemon = xattr(m)["pid"]
    assert daemon == m.daemon_pid
    os.kill(daemon, signal.SIGKILL)

    def enotconn() -> bool:
        try:
            os.stat(m.p("proc/new"))
        except OSError as exc:
            return exc.errno == errno.ENOTCONN
        return False

    wait_for(enotconn, 30, what="ENOTCONN")
    res = sh(f'ls "{m.path}"')
    assert "Transport endpoint is not connected" in res.stderr
    with pytest.raises(OSError) as info:
        os.getxattr(m.path, "user.rnixfs.daemon")
    assert info.value.errno == errno.ENOTCONN
    line = one_line_error(rnixfs("status", str(m.path), check=False))
    assert "stale mount" in line and "rnixfs umount" in line
    assert str(m.path) in mounted_points()

    res = rnixfs("umount", str(m.path), check=False)
    assert res.returncode == 0, res.stderr
    assert str(m.path) not in mounted_points()
    assert os.listdir(m.path) == []
    # and the directory can be mounted again
    m2 = mount_factory(scripted_providers(scripted_server.url))
    assert m2.wait(m2.spawn("back again")).startswith("exited(0) ")


def test_umount_lazy_with_a_busy_reader(mount_factory, scripted_server):
    m = mount_factory(scripted_providers(scripted_server.url))
    busy = subprocess.Popen(["bash", "-c", 'cd "$0" && exec sleep 600', m.p("proc")])
    try:
        wait_for(lambda: os.path.realpath(f"/proc/{busy.pid}/cwd") == m.p("proc"), 30, what="cwd")
        res = rnixfs("umount", str(m.path), check=False)
        assert res.returncode != 0 and "busy" in res.stderr.lower()
        assert str(m.path) in mounted_points()
        res = rnixfs("umount", "--lazy", "--timeout", "3", str(m.path), check=False)
        assert str(m.path) not in mounted_points()  # detached at once ...
        assert res.returncode == 0, res.stderr  # ... and that is a success
    finally:
        busy.kill()
        busy.wait()


# -------------------------------------------------------------- mount failures

def _try_mount(tmp_path, mountpoint, *extra, config_dir=None, env=None):
    """rnixfs mount that is expected to fail; unmount if it did not."""
    state = tmp_path / "state"
    config = config_dir or tmp_path / "config"
    config.mkdir(exist_ok=True)
    was_mounted = str(mountpoint) in mounted_points()
    res = rnixfs("mount", str(mountpoint), "--project", str(tmp_path), "--state-dir", str(state),
                 "--config-dir", str(config), *extra, check=False, env=env)
    # only our own path: other test runs on this machine mount and unmount too
    left = not was_mounted and str(mountpoint) in mounted_points()
    if left:
        subprocess.run([FUSERMOUNT, "-u", "-z", str(mountpoint)], capture_output=True)
    assert not left, f"a failed mount left {mountpoint} mounted"
    return res


def test_mount_on_a_file_fails(tmp_path):
    target = tmp_path / "afile"
    target.write_text("not a dir")
    line = one_line_error(_try_mount(tmp_path, target))
    assert "is a file" in line or "not a directory" in line
    line = one_line_error(_try_mount(tmp_path, tmp_path / "missing"))
    assert "not a directory" in line
    assert not daemons_for(target) and not daemons_for(tmp_path / "missing")


def test_mount_on_a_mounted_path_fails(mnt, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    line = one_line_error(_try_mount(other, mnt.path))
    assert "already mounted" in line
    assert xattr(mnt)["pid"] == mnt.daemon_pid  # the first mount is untouched
    assert mnt.wait(mnt.spawn("still fine")).startswith("exited(0) ")


BROKEN_PROVIDERS = [
    ("invalid-yaml", "providers: [unclosed\n", "invalid YAML"),
    ("unknown-top-key", "bogus: 1\n", "unknown top-level key"),
    ("unknown-type", "providers:\n  x:\n    type: nope\n", "type must be one of"),
    ("missing-base-url", "providers:\n  x:\n    type: openai\n    model: m\n", "base_url is required"),
    ("unset-env", "providers:\n  x:\n    type: openai\n    model: m\n    base_url: http://127.0.0.1:9\n"
                  "    api_key: ${RNIXFS_TEST_SURELY_UNSET}\n", "RNIXFS_TEST_SURELY_UNSET is not set"),
    ("bad-default", "default: nowhere\n", "no provider named 'nowhere'"),
    ("wrong-type", "providers:\n  x:\n    type: openai\n    model: m\n    base_url: http://h\n"
                   "    timeout: soon\n", "must be a positive number"),
]


@pytest.mark.parametrize("text,reason", [b[1:] for b in BROKEN_PROVIDERS], ids=[b[0] for b in BROKEN_PROVIDERS])
def test_mount_with_broken_providers_yaml_fails(tmp_path, text, reason):
    config = tmp_path / "config"
    write_providers(config, text)
    target = tmp_path / "mnt"
    target.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "RNIXFS_TEST_SURELY_UNSET"}
    line = one_line_error(_try_mount(tmp_path, target, config_dir=config, env=env))
    assert "providers.yaml" in line and reason in line
    assert not daemons_for(target)
    assert os.listdir(target) == []


# ------------------------------------------------------------ help and errors

COMMANDS = {
    (): ["mount", "umount", "status", "ps", "show"],
    ("mount",): ["MOUNTPOINT", "--project", "--state-dir", "--config-dir", "--linger", "--foreground"],
    ("umount",): ["MOUNTPOINT", "--lazy"],
    ("status",): ["MOUNTPOINT", "--json"],
    ("ps",): ["--all", "--json", "--state-dir"],
    ("show",): ["PID", "--json", "--state-dir"],
}


@pytest.mark.parametrize("cmd", list(COMMANDS), ids=lambda c: " ".join(c) or "rnixfs")
def test_help_on_every_command(cmd):
    for flag in ("--help", "-h"):
        res = rnixfs(*cmd, flag)
        assert res.returncode == 0 and res.stderr == ""
        assert res.stdout.startswith("Usage: ")
        for word in COMMANDS[cmd]:
            assert word in res.stdout, (cmd, word)


def test_show_and_ps_fail_cleanly(mnt):
    line = one_line_error(rnixfs("show", "999999", "--state-dir", str(mnt.state_dir), check=False))
    assert "no process 999999" in line
    line = one_line_error(rnixfs("show", "1", "--state-dir", str(mnt.state_dir / "nowhere"), check=False))
    assert "no state store" in line
    line = one_line_error(rnixfs("ps", "--state-dir", str(mnt.state_dir / "nowhere"), check=False))
    assert "no state store" in line
    for bad in ("0", "-3", "abc"):
        res = rnixfs("show", bad, "--state-dir", str(mnt.state_dir), check=False)
        assert res.returncode == 2 and "Traceback" not in res.stderr and "Error" in res.stderr


def test_status_and_umount_of_a_plain_directory_fail_cleanly(tmp_path):
    line = one_line_error(rnixfs("status", str(tmp_path), check=False))
    assert "not an rnixfs mount" in line
    line = one_line_error(rnixfs("umount", str(tmp_path), check=False))
    assert "not an rnixfs mount" in line
