"""Tier 3: proc/ on a real mount, driven by real processes (README.md, "The mount").

Every test mounts in tmp_path through the `mnt` / `mount_factory` fixtures and
talks to the mount only with `echo`, `cat`, `ls`, `jq`, `readlink`, bash
redirections and the like. The default provider is the scripted server, whose
directives (`[[delay:…]]`, `[[chunk-delay:…]]`, `[[tokens:N]]`) make slow steps
without sleeping in the test.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import uuid

import pytest

from tests.mountutil import Mount, needs_fuse, scripted_providers, served_mount, sh, wait_for

pytestmark = [needs_fuse, pytest.mark.mount]


@pytest.fixture(scope="module")
def mnt(tmp_path_factory):
    """One mount for the module (a mount costs ~2 s): the tests only look at
    the PIDs they spawn themselves. Overrides conftest's per-test `mnt`."""
    with served_mount(tmp_path_factory.mktemp("proc")) as m:
        yield m

WAIT_RE = re.compile(r"^exited\((-?\d+)\) steps=(\d+) tokens=(\d+) elapsed=(\d+\.\d)s\n$")
TRACE_RE = re.compile(r"^\[\s*(\d+\.\d{3})s\] ([A-Z][A-Za-z]*)\((.*)\) = (.*?)(?:    (\d+)ms)?$")
# A step that streams for a few seconds: long enough to act on it mid-flight,
# short enough to let it finish on its own.
SLOW = "[[chunk-delay:0.15]] [[tokens:14]]"
# A step that never ends by itself within a test (no step timeout).
HANG = json.dumps({"intent": "[[delay:60]] hang", "step_timeout": 0})


def run(m: Mount, script: str, timeout: float = 60) -> "sh":
    """bash with $M set to the mount point."""
    return sh(script, env={**os.environ, "M": str(m.path)}, timeout=timeout)


def ok(m: Mount, script: str, timeout: float = 60) -> str:
    res = run(m, script, timeout)
    assert res.returncode == 0, f"{script!r} failed ({res.returncode}): {res.stderr}"
    return res.stdout


def ls_proc(m: Mount) -> list[str]:
    return ok(m, 'ls "$M/proc"').split()


def wait_line(m: Mount, pid: int) -> tuple[int, int, int]:
    line = m.wait(pid)
    match = WAIT_RE.match(line)
    assert match, f"bad wait line {line!r}"
    return int(match[1]), int(match[2]), int(match[3])


def trace_lines(m: Mount, pid: int) -> list[str]:
    return ok(m, f'cat "$M/proc/{pid}/trace"').splitlines()


def syscalls(m: Mount, pid: int) -> list[str]:
    names = []
    for line in trace_lines(m, pid):
        match = TRACE_RE.match(line)
        assert match, f"trace line not in strace format: {line!r}"
        names.append(match[2])
    return names


def fd_listing(m: Mount, pid: int) -> dict[str, str]:
    """fd/ as `ls` and `readlink` see it: {"3": "/dev/llm/scripted"}."""
    out = ok(m, f'shopt -s nullglob; cd "$M/proc/{pid}/fd" && '
                'for f in *; do [ -L "$f" ] && echo "$f $(readlink "$f")"; done; true')
    return dict(line.split(" ", 1) for line in out.splitlines())


def ctl(m: Mount, pid: int, command: str) -> "sh":
    return run(m, f'echo {command} > "$M/proc/{pid}/ctl"')


# --------------------------------------------------------------------- spawning

def test_echo_spawns_one_process_listed_by_ls(mnt):
    before = ls_proc(mnt)
    assert "new" in before
    out = ok(mnt, 'echo "What is the capital of France?" > "$M/proc/new" && ls "$M/proc"')
    names = out.split()
    assert "new" in names
    pids = [int(n) for n in set(names) - set(before)]
    assert len(pids) == 1 and pids[0] >= 1
    pid = pids[0]
    code, steps, tokens = wait_line(mnt, pid)
    assert (code, steps) == (0, 1) and tokens > 0
    assert ok(mnt, f'cat "$M/proc/{pid}/result"') == "echo: What is the capital of France?\n"
    assert ok(mnt, f'cat "$M/proc/{pid}/intent"') == "What is the capital of France?\n"
    # ls -l shows a directory per process, and the expected files inside it.
    assert ok(mnt, f'stat -c %F "$M/proc/{pid}"').strip() == "directory"
    assert sorted(ok(mnt, f'ls "$M/proc/{pid}"').split()) == sorted(
        ["status", "intent", "context", "trace", "events", "ctl", "result", "wait", "fd", "plan"])
    assert mnt.daemon_alive()


