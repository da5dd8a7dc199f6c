"""Tier 3: agents doing real work on a real mount:
tools through the devices, denials, kill leaving no process behind, an
agent's Bash spawning through the mount, dev/fs and dev/shell for users."""
from __future__ import annotations

import json
import os
import subprocess
import uuid

import psutil
import pytest

from tests.mountutil import needs_fuse, scripted_providers, sh, wait_for

# hostile or untrusted project content: the daemon warns, as it should
pytestmark = [needs_fuse, pytest.mark.mount, pytest.mark.expect_log('untrusted project')]


def call(name, args, cid):
    return {"id": cid, "function": {"name": name, "arguments": json.dumps(args)}}


def run(m, script, **kw):
    return sh(script, env={**os.environ, "M": str(m.path)}, **kw)


def test_agent_reads_greps_edits_and_runs_a_test(mnt, scripted_server):
    (mnt.project / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (mnt.project / "test_calc.sh").write_text("python3 -c 'import calc; assert calc.add(2, 2) == 4' && echo PASS\n")
    mark = "FIX-THE-BUG"
    for i, (name, args) in enumerate([
        ("Read", {"path": "calc.py"}),
        ("Grep", {"pattern": "return a", "glob": "*.py"}),
        ("Edit", {"path": "calc.py", "old_string": "a - b", "new_string": "a + b"}),
        ("Bash", {"command": "bash test_calc.sh"}),
        ("Glob", {"pattern": "*.py"}),
        ("Write", {"path": "NOTES.md", "content": "add() fixed\n"}),
    ]):
        scripted_server.enqueue({"match": mark, "tool_calls": [call(name, args, f"c{i}")]})
    scripted_server.enqueue({"match": mark, "content": "fixed: add now adds"})
    pid = mnt.spawn(mark)
    assert mnt.wait(pid).startswith("exited(0) steps=7")
    assert (mnt.project / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
    tools = [json.loads(line) for line in open(mnt.p(f"proc/{pid}/context")) if '"tool"' in line]
    results = [m["content"] for m in tools if m["role"] == "tool"]
    assert results[0] == "def add(a, b):\n    return a - b\n"
    assert results[1] == "calc.py:2:     return a - b"
    assert results[2].startswith("edited calc.py")
    assert results[3] == "PASS\n[exit 0]"
    assert results[4] == "calc.py"
    assert results[5] == "wrote 12 bytes to NOTES.md"
    assert (mnt.project / "NOTES.md").read_text() == "add() fixed\n"
    trace = open(mnt.p(f"proc/{pid}/trace")).read()
    for line in ('Open("/dev/fs/calc.py", O_RDONLY) = FD(4)', "Read(FD(4)) = 32 bytes",
                 'Open("/dev/fs/calc.py", O_RDWR) = FD(4)', "Write(FD(4), 32 bytes) = 32",
                 "Close(FD(4)) = 0", 'Grep("return a", "*.py") = 1 matches',
                 'Open("/dev/shell", O_RDWR) = FD(4)', "exit=0", 'Glob("*.py") = 1 matches',
                 'Open("/dev/fs/NOTES.md", O_WRONLY|O_CREAT|O_TRUNC) = FD(4)', "Write(FD(4), 12 bytes) = 12"):
        assert line in trace, line


def test_edit_fails_clearly_on_zero_or_many_matches(mnt, scripted_server):
    (mnt.project / "f.txt").write_text("x x\n")
    mark = "EDIT-MARK"
    scripted_server.enqueue({"match": mark, "tool_calls": [
        call("Edit", {"path": "f.txt", "old_string": "x", "new_string": "y"}, "a"),
        call("Edit", {"path": "f.txt", "old_string": "zzz", "new_string": "y"}, "b"),
        call("Read", {"path": "../outside"}, "c"),
        call("Write", {"path": "/etc/rnixfs-test", "content": "no"}, "d")]})
    scripted_server.enqueue({"match": mark, "content": "ok"})
    pid = mnt.spawn(mark)
    assert mnt.wait(pid).startswith("exited(0)")
    results = [json.loads(l)["content"] for l in open(mnt.p(f"proc/{pid}/context")) if '"role": "tool"' in l]
    assert "occurs 2 times" in results[0] and "occurs 0 times" in results[1]
    assert results[2].startswith("error:") and results[3].startswith("error:")
    assert (mnt.project / "f.txt").read_text() == "x x\n" and not os.path.exists("/etc/rnixfs-test")
    assert "-1 [PERMISSION]" in open(mnt.p(f"proc/{pid}/trace")).read()


def test_skill_without_bash_cannot_run_a_command_by_any_tool(mnt, scripted_server):
    skill = mnt.project / ".rnix/skills/reader"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text("---\nname: reader\ndescription: reads\nallowed-tools: Read Grep\n---\nRead only.\n")
    marker = mnt.project / "pwned"
    mark = "NO-SHELL"
    scripted_server.enqueue({"match": mark, "tool_calls": [
        call(name, {"command": f"touch {marker}"}, f"t{i}")
        for i, name in enumerate(["Bash", "bash", "Shell", "Exec", "Run"])]
        + [call("Write", {"path": "pwned.sh", "content": "touch pwned"}, "w"),
           call("Spawn", {"intent": "run touch pwned"}, "s")]})
    scripted_server.enqueue({"match": mark, "content": "gave up"})
    pid = wait_for(lambda: _spawn(mnt, json.dumps({"intent": mark, "skills": ["reader"]})), 10, what="spawn")
    assert mnt.wait(pid).startswith("exited(0)")
    assert not marker.exists() and not (mnt.project / "pwned.sh").exists()
    st = mnt.status(pid)
    # Skill: a restricted process shown a skill catalog may activate skills (docs/skills.md)
    assert st["allowed_tools"] == ["Grep", "Read", "Skill"] and not st["children"]
    trace = open(mnt.p(f"proc/{pid}/trace")).read()
    assert trace.count("-1 [PERMISSION]") == 3 and trace.count("unknown tool") == 4


def _spawn(m, req):
    try:
        return m.spawn(req)
    except AssertionError:
        return None


def test_kill_leaves_no_process_behind(mnt, scripted_server):
    tag = f"rnixfs-kill-{uuid.uuid4().hex[:8]}"
    mark = "SLEEPER"
    scripted_server.enqueue({"match": mark, "tool_calls": [
        call("Bash", {"command": f"RNIXFS_TAG={tag} bash -c 'sleep 600 & setsid sleep 600 & sleep 600'",
                      "timeout": 900}, "b")]})
    pid = mnt.spawn(mark)

    def tagged():
        out = []
        for p in psutil.process_iter(["environ"]):
            try:
                if (p.info["environ"] or {}).get("RNIXFS_TAG") == tag:
                    out.append(p)
            except psutil.Error:
                pass
        return out

    wait_for(lambda: len(tagged()) >= 3, 30, what="the sleeps to start")
    assert run(mnt, f'echo kill > "$M/proc/{pid}/ctl"').returncode == 0
    assert mnt.wait(pid).startswith("exited(137)")
    wait_for(lambda: not tagged(), 15, what="every sleep to die")


def test_agent_bash_spawning_through_the_mount_becomes_the_parent(mnt, scripted_server):
    mark = "PARENT-BASH"
    scripted_server.enqueue({"match": mark, "tool_calls": [call("Bash", {
        "command": 'echo "child via mount" > "$RNIXFS_MOUNT/proc/new" && readlink "$RNIXFS_MOUNT/proc/self"'
                   ' && echo "pid=$RNIXFS_PID"'}, "b")]})
    scripted_server.enqueue({"match": mark, "content": "spawned"})
    pid = mnt.spawn(mark)
    assert mnt.wait(pid).startswith("exited(0)")
    result = [json.loads(l)["content"] for l in open(mnt.p(f"proc/{pid}/context")) if '"role": "tool"' in l][0]
    assert result == f"{pid}\npid={pid}\n[exit 0]"
    children = [int(p) for p in os.listdir(mnt.p("proc")) if p.isdigit() and int(p) > pid]
    child = next(c for c in children if mnt.status(c)["intent"] == "child via mount")
    assert f"ppid={pid})" in open(mnt.p(f"proc/{child}/trace")).readline()  # parent at spawn
    # a user's shell is nobody's child and has no proc/self
    assert run(mnt, 'echo "from a user" > "$M/proc/new"').returncode == 0
    assert run(mnt, 'readlink "$M/proc/self"').returncode != 0


def test_parent_child_link_while_the_parent_runs(mnt, scripted_server):
    mark = "LIVE-PARENT"
    scripted_server.enqueue({"match": mark, "tool_calls": [call("Bash", {
        "command": 'echo "[[delay:1]] kid" > "$RNIXFS_MOUNT/proc/new"; sleep 2'}, "b")]})
    scripted_server.enqueue({"match": mark, "content": "done"})
    pid = mnt.spawn(mark)
    child = wait_for(lambda: mnt.status(pid)["children"], 30, what="a child")[0]
    assert mnt.status(child)["ppid"] == pid
    assert mnt.wait(pid).startswith("exited(0)")
    wait_for(lambda: mnt.status(child)["ppid"] == 0, 10, what="reparenting to 0")


def test_dev_fs_and_dev_shell_for_users(mnt):
    (mnt.project / "hello.txt").write_text("hi\n")
    os.symlink("/etc/passwd", mnt.project / "escape")
    os.symlink("hello.txt", mnt.project / "inside")
    assert open(mnt.p("dev/fs/hello.txt")).read() == "hi\n"
    assert open(mnt.p("dev/fs/inside")).read() == "hi\n"
    # a link is shown with its text as stored; the caller's own kernel follows it
    assert "escape" in os.listdir(mnt.p("dev/fs"))
    assert os.readlink(mnt.p("dev/fs/escape")) == "/etc/passwd"
    res = run(mnt, 'echo new > "$M/dev/fs/made.txt" && mkdir "$M/dev/fs/d" && mv "$M/dev/fs/made.txt" "$M/dev/fs/d/"')
    assert res.returncode == 0, res.stderr
    assert (mnt.project / "d/made.txt").read_text() == "new\n"
    res = run(mnt, 'ln -s /etc "$M/dev/fs/etc-link"')  # stored as given (see docs/devices.md)
    assert res.returncode == 0 and os.readlink(mnt.project / "etc-link") == "/etc", res.stderr
    res = run(mnt, 'exec 3<>"$M/dev/shell"; echo "ls; exit 3" >&3; cat <&3; echo "pwd" >&3; cat <&3')
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert "hello.txt" in lines and "[exit 3]" in lines
    assert lines[-2:] == [str(mnt.project), "[exit 0]"]


@pytest.mark.parametrize("device,message", [("dev/shell", "sleep 60"),
                                            ("dev/llm/scripted", "[[delay:60]] slow")])
def test_ctrl_c_when_the_reader_is_not_the_opener(mnt, device, message):
    """`exec 3<>f` in bash, then `cat <&3`: the blocked reader is bash's child."""
    import time

    p = subprocess.Popen(["bash", "-c", f'exec 3<>"{mnt.p(device)}"; echo "{message}" >&3; cat <&3'])
    wait_for(lambda: any(c.name() == "cat" for c in psutil.Process(p.pid).children()), 10, what="cat")
    cat = next(c for c in psutil.Process(p.pid).children() if c.name() == "cat")
    time.sleep(0.3)  # let the read block
    t0 = time.monotonic()
    cat.send_signal(2)
    cat.wait(10)
    print(f"{device}: cat ended {1000 * (time.monotonic() - t0):.0f} ms after SIGINT")
    assert time.monotonic() - t0 < 2.0
    p.wait(10)
    assert mnt.daemon_alive()


@pytest.mark.model
def test_embedded_model_runs_the_tool_loop(mount_factory):
    """Shape only: the offline demo model, constrained by a JSON schema,
    drives the loop to an exit within its step budget."""
    import re

    m = mount_factory(None)  # no providers.yaml: the embedded model
    (m.project / "notes.txt").write_text("rnixfs demo\n")
    pid = m.spawn('{"intent": "List the files in the workspace, then answer.", "max_steps": 3}')
    line = m.wait(pid, timeout=300)
    assert re.match(r"exited\((0|10)\) steps=[1-3] tokens=[1-9]\d* ", line), line
    st = m.status(pid)
    assert st["provider"] == "local" and st["tokens"]["in"] > 0 and st["tokens"]["out"] > 0
    trace = open(m.p(f"proc/{pid}/trace")).read()
    assert 'Open("/dev/llm/local", O_RDWR) = FD(3)' in trace and "Read(FD(3)) = " in trace


def test_provider_keys_never_reach_agent_commands(mount_factory, scripted_server, monkeypatch):
    from tests.mountutil import scripted_providers

    monkeypatch.setenv("RNIXFS_TEST_KEY", "sk-do-not-leak-4242")
    m = mount_factory(scripted_providers(scripted_server.url, api_key="${RNIXFS_TEST_KEY}"))
    mark = "ENV-PROBE"
    scripted_server.enqueue({"match": mark, "tool_calls": [call("Bash", {"command": "env"}, "e")]})
    scripted_server.enqueue({"match": mark, "content": "done"})
    pid = m.spawn(mark)
    assert m.wait(pid).startswith("exited(0)")
    context = open(m.p(f"proc/{pid}/context")).read()
    assert "RNIXFS_PID=" in context and "sk-do-not-leak-4242" not in context
    res = run(m, 'exec 3<>"$M/dev/shell"; echo env >&3; cat <&3')
    assert "RNIXFS_MOUNT=" in res.stdout and "sk-do-not-leak-4242" not in res.stdout


def test_edit_refuses_a_file_too_large_to_rewrite(mnt, scripted_server):
    from rnixfs.kernel.tools import EDIT_CAP

    big = mnt.project / "big.txt"
    big.write_bytes(b"x" * EDIT_CAP + b"needle\n")
    mark = "BIG-EDIT"
    scripted_server.enqueue({"match": mark, "tool_calls": [
        call("Edit", {"path": "big.txt", "old_string": "x", "new_string": "y"}, "e")]})
    scripted_server.enqueue({"match": mark, "content": "ok"})
    pid = mnt.spawn(mark)
    assert mnt.wait(pid).startswith("exited(0)")
    assert big.stat().st_size == EDIT_CAP + 7 and big.read_bytes().endswith(b"needle\n")
    ctx = open(mnt.p(f"proc/{pid}/context")).read()
    assert "too large to edit" in ctx


@pytest.mark.expect_log('untrusted project')
def test_a_child_never_holds_a_tool_its_parent_lacks(mnt, scripted_server):
    skill = mnt.project / ".rnix/skills/spawner"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text("---\nname: spawner\ndescription: d\nallowed-tools: Read Spawn\n---\nx\n")
    marker = mnt.project / "escaped"
    mark = "SPAWN-ESCAPE"
    scripted_server.enqueue({"match": mark, "tool_calls": [call("Spawn", {"intent": "CHILD-RUNS-BASH"}, "s")]})
    # matches the child's own user message only (the parent's copy is inside tool-call JSON)
    scripted_server.enqueue({"match": '"content": "CHILD-RUNS-BASH"',
                             "tool_calls": [call("Bash", {"command": f"touch {marker}"}, "b")]})
    pid = wait_for(lambda: _spawn(mnt, json.dumps({"intent": mark, "skills": ["spawner"]})), 10, what="spawn")
    assert mnt.wait(pid).startswith("exited(0)")
    child = next(int(c) for c in os.listdir(mnt.p("proc")) if c.isdigit()
                 and mnt.status(int(c))["intent"] == "CHILD-RUNS-BASH")
    assert mnt.wait(child).startswith("exited(0)")
    assert mnt.status(child)["allowed_tools"] == ["Read", "Skill", "Spawn"] and not marker.exists()
    assert "-1 [PERMISSION]" in open(mnt.p(f"proc/{child}/trace")).read()


def make_agent(project, name, yaml_text, instructions="Work carefully.\n"):
    d = project / ".rnix" / "agents" / name
    d.mkdir(parents=True)
    (d / "agent.yaml").write_text(yaml_text)
    (d / "instructions.md").write_text(instructions)


def test_planning_agent_shows_its_plan_and_warns_about_what_has_no_effect(mnt, scripted_server):
    make_agent(mnt.project, "planner", "name: planner\nplanning: true\nsla: {latency: 2s}\n"
                                       "models: {reasoning_effort: high}\n")
    make_agent(mnt.project, "doer", "name: doer\nplanning: false\n")
    mark = "PLAN-MARK"
    scripted_server.enqueue({"match": mark, "content": "1. read the code\n2. answer"})
    scripted_server.enqueue({"match": mark, "content": "done"})
    pid = mnt.spawn(json.dumps({"agent": "planner", "intent": mark}))
    assert mnt.wait(pid).startswith("exited(0) steps=2")
    assert "plan" in os.listdir(mnt.p(f"proc/{pid}"))
    res = run(mnt, f'cat "$M/proc/{pid}/plan"')
    assert res.returncode == 0 and res.stdout == "1. read the code\n2. answer\n"
    trace = open(mnt.p(f"proc/{pid}/trace")).read()
    assert 'Plan("1. read the code\\n2. answer") = 26 bytes' in trace
    assert 'Warning("sla is set but rnixfs does not act on it: it has no effect") = 0' in trace
    plan_request, work_request = scripted_server.requests[-2:]
    assert "tools" not in plan_request and "tools" in work_request
    assert plan_request["reasoning_effort"] == work_request["reasoning_effort"] == "high"
    st = json.loads(open(mnt.p(f"proc/{pid}/status")).read())
    assert st["planning"] is True and st["reasoning_effort"] == "high"

    before = len(scripted_server.requests)
    other = mnt.spawn(json.dumps({"agent": "doer", "intent": "no plan please"}))
    assert mnt.wait(other).startswith("exited(0) steps=1")
    assert open(mnt.p(f"proc/{other}/plan")).read() == ""
    assert len(scripted_server.requests) == before + 1
    assert "Plan(" not in open(mnt.p(f"proc/{other}/trace")).read()


def test_an_endless_tool_loop_ends_with_a_budget_error_by_default(mnt, scripted_server):
    (mnt.project / "x.txt").write_text("x\n")
    mark = "GLOB-FOREVER"
    for i in range(60):  # the model never stops asking for Glob
        scripted_server.enqueue({"match": mark, "tool_calls": [call("Glob", {"pattern": "*.txt"}, f"g{i}")]})
    pid = mnt.spawn(mark)
    assert mnt.wait(pid).startswith("exited(10) steps=50 ")
    st = json.loads(open(mnt.p(f"proc/{pid}/status")).read())
    assert st["exit_code"] == 10 and st["budget"]["max_steps"] == 50
    assert st["error"]["cause"] == "max_steps exceeded: 50 steps done, limit 50"
    assert st["budget"]["context_budget"] == 100000 and st["budget"]["max_time"] == 3600


def test_limits_yaml_sets_the_defaults_and_caps_children(tmp_path, mount_factory, scripted_server):
    config = tmp_path / "config"
    config.mkdir()
    (config / "limits.yaml").write_text("max_steps: 3\nmax_children: 2\nmax_time: 10m\n")
    m = mount_factory(scripted_providers(scripted_server.url))
    (m.project / "x.txt").write_text("x\n")
    mark = "LIMITED-LOOP"
    for i in range(10):
        scripted_server.enqueue({"match": mark, "tool_calls": [call("Glob", {"pattern": "*"}, f"g{i}")]})
    pid = m.spawn(mark)
    assert m.wait(pid).startswith("exited(10) steps=3 ")
    assert m.status(pid)["budget"]["max_time"] == 600

    # an agent's Bash writing proc/new: the third child is refused with EAGAIN
    script = 'for i in 1 2 3; do echo "child $i" > "$RNIXFS_MOUNT/proc/new" || echo "refused $i"; done'
    scripted_server.enqueue({"match": "SPAWNER", "tool_calls": [call("Bash", {"command": script}, "b")]})
    scripted_server.enqueue({"match": "SPAWNER", "content": "done"})
    parent = m.spawn("SPAWNER")
    assert m.wait(parent).startswith("exited(0)")
    results = [json.loads(line)["content"] for line in open(m.p(f"proc/{parent}/context"))
               if '"role": "tool"' in line]
    assert "refused 3" in results[0] and "Resource temporarily unavailable" in results[0]
    assert "refused 1" not in results[0] and "refused 2" not in results[0]
    st = m.status(parent)
    assert st["tree"]["descendants"] == 2
    assert "max_children is 2" in m.log()


def test_a_bad_limits_yaml_refuses_the_mount(tmp_path, scripted_server):
    from tests.mountutil import rnixfs, write_providers

    config, mnt = tmp_path / "config", tmp_path / "mnt"
    mnt.mkdir()
    write_providers(config, scripted_providers(scripted_server.url))
    (config / "limits.yaml").write_text("max_step: 3\n")
    res = rnixfs("mount", str(mnt), "--project", str(tmp_path), "--state-dir", str(tmp_path / "state"),
                 "--config-dir", str(config), check=False)
    assert res.returncode != 0 and "unknown key 'max_step'" in res.stderr
    assert str(mnt) not in open("/proc/mounts").read()
