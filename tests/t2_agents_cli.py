"""`rnixfs agent list|show` through the real CLI, including hostile input."""
from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.t2_skills_cli import Sandbox, fails, ok


@pytest.fixture
def sb(tmp_path):
    return Sandbox(tmp_path)


def agent(base, name, yaml_text, instructions="Be helpful.\n"):
    d = base / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "agent.yaml").write_text(yaml_text)
    if instructions is not None:
        (d / "instructions.md").write_text(instructions)
    return d


def bases(sb):
    return sb.project / ".rnix" / "agents", sb.cfg / "agents"


def test_list_and_show(sb):
    pbase, ubase = bases(sb)
    agent(ubase, "helper", "name: helper\ndescription: user helper\n")
    agent(pbase, "helper", "name: helper\ndescription: project helper\nmodels: {provider: local, preferred: tiny}\n"
                           "skills: [a, b]\nstep_timeout: 10m\nplanning: false\nmax_bogus: 1\n", "Help well.\n")
    agent(ubase, "broken", "name: [\n")
    res = ok(sb.run("agent", "list"))
    lines = res.stdout.splitlines()
    assert lines[0] == "[agent] NAME                 SCOPE     SOURCE    DESCRIPTION"
    assert lines[1].startswith("[agent] broken               user                (invalid: agent \"broken\"")
    assert lines[2] == "[agent] helper               project             project helper"
    assert f'shadowed agent "helper": winner={pbase / "helper"} (project); shadowed={ubase / "helper"}' in res.stderr
    assert ok(sb.run("agent", "list", "-q")).stdout == "helper\n"
    data = json.loads(ok(sb.run("agent", "list", "--json")).stdout)["data"]["agents"]
    assert [a["name"] for a in data] == ["broken", "helper"] and data[1]["shadowed"] == [str(ubase / "helper")]
    out = ok(sb.run("agent", "show", "helper")).stdout.splitlines()
    assert out[:2] == ["name: helper", "description: project helper"]
    assert "models: provider=local, preferred=tiny" in out and "skills: a b" in out
    assert "planning: false" in out and "step_timeout: 10m" in out and "project_doc: true" in out
    assert "warning: unknown key 'max_bogus' ignored" in out
    assert out[-2:] == ["---", "Help well."]
    data = json.loads(ok(sb.run("agent", "show", "helper", "--json")).stdout)["data"]
    assert data["step_timeout_s"] == 600.0 and data["instructions"] == "Help well.\n" and data["planning"] is False
    # fields rnixfs reads but does not act on are never silent
    agent(pbase, "quiet", "name: quiet\nsla: {latency: 1s}\nalternatives: [helper]\n")
    out = ok(sb.run("agent", "show", "quiet")).stdout.splitlines()
    assert "warning: sla is set but rnixfs does not act on it: it has no effect" in out
    assert "warning: alternatives is set but rnixfs does not act on it: it has no effect" in out


def test_empty(sb):
    assert ok(sb.run("agent", "list")).stdout.splitlines()[-1] == "[agent] No agents found."
    assert json.loads(ok(sb.run("agent", "list", "--json")).stdout) == {"ok": True, "data": {"agents": []}}


@pytest.mark.parametrize("name", ["../x", "..", "/etc/passwd", "a/b", ".hidden", "x" * 80, "a..b"])
def test_show_bad_names(sb, name):
    res = fails(sb.run("agent", "show", "--", name), "invalid agent name")
    assert res.stderr.count("\n") == 1


def test_show_errors(sb):
    pbase, ubase = bases(sb)
    fails(sb.run("agent", "show", "ghost"), 'agent "ghost" not found')
    res = fails(sb.run("agent", "show", "ghost", "--json"))
    assert json.loads(res.stdout)["error"]["code"] == "NOT_FOUND"
    agent(ubase, "bad", "name: bad\nmax_steps: lots\n")
    fails(sb.run("agent", "show", "bad"), "max_steps must be a non-negative whole number")
    agent(ubase, "noinstr", "name: noinstr\n", instructions=None)
    fails(sb.run("agent", "show", "noinstr"), "missing instructions.md")
    d = agent(ubase, "huge", "name: huge\n")
    with open(d / "instructions.md", "wb") as f:
        f.truncate(4 << 20)
    fails(sb.run("agent", "show", "huge"), "the cap is")
    d = agent(ubase, "fifo", "name: fifo\n", instructions=None)
    os.mkfifo(d / "instructions.md")
    fails(sb.run("agent", "show", "fifo", timeout=20), "not a regular file")
    d = agent(ubase, "bomb", "a: &a [x, x, x, x]\nb: &b [*a, *a, *a, *a]\nname: bomb\n")
    fails(sb.run("agent", "show", "bomb"), "aliases (*name) are not allowed")