def test_exec_fd_reads_back_pids_and_errors_in_order(mnt):
    out = ok(mnt, '''
        exec 3<>"$M/proc/new"
        echo "first" >&3
        echo "second" >&3
        echo '{"agent": "nope", "intent": "x"}' >&3 2>/dev/null
        cat >&3 <<'EOF'
intent: third
max_steps: 3
EOF
        cat <&3
    ''')
    lines = out.splitlines()
    assert len(lines) == 4, out
    assert lines[2] == 'error: agent "nope" not found'
    pids = [int(lines[i]) for i in (0, 1, 3)]
    assert pids == sorted(pids) and len(set(pids)) == 3
    listed = {int(n) for n in ls_proc(mnt) if n != "new"}
    assert set(pids) <= listed
    for pid, text in zip(pids, ("first", "second", "third")):
        assert ok(mnt, f'cat "$M/proc/{pid}/intent"') == text + "\n"
    assert mnt.status(pids[2])["budget"]["max_steps"] == 3


def test_read_pid_with_shell_read_builtin(mnt):
    out = ok(mnt, 'exec 3<>"$M/proc/new"; echo "one" >&3; read -r a <&3; echo "two" >&3; read -r b <&3; '
                  'echo "$a $b"')
    a, b = map(int, out.split())
    assert b > a
    assert ok(mnt, f'cat "$M/proc/{a}/intent"; cat "$M/proc/{b}/intent"') == "one\ntwo\n"


# ------------------------------------------------------------------- status JSON

STATUS_FIELDS = ("pid", "uuid", "ppid", "state", "paused", "intent", "agent", "skills", "provider",
                 "model", "allowed_tools", "steps", "tokens", "cost", "created", "started", "exited",
                 "exit_code", "error", "children", "fds")


def test_status_has_every_field_of_design_section_3(mnt):
    pid = mnt.spawn(HANG)
    wait_for(lambda: mnt.status(pid)["state"] == "running", 30, what="running")
    live = json.loads(ok(mnt, f'cat "$M/proc/{pid}/status"'))
    missing = [f for f in STATUS_FIELDS if f not in live]
    assert not missing, f"status lacks {missing}"
    assert live["pid"] == pid and live["ppid"] == 0
    assert uuid.UUID(live["uuid"]).version == 7
    assert live["state"] == "running" and live["paused"] is False
    assert live["intent"] == "[[delay:60]] hang"
    assert live["agent"] == "default" and live["provider"] == "scripted"
    assert live["model"] == "scripted-model"
    assert live["skills"] == [] and live["allowed_tools"] == [] and live["children"] == []
    assert set(live["tokens"]) == {"in", "out"}
    assert live["exited"] is None and live["exit_code"] is None and live["error"] is None
    assert isinstance(live["created"], float) and live["started"] >= live["created"]
    assert live["fds"] == {"3": "/dev/llm/scripted"}
    # the same file through jq, as a shell user would read it
    assert ok(mnt, f'jq -r .state "$M/proc/{pid}/status"').strip() == "running"

    done = mnt.spawn("hello status")
    code, steps, tokens = wait_line(mnt, done)
    st = mnt.status(done)
    assert st["state"] == "zombie" and st["exit_code"] == 0 and st["error"] is None
    assert st["steps"] == steps == 1
    assert st["tokens"]["in"] > 0 and st["tokens"]["out"] == 3  # "echo: hello status"
    assert st["tokens"]["in"] + st["tokens"]["out"] == tokens
    assert st["created"] <= st["started"] <= st["exited"]
    assert st["fds"] == {} and st["cost"] == 0
    assert uuid.UUID(st["uuid"]).version == 7 and st["uuid"] != live["uuid"]


