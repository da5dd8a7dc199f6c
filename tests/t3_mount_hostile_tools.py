"""Hostile tool inputs through a real mount: a model-chosen Grep regex or
Glob pattern that would backtrack for hours under Python's ``re`` must
neither freeze the mount nor make its process unkillable (docs/devices.md,
"Grep and Glob")."""
from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.mountutil import needs_fuse, sh, wait_for

pytestmark = [needs_fuse, pytest.mark.mount]

EVIL_REGEX = "(a*)*b"
EVIL_GLOB = "*a" * 16 + "*b"


def call(name, args, cid):
    return {"id": cid, "function": {"name": name, "arguments": json.dumps(args)}}


class StatProbe:
    """``stat`` on the mount in a loop; records the slowest answer."""

    def __init__(self, path):
        self.path, self.worst, self.failures = str(path), 0.0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                res = subprocess.run(["stat", self.path], capture_output=True, timeout=30)
                if res.returncode != 0:
                    self.failures.append(res.stderr)
            except subprocess.TimeoutExpired:
                self.failures.append(b"stat hung for 30 s")
            self.worst = max(self.worst, time.monotonic() - t0)
            time.sleep(0.05)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(60)


def hostile_project(project):
    (project / "evil.txt").write_text(("a" * 34 + "c\n") * 20000)
    (project / ("a" * 250 + "c")).write_text("x")   # the top-level Glob meets a long name too
    deep = project / "names"
    deep.mkdir()
    for i in range(50):
        (deep / ("a" * 200 + f"{i:03d}c")).write_text("x")


def tool_results(m, pid):
    return [json.loads(line)["content"] for line in open(m.p(f"proc/{pid}/context"))
            if '"role": "tool"' in line]


def test_redos_grep_and_glob_leave_the_mount_answering(mnt, scripted_server):
    hostile_project(mnt.project)
    mark = "REDOS-SEARCH"
    scripted_server.enqueue({"match": mark, "tool_calls": [
        call("Grep", {"pattern": EVIL_REGEX}, "g1"),
        call("Grep", {"pattern": "(x+x+)+y", "glob": "**/*a*a*a*a*a*a*a*a*a*a*a*a*b"}, "g2"),
        call("Glob", {"pattern": EVIL_GLOB}, "l1"),
        call("Glob", {"pattern": "**/" + EVIL_GLOB}, "l2"),
        call("Grep", {"pattern": r"(a)\1"}, "g3")]})
    scripted_server.enqueue({"match": mark, "content": "searched"})
    with StatProbe(mnt.path) as probe:
        pid = mnt.spawn(mark)
        assert mnt.wait(pid, timeout=120).startswith("exited(0)")
    assert probe.failures == [] and probe.worst < 5.0, (probe.worst, probe.failures)
    results = tool_results(mnt, pid)
    assert results[:4] == ["(no matches)"] * 4
    assert results[4].startswith("error: bad regular expression") and "linear time" in results[4]
    trace = open(mnt.p(f"proc/{pid}/trace")).read()
    assert 'Grep("(a*)*b", "**") = 0 matches' in trace


def test_a_process_is_killable_after_and_during_hostile_searches(mnt, scripted_server):
    hostile_project(mnt.project)
    mark = "REDOS-KILL"
    scripted_server.enqueue({"match": mark, "tool_calls": [call("Grep", {"pattern": EVIL_REGEX}, "g")]})
    scripted_server.enqueue({"match": mark, "tool_calls": [
        call("Glob", {"pattern": "**/" + EVIL_GLOB}, "l"),
        call("Bash", {"command": "sleep 600", "timeout": 900}, "b")]})
    with StatProbe(mnt.path) as probe:
        pid = mnt.spawn(mark)
        wait_for(lambda: "sleep 600" in open(mnt.p(f"proc/{pid}/trace")).read(), 60,
                 what="the Bash call after the searches")
        t0 = time.monotonic()
        res = sh(f'echo kill > "{mnt.p(f"proc/{pid}/ctl")}"', timeout=30)
        assert res.returncode == 0, res.stderr
        assert mnt.wait(pid, timeout=30).startswith("exited(137)")
        assert time.monotonic() - t0 < 15
    assert probe.failures == [] and probe.worst < 5.0, (probe.worst, probe.failures)
    assert mnt.daemon_alive()