def test_symlink_out_of_the_project(sb):
    pbase, _ = bases(sb)
    outside = agent(sb.tmp / "elsewhere", "evil", "name: evil\n")
    pbase.mkdir(parents=True)
    os.symlink(outside, pbase / "evil")
    fails(sb.run("agent", "show", "evil"), "leaves the project")
    assert "(invalid:" in ok(sb.run("agent", "list")).stdout


def test_builtin_code_analyst(tmp_path):
    sb = Sandbox(tmp_path, builtins=True)
    lines = ok(sb.run("agent", "list")).stdout.splitlines()
    assert lines[1].startswith("[agent] code-analyst         user      builtin   Reviews code quality")
    out = ok(sb.run("agent", "show", "code-analyst")).stdout.splitlines()
    assert "skills: code-analysis" in out and "step_timeout: 5m" in out and "source: builtin" in out


def test_concurrent_list_while_editing(sb):
    _, ubase = bases(sb)

    def edit(i):
        agent(ubase, f"a{i % 3}", f"name: a{i % 3}\ndescription: v{i}\n")
        return None

    with ThreadPoolExecutor(6) as pool:
        lists = [pool.submit(sb.run, "agent", "list", "--json") for _ in range(6)]
        edits = [pool.submit(edit, i) for i in range(60)]
        results = [f.result() for f in lists]
        [f.result() for f in edits]
    for r in results:
        assert r.returncode == 0 and "Traceback" not in r.stderr
        json.loads(r.stdout)


def test_show_while_the_manifest_is_rewritten(sb):
    _, ubase = bases(sb)
    d = agent(ubase, "flux", "name: flux\n")
    texts = ["name: flux\n", "name: [\n", "", "name: flux\nmax_steps: 3\n"]

    def rewrite(i):
        tmp = d / f".tmp{i}"
        tmp.write_text(texts[i % len(texts)])
        os.replace(tmp, d / "agent.yaml")

    with ThreadPoolExecutor(6) as pool:
        runs = [pool.submit(sb.run, "agent", "show", "flux") for _ in range(6)]
        writes = [pool.submit(rewrite, i) for i in range(200)]
        results = [f.result() for f in runs]
        [f.result() for f in writes]
    for r in results:
        assert r.returncode in (0, 1) and "Traceback" not in r.stderr
        assert r.returncode == 0 or r.stderr.count("\n") == 1


def test_hostile_agent_text_is_escaped_for_humans(sb):
    from tests.t2_skills_cli import HOSTILE, assert_terminal_safe, raw, yaml_quoted

    pbase, ubase = bases(sb)
    agent(pbase, "evil", f"name: evil\ndescription: {yaml_quoted(HOSTILE)}\n"
                         f"skills: [{yaml_quoted('s' + HOSTILE)}]\n",
          instructions=f"Step one.\x1b[2J\n\tindented\x9b\r\n")
    agent(ubase, "broken", f"name: broken\nmax_steps: {yaml_quoted(HOSTILE)}\n")
    long = "l" * 70
    agent(ubase, long, f"name: {long}\ndescription: long one\n")
    res = raw(sb, "agent", "list")
    out = assert_terminal_safe(res.stdout)
    assert_terminal_safe(res.stderr)
    lines = out.splitlines()
    assert len(lines) == 4, out                                # header + three rows
    starts = {ln.index(ln.split()[2]) for ln in lines[1:] if "invalid" not in ln}   # SCOPE column
    assert len(starts) == 1 and lines[0].index("SCOPE") in starts
    assert "\\x1b[2J\\x1b]0;pwn\\a cleared FAKE ROW" in out
    res = raw(sb, "agent", "show", "evil")
    out = assert_terminal_safe(res.stdout)
    assert "skills: s\\x1b[2J" in out and out.endswith("---\nStep one.\\x1b[2J\n\tindented\\x9b\\r\n")
    res = raw(sb, "agent", "show", "broken")
    assert res.returncode == 1
    assert_terminal_safe(res.stderr)
    data = json.loads(raw(sb, "agent", "show", "evil", "--json").stdout)["data"]
    assert data["description"] == HOSTILE and data["skills"] == ["s" + HOSTILE]
    assert data["instructions"] == "Step one.\x1b[2J\n\tindented\x9b\r\n"