def test_intent_result_wait_trace_events(mnt):
    pid = mnt.spawn("tell me about trace")
    code, steps, tokens = wait_line(mnt, pid)
    assert (code, steps) == (0, 1)
    assert ok(mnt, f'cat "$M/proc/{pid}/result"') == "echo: tell me about trace\n"
    # wait does not reap and can be read again
    assert wait_line(mnt, pid) == (code, steps, tokens)
    assert str(pid) in ls_proc(mnt)

    names = syscalls(mnt, pid)
    assert names == ["Spawn", "Open", "Write", "Read", "Close", "Exit"]
    lines = trace_lines(mnt, pid)
    assert lines[0].startswith("[  0.000s] Spawn(\"tell me about trace\"")
    assert lines[0].endswith(f"= PID({pid})    0ms")
    assert '"/dev/llm/scripted", O_RDWR) = FD(3)' in lines[1]
    assert lines[-1].startswith("[") and "Exit(0) = ?" in lines[-1]

    raw = ok(mnt, f'cat "$M/proc/{pid}/events"')
    events = [json.loads(line) for line in raw.splitlines()]
    assert [e["syscall"] for e in events] == names
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    for e in events:
        assert e["pid"] == pid
        assert {"ts", "t", "args", "result", "dur_ms", "error"} <= set(e)
        assert e["error"] is None
    assert all(e["dur_ms"] is not None for e in events if e["syscall"] in ("Open", "Write", "Read", "Close"))
    if shutil.which("jq"):
        assert ok(mnt, f'jq -r .syscall "$M/proc/{pid}/events"').split() == names
        assert ok(mnt, f'jq -s length "$M/proc/{pid}/events"').strip() == str(len(events))


def test_fd_names_the_device_while_a_step_runs_and_is_empty_after(mnt):
    pid = mnt.spawn(SLOW)
    assert wait_for(lambda: fd_listing(mnt, pid), 30, what="fd 3") == {"3": "/dev/llm/scripted"}
    ls_l = ok(mnt, f'ls -l "$M/proc/{pid}/fd"')
    assert "3 -> /dev/llm/scripted" in ls_l
    assert ok(mnt, f'stat -c %F "$M/proc/{pid}/fd/3"').strip() == "symbolic link"
    assert mnt.status(pid)["state"] == "running"
    code, steps, _ = wait_line(mnt, pid)
    assert (code, steps) == (0, 1)
    assert fd_listing(mnt, pid) == {}
    assert ok(mnt, f'ls -A "$M/proc/{pid}/fd"') == ""
    assert mnt.status(pid)["fds"] == {}


def test_steering_by_appending_to_context(mnt):
    pid = mnt.spawn(SLOW)
    wait_for(lambda: fd_listing(mnt, pid), 30, what="the step to start")
    ok(mnt, f'echo "steer to the left" >> "$M/proc/{pid}/context"')
    ctx = [json.loads(line) for line in ok(mnt, f'cat "$M/proc/{pid}/context"').splitlines()]
    assert ctx[0]["role"] == "system"
    assert ctx[1] == {"role": "user", "content": SLOW}
    assert ctx[-1]["content"] == "steer to the left" and ctx[-1]["role"] == "user"
    code, steps, _ = wait_line(mnt, pid)
    assert (code, steps) == (0, 2)
    assert ok(mnt, f'cat "$M/proc/{pid}/result"') == "echo: steer to the left\n"
    ctx = [json.loads(line) for line in ok(mnt, f'cat "$M/proc/{pid}/context"').splitlines()]
    assert [c["role"] for c in ctx] == ["system", "user", "assistant", "user", "assistant"]
    assert ctx[3] == {"role": "user", "content": "steer to the left"}
    assert ctx[4] == {"role": "assistant", "content": "echo: steer to the left"}
    assert "Steer" in syscalls(mnt, pid)
    assert any('Steer("steer to the left")' in line for line in trace_lines(mnt, pid))


# --------------------------------------------------------------------------- ctl

def test_ctl_reads_its_commands(mnt):
    pid = mnt.spawn("x")
    assert ok(mnt, f'cat "$M/proc/{pid}/ctl"').split() == ["term", "kill", "killtree", "pause", "resume", "reap"]


def test_ctl_kill_exits_137(mnt):
    pid = mnt.spawn(HANG)
    wait_for(lambda: fd_listing(mnt, pid), 30, what="the step to start")
    res = ctl(mnt, pid, "kill")
    assert res.returncode == 0, res.stderr
    code, steps, tokens = wait_line(mnt, pid)
    assert code == 137 and steps == 1 and tokens == 0
    st = mnt.status(pid)
    assert st["state"] == "zombie" and st["exit_code"] == 137
    assert st["error"]["code"] == "INTERRUPTED"
    names = syscalls(mnt, pid)
    assert "Signal" in names and names[-1] == "Exit"
    assert any("Signal(kill)" in line for line in trace_lines(mnt, pid))
    assert fd_listing(mnt, pid) == {}