def test_commands_cannot_read_the_daemon_environment(mount_factory, scripted_server, monkeypatch):
    """Agents' Bash and dev/shell: the daemon's environ (its provider keys) is
    out of reach, and ``rnixfs status`` says which sandbox is in force."""
    from rnixfs.devices.sandbox import detect
    from tests.mountutil import rnixfs, scripted_providers

    key = "sk-environ-probe-7788"
    monkeypatch.setenv("RNIXFS_TEST_KEY", key)
    m = mount_factory(scripted_providers(scripted_server.url, api_key="${RNIXFS_TEST_KEY}"))
    with open(f"/proc/{m.daemon_pid}/environ", "rb") as f:     # the secret is there to steal
        assert key.encode() in f.read()
    probe = (f"cat /proc/{m.daemon_pid}/environ; cat /proc/{m.daemon_pid}/cmdline;"
             f" grep -a -l -r {key} /proc/[0-9]*/environ 2>/dev/null; echo probed")
    mark = "ENVIRON-PROBE"
    scripted_server.enqueue({"match": mark, "tool_calls": [call("Bash", {"command": probe}, "e")]})
    scripted_server.enqueue({"match": mark, "content": "done"})
    pid = m.spawn(mark)
    assert m.wait(pid).startswith("exited(0)")
    result = tool_results(m, pid)[0]
    assert "probed" in result and key not in result
    res = sh(f'exec 3<>"{m.p("dev/shell")}"; printf "%s\\n" "$P" >&3; cat <&3',
             env={**os.environ, "P": probe}, timeout=60)
    assert "probed" in res.stdout and key not in res.stdout
    status = rnixfs("status", str(m.path)).stdout
    mode = detect().mode
    assert ("sandbox:   bwrap" if mode == "bwrap" else "sandbox:   NONE") in status
    trace = open(m.p(f"proc/{pid}/trace")).read()
    assert f"sandbox={mode}" in trace


def test_agent_commands_write_only_the_project_in_the_sandbox(mnt, scripted_server):
    from rnixfs.devices.sandbox import detect

    if not detect().active:
        pytest.skip("no working bwrap here: commands run unsandboxed (docs/devices.md)")
    sibling = mnt.project.parent / "outside.txt"        # under /tmp: lands in the private /tmp
    system = Path("/var/tmp") / f"rnixfs-probe-{os.getpid()}"   # read-only in the sandbox
    mark = "WRITE-OUTSIDE"
    scripted_server.enqueue({"match": mark, "tool_calls": [call("Bash", {"command": (
        f"echo in > inside.txt; echo out > {sibling}; echo out > {system} || echo refused;"
        " echo t > /tmp/t && cat /tmp/t;"
        ' echo kid > "$RNIXFS_MOUNT/proc/new" && echo spawned')}, "w")]})
    scripted_server.enqueue({"match": mark, "content": "done"})
    pid = mnt.spawn(mark)
    assert mnt.wait(pid).startswith("exited(0)")
    result = tool_results(mnt, pid)[0]
    assert "refused" in result and "t\n" in result and "spawned" in result, result
    assert (mnt.project / "inside.txt").read_text() == "in\n"
    assert not sibling.exists() and not system.exists() and not os.path.exists("/tmp/t")


def test_kill_ends_a_process_in_the_middle_of_a_slow_grep(mnt, scripted_server):
    """RE2 is linear, but a 3000-state pattern still costs ~100 ms per long
    line: minutes for this file. The mount answers meanwhile (RE2 releases
    the GIL) and ``kill`` ends the process at once, abandoning the search."""
    (mnt.project / "long.txt").write_text(("a" * 3000 + "\n") * 3000)
    mark = "SLOW-GREP"
    scripted_server.enqueue({"match": mark, "tool_calls": [
        call("Grep", {"pattern": "(?:a?){1000}a{1000}b"}, "g")]})
    scripted_server.enqueue({"match": mark, "content": "the search ended before the kill"})
    with StatProbe(mnt.path) as probe:
        pid = mnt.spawn(mark)
        wait_for(lambda: len(scripted_server.requests) >= 1, 30, what="the first step")
        time.sleep(2)                                   # the Grep is under way
        t0 = time.monotonic()
        res = sh(f'echo kill > "{mnt.p(f"proc/{pid}/ctl")}"', timeout=30)
        assert res.returncode == 0, res.stderr
        assert mnt.wait(pid, timeout=30).startswith("exited(137)")
        assert time.monotonic() - t0 < 10
        assert len(scripted_server.requests) == 1       # killed during the Grep, not after
    assert probe.failures == [] and probe.worst < 5.0, (probe.worst, probe.failures)
    assert mnt.daemon_alive()
