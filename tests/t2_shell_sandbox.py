"""The command sandbox and the command's absence from argv (docs/devices.md,
"The command sandbox"): real bwrap, real processes."""
from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest
import trio

from rnixfs.devices import sandbox, shell
from rnixfs.devices.sandbox import Sandbox
from rnixfs.kernel.errors import Code, SyscallError

BOX = sandbox.detect("auto")
needs_bwrap = pytest.mark.skipif(not BOX.active, reason=f"no working bwrap here: {BOX.reason}")


@pytest.fixture
def mode(request):
    saved = shell._current
    shell.configure(BOX if request.param == "bwrap" else Sandbox("none", "off", "test"))
    yield request.param
    shell._current = saved


def run(command, cwd, **kw):
    return trio.run(lambda: shell.run(command, cwd=cwd, env=dict(os.environ), timeout=30,
                                      output_limit=1 << 20, **kw))


def cmdlines() -> list[bytes]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    out.append(f.read())
            except OSError:
                pass
    return out


@pytest.mark.parametrize("mode", [pytest.param("bwrap", marks=needs_bwrap), "none"], indirect=True)
def test_the_command_text_is_in_no_argv(tmp_path, mode):
    secret = f"cmd-secret-{uuid.uuid4().hex}"
    seen: list[bool] = []

    async def body():
        async with trio.open_nursery() as n:
            async def started(pid):
                async def look():
                    await trio.sleep(0.5)          # the command is running: sleep, bash, shim
                    seen.append(any(secret.encode() in c for c in cmdlines()))
                n.start_soon(look)
            r = await shell.run(f"sleep 2 # {secret}\necho done", cwd=tmp_path, env=dict(os.environ),
                                timeout=30, output_limit=4096, on_start=started)
        return r

    r = trio.run(body)
    assert r.output == b"done\n" and r.exit_code == 0 and r.sandbox == mode
    assert seen == [False]


@pytest.mark.parametrize("mode", [pytest.param("bwrap", marks=needs_bwrap), "none"], indirect=True)
def test_bash_c_semantics_are_kept(tmp_path, mode):
    r = run('echo "$0" "$#"; x=1; echo "${x}$(printf %s 2)"; set | grep -c "^__rnix_cmd="; exit 7', tmp_path)
    assert (r.output, r.exit_code) == (b"bash 0\n12\n0\n", 7)
    r = run("echo before\nif then", tmp_path)                     # parsed line by line, like bash -c
    assert r.output.startswith(b"before\n") and r.exit_code == 2
    r = run("cat; ls /proc/$$/fd > fds.txt", tmp_path)          # stdin empty, fd 3 closed
    assert r.exit_code == 0 and sorted((tmp_path / "fds.txt").read_text().split()) == ["0", "1", "2"]


@needs_bwrap
@pytest.mark.parametrize("mode", ["bwrap"], indirect=True)
def test_sandbox_hides_host_processes_and_refuses_writes_outside(tmp_path, mode):
    project = tmp_path / "project"
    project.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    r = run(f"cat /proc/{os.getpid()}/environ; echo rc=$?; ls /proc | grep -c '^[0-9]'", project)
    lines = r.output.decode().splitlines()
    assert "rc=1" in lines and int(lines[-1]) < 10          # a fresh PID namespace
    r = run(f"echo in > inside.txt; echo x > {outside}/o.txt; echo rc=$?; echo y > /usr/rnixfs-probe;"
            f" echo rc=$?; echo t > /tmp/private; cat /tmp/private", project)
    assert (project / "inside.txt").read_text() == "in\n"
    assert not (outside / "o.txt").exists() and not Path("/usr/rnixfs-probe").exists()
    assert r.output.decode().count("rc=1") == 2 and r.output.endswith(b"t\n")
    assert not Path("/tmp/private").exists()


def test_require_refuses_without_bwrap(tmp_path):
    saved = shell._current
    shell.configure(Sandbox("none", "require", "bwrap is not installed"))
    try:
        with pytest.raises(SyscallError) as info:
            run("echo never > ran.txt", tmp_path)
        assert info.value.code is Code.PERMISSION and "required" in info.value.cause
        assert not (tmp_path / "ran.txt").exists()
    finally:
        shell._current = saved


@pytest.mark.expect_log("RNIXFS_SANDBOX='bogus'")
def test_policy_off_and_missing_bwrap(monkeypatch):
    assert sandbox.detect("off").mode == "none"
    monkeypatch.setenv("PATH", "/nonexistent")
    box = sandbox.detect("auto")
    assert box.mode == "none" and "not installed" in box.reason
    monkeypatch.setenv(sandbox.ENV, "bogus")
    assert sandbox.policy_from_env() == "auto"
    monkeypatch.setenv(sandbox.ENV, "REQUIRE")
    assert sandbox.policy_from_env() == "require"


@needs_bwrap
@pytest.mark.parametrize("mode", ["bwrap"], indirect=True)
def test_a_sandbox_that_cannot_be_built_is_exit_126(tmp_path, mode):
    env = {**os.environ, "RNIXFS_MOUNT": str(tmp_path / "gone")}
    r = trio.run(lambda: shell.run("echo never", cwd=tmp_path, env=env, timeout=30, output_limit=4096))
    assert (r.exit_code, r.signal) == (126, None) and b"bwrap" in r.output and b"never" not in r.output


@needs_bwrap
@pytest.mark.parametrize("mode", ["bwrap"], indirect=True)
def test_kill_tree_spares_bwrap_and_the_supervisor_only(tmp_path, mode):
    import psutil

    found = {}

    async def body():
        async def started(pid):
            await trio.sleep(0.5)
            root = psutil.Process(pid)
            found["spared"] = {p: psutil.Process(p).name() for p in shell._supervisors(root)}
            found["all"] = {p.pid: p.name() for p in root.children(recursive=True)}
        return await shell.run("sleep 2", cwd=tmp_path, env=dict(os.environ), timeout=30,
                               output_limit=4096, on_start=started)

    r = trio.run(body)
    assert r.exit_code == 0
    spared = sorted(found["spared"].values())
    assert spared[0] == "bwrap" and spared[1].startswith("python") and len(spared) == 2
    assert "sleep" in found["all"].values() and "bash" in found["all"].values()


def test_protect_daemon_makes_the_process_non_dumpable():
    import subprocess
    import sys

    code = ("import ctypes; from rnixfs.devices.sandbox import protect_daemon;"
            "libc = ctypes.CDLL(None); before = libc.prctl(3, 0, 0, 0, 0);"   # PR_GET_DUMPABLE
            "ok = protect_daemon(); print(before, ok, libc.prctl(3, 0, 0, 0, 0))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.stdout.split() == ["1", "True", "0"], res.stderr


def test_a_supervisor_living_under_tmp_stays_visible(monkeypatch, tmp_path):
    """A checkout or virtualenv under /tmp (as CI clones are) is bound
    read-only over the private /tmp, or the supervisor could not start."""
    from rnixfs.devices import sandbox
    venv = tmp_path / "venv"
    venv.mkdir()
    monkeypatch.setattr(sandbox.sys, "prefix", str(venv))
    args = sandbox.bwrap_args(cwd="/", writable=[])
    assert str(tmp_path).startswith("/tmp/")
    private_tmp = next(k for k in range(len(args) - 1) if args[k:k + 2] == ["--tmpfs", "/tmp"])
    binds = [k for k in range(len(args) - 1) if args[k] == "--ro-bind" and args[k + 1] == os.path.realpath(venv)]
    assert binds and binds[0] > private_tmp  # bound after the private /tmp, so it shows