def test_ctl_term_finishes_the_step_then_exits_143(mnt):
    pid = mnt.spawn(SLOW)
    wait_for(lambda: fd_listing(mnt, pid), 30, what="the step to start")
    assert ctl(mnt, pid, "term").returncode == 0
    assert mnt.status(pid)["state"] == "running"  # graceful: the step goes on
    code, steps, tokens = wait_line(mnt, pid)
    assert (code, steps) == (143, 1) and tokens > 0
    # the step was finished, so its answer is the result
    assert ok(mnt, f'cat "$M/proc/{pid}/result"').split() == ("alpha bravo charlie delta echo foxtrot golf "
                                                             "hotel india juliet kilo lima mike november").split()
    assert any("Signal(term)" in line for line in trace_lines(mnt, pid))


def test_ctl_pause_holds_at_the_step_boundary_until_resume(mnt):
    pid = mnt.spawn(SLOW)
    wait_for(lambda: fd_listing(mnt, pid), 30, what="the step to start")
    assert ctl(mnt, pid, "pause").returncode == 0
    assert mnt.status(pid)["paused"] is True
    # give it a next step, so the pause has a boundary to hold at
    ok(mnt, f'echo "after the pause" >> "$M/proc/{pid}/context"')
    wait_for(lambda: "Pause" in syscalls(mnt, pid), 30, what="the Pause line")
    st = mnt.status(pid)
    assert st["state"] == "running" and st["paused"] is True and st["steps"] == 1
    assert "Write" in syscalls(mnt, pid) and syscalls(mnt, pid).count("Write") == 1
    assert ctl(mnt, pid, "resume").returncode == 0
    code, steps, _ = wait_line(mnt, pid)
    assert (code, steps) == (0, 2)
    assert ok(mnt, f'cat "$M/proc/{pid}/result"') == "echo: after the pause\n"
    names = syscalls(mnt, pid)
    assert names.index("Pause") < names.index("Resume") < names.index("Steer")
    assert mnt.status(pid)["paused"] is False


@pytest.mark.expect_log('stamina.retry_scheduled')
def test_term_while_paused_exits_143(mnt):
    pid = mnt.spawn(SLOW)
    wait_for(lambda: fd_listing(mnt, pid), 30, what="the step to start")
    assert ctl(mnt, pid, "pause").returncode == 0
    ok(mnt, f'echo "more" >> "$M/proc/{pid}/context"')
    wait_for(lambda: "Pause" in syscalls(mnt, pid), 30, what="the Pause line")
    assert ctl(mnt, pid, "term").returncode == 0
    code, steps, _ = wait_line(mnt, pid)
    assert (code, steps) == (143, 1)


def test_ctl_on_exited_and_reaped_process(mnt):
    pid = mnt.spawn(HANG)
    wait_for(lambda: fd_listing(mnt, pid), 30, what="the step to start")
    res = ctl(mnt, pid, "reap")
    assert res.returncode != 0 and "Device or resource busy" in res.stderr  # EBUSY
    assert str(pid) in ls_proc(mnt)
    assert ctl(mnt, pid, "kill").returncode == 0
    assert wait_line(mnt, pid)[0] == 137
    for command in ("term", "kill", "pause", "resume"):
        res = ctl(mnt, pid, command)
        assert res.returncode != 0 and "No such process" in res.stderr, (command, res.stderr)  # ESRCH
    assert ok(mnt, f'cat "$M/proc/{pid}/result"') == ""
    assert ctl(mnt, pid, "reap").returncode == 0
    assert str(pid) not in ls_proc(mnt)
    res = run(mnt, f'ls "$M/proc/{pid}"')
    assert res.returncode != 0 and "No such file or directory" in res.stderr
    res = ctl(mnt, pid, "kill")
    assert res.returncode != 0 and "No such file or directory" in res.stderr  # ENOENT
    assert mnt.daemon_alive()


def test_reap_removes_the_directory_and_keeps_the_others(mnt):
    a, b = mnt.spawn("a"), mnt.spawn("b")
    wait_line(mnt, a), wait_line(mnt, b)
    assert ctl(mnt, a, "reap").returncode == 0
    assert wait_for(lambda: str(a) not in ls_proc(mnt), 10, what="reaped pid to leave ls")
    assert str(b) in ls_proc(mnt)
    assert ok(mnt, f'cat "$M/proc/{b}/result"') == "echo: b\n"
    assert run(mnt, f'cat "$M/proc/{a}/status"').returncode != 0


def test_linger_reaps_zombies_on_its_own(mount_factory, scripted_server):
    m = mount_factory(scripted_providers(scripted_server.url), "--linger", "0.2")
    pid = m.spawn("[[delay:1]] short-lived")
    code, steps, _ = wait_line(m, pid)  # the zombie is there when it exits ...
    assert (code, steps) == (0, 1)
    # ... then the directory goes away without anyone reaping it
    wait_for(lambda: str(pid) not in ls_proc(m), 30, what="zombie to be reaped by linger")
    assert ls_proc(m) == ["new"]
    res = run(m, f'cat "$M/proc/{pid}/wait"')
    assert res.returncode != 0 and "No such file or directory" in res.stderr
    assert m.daemon_alive()


# ----------------------------------------------------------------------- budgets

def _budget_run(m: Mount, request: dict) -> tuple[int, dict]:
    pid = m.spawn(json.dumps(request))
    code = wait_line(m, pid)[0]
    return code, m.status(pid)


def test_budget_max_tokens_exits_11(mnt):
    code, st = _budget_run(mnt, {"intent": "[[tokens:50]]", "max_tokens": 30})
    assert code == 11 and st["exit_code"] == 11
    assert "max_tokens exceeded" in st["error"]["cause"]
    assert st["budget"]["max_tokens"] == 30
    assert st["tokens"]["in"] + st["tokens"]["out"] > 30
    assert any("Exit(11)" in line for line in trace_lines(mnt, st["pid"]))


def test_budget_step_timeout_exits_124(mnt):
    code, st = _budget_run(mnt, {"intent": "[[delay:20]] slow", "step_timeout": "0.5s"})
    assert code == 124
    assert st["error"]["code"] == "TIMEOUT"
    assert "step_timeout" in st["error"]["cause"]
    assert st["budget"]["step_timeout"] == 0.5
    lines = trace_lines(mnt, st["pid"])
    assert any(line.split("] ", 1)[1].startswith("Read(") and "[TIMEOUT]" in line for line in lines)


def test_budget_max_steps_exits_10(mnt):
    pid = mnt.spawn(json.dumps({"intent": SLOW, "max_steps": 1}))
    wait_for(lambda: fd_listing(mnt, pid), 30, what="the step to start")
    ok(mnt, f'echo "one more step please" >> "$M/proc/{pid}/context"')
    code, steps, _ = wait_line(mnt, pid)
    assert (code, steps) == (10, 1)
    st = mnt.status(pid)
    assert "max_steps exceeded" in st["error"]["cause"]


@pytest.mark.expect_log('stamina.retry_scheduled')
def test_budget_max_cost_exits_12(mount_factory, scripted_server):
    prices = "{scripted-model: {input: 1000000, output: 1000000}}"  # $1 per token
    m = mount_factory(scripted_providers(scripted_server.url, prices=prices))
    code, st = _budget_run(m, {"intent": "[[tokens:5]]", "max_cost": 0.5})
    assert st["cost"] > 0.5
    assert code == 12 and "max_cost exceeded" in st["error"]["cause"]


def test_budget_errors_are_readable_text_in_status(mnt):
    """status.error is structured (code/syscall/cause) and says what happened."""
    _, st = _budget_run(mnt, {"intent": "[[tokens:40]]", "max_tokens": 10})
    err = st["error"]
    assert set(err) >= {"code", "syscall", "pid", "device", "cause"}
    assert err["pid"] == st["pid"]
    assert re.search(r"max_tokens exceeded: \d+ tokens used, limit 10", err["cause"])


@pytest.mark.expect_log('stamina.retry_scheduled')
def test_after_a_crash_rebuilt_records_are_not_paused_and_hold_no_fds(mount_factory, scripted_server):
    import signal

    from tests.mountutil import cleanup, rnixfs

    yaml = scripted_providers(scripted_server.url)
    m1 = mount_factory(yaml)
    pid = m1.spawn(HANG)
    wait_for(lambda: m1.status(pid)["fds"], 30, what="the step to start")
    ok(m1, f'echo pause > "$M/proc/{pid}/ctl"')
    stored = lambda: json.loads(rnixfs("show", str(pid), "--json", "--state-dir", str(m1.state_dir)).stdout)  # noqa: E731
    wait_for(lambda: stored()["paused"] is True and stored()["fds"], 30, what="the paused record in the store")
    os.kill(m1.daemon_pid, signal.SIGKILL)
    cleanup(m1)
    m2 = mount_factory(yaml, name="mnt2")  # same state directory: rebuilds what m1 left
    assert m2.daemon_pid != m1.daemon_pid
    rebuilt = stored()
    assert rebuilt["state"] == "dead" and rebuilt["exit_code"] == 137
    assert rebuilt["paused"] is False and rebuilt["fds"] == {}
    assert "the daemon stopped before the process exited" in rebuilt["error"]["cause"]
