"""Progressive skill loading and grants on a real mount, driven by the
scripted server: the Skill tool, skill files read on demand (user scope
included), scoped Bash grants, an agent unable to rewrite its own limits,
and the capped catalog (docs/skills.md, "Progressive loading" and "Grants")."""
from __future__ import annotations

import json
import os

import pytest

from tests.mountutil import needs_fuse, scripted_providers, wait_for

# hostile or untrusted project content: the daemon warns, as it should
pytestmark = [needs_fuse, pytest.mark.mount, pytest.mark.expect_log('untrusted project')]


def call(name, args, cid):
    return {"id": cid, "function": {"name": name, "arguments": json.dumps(args)}}


def spawn(m, req: dict) -> int:
    def attempt():
        try:
            return m.spawn(json.dumps(req))
        except AssertionError:
            return None
    return wait_for(attempt, 10, what="spawn")


def context(m, pid) -> list[dict]:
    return [json.loads(line) for line in open(m.p(f"proc/{pid}/context")) if line.strip()]


def tool_results(m, pid) -> list[str]:
    return [msg["content"] for msg in context(m, pid) if msg["role"] == "tool"]


def trace(m, pid) -> str:
    return open(m.p(f"proc/{pid}/trace")).read()


def agent(m, name: str, yaml: str) -> None:
    d = m.project / ".rnix/agents" / name
    d.mkdir(parents=True)
    (d / "agent.yaml").write_text(yaml + "planning: false\n")  # the scripts have no plan step
    (d / "instructions.md").write_text(f"You are {name}.\n")


def user_skill(m, name: str, front: str = "", body: str = "Body.\n"):
    d = m.config_dir / "skills" / name
    d.mkdir(parents=True)
    (d / "SKILL.md").write_text(f"---\nname: {name}\ndescription: {name} helps\n{front}---\n{body}")
    return d


def test_user_scope_skill_activated_and_its_references_read(mnt, scripted_server, tmp_path):
    skill = user_skill(mnt, "pdf-tools", "allowed-tools: Bash(git:*)\n", "Use references/guide.md.\n")
    (skill / "references").mkdir()
    (skill / "references/guide.md").write_text("GUIDE-TEXT\n")
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET\n")
    (skill / "references/leak.md").symlink_to(secret)        # leaves the skill: refused
    agent(mnt, "reader", "name: reader\ndescription: r\nskills: []\n")
    base = str(skill)
    mark = "SKILL-ACTIVATE"
    scripted_server.enqueue({"match": mark, "tool_calls": [
        call("Skill", {"name": "pdf-tools"}, "a"),
        call("Read", {"path": f"{base}/references/guide.md"}, "b"),
        call("Glob", {"pattern": f"{base}/**/*.md"}, "c"),
        call("Grep", {"pattern": "GUIDE", "glob": f"{base}/**"}, "d"),
        call("Read", {"path": "/skills/pdf-tools/references/guide.md"}, "e"),
        call("Read", {"path": f"{base}/references/leak.md"}, "f"),
        call("Read", {"path": f"{base}/../../providers.yaml"}, "g"),
        call("Write", {"path": f"{base}/references/guide.md", "content": "pwned"}, "h"),
        call("Edit", {"path": f"{base}/SKILL.md", "old_string": "Use", "new_string": "x"}, "i"),
    ]})
    scripted_server.enqueue({"match": mark, "content": "read it"})
    pid = spawn(mnt, {"intent": mark, "agent": "reader"})
    assert mnt.wait(pid).startswith("exited(0)")
    r = tool_results(mnt, pid)
    assert r[0].startswith(f"Base directory for this skill: {base}\n")
    assert "references/guide.md" in r[0] and r[0].endswith("\n\nUse references/guide.md.")
    assert r[1] == "GUIDE-TEXT\n"
    assert f"{base}/references/guide.md" in r[2].splitlines()
    assert r[3] == f"{base}/references/guide.md:1: GUIDE-TEXT"
    assert r[4] == "GUIDE-TEXT\n"
    assert r[5].startswith("error:") and "SECRET" not in r[5]
    assert r[6].startswith("error:") and "scripted" not in r[6]
    assert r[7].startswith("error: permission denied: skill files are read-only")
    assert r[8].startswith("error: permission denied: skill files are read-only")
    assert (skill / "references/guide.md").read_text() == "GUIDE-TEXT\n"
    assert "Use references" in (skill / "SKILL.md").read_text()
    t = trace(mnt, pid)
    assert 'Skill("pdf-tools") = ' in t and 'Open("/skills/pdf-tools/references/guide.md", O_RDONLY) = FD(' in t
    assert t.count("-1 [PERMISSION]") >= 2
    events = [json.loads(line) for line in open(mnt.p(f"proc/{pid}/events"))]
    assert any(e.get("syscall") == "Skill" for e in events)
    st = mnt.status(pid)
    assert "pdf-tools" in st["skills"] and st["allowed_tools"] == []  # unrestricted stays so


@pytest.mark.expect_log('untrusted project')
def test_skill_grants_join_only_without_explicit_tools(mnt, scripted_server):
    user_skill(mnt, "gitty", "allowed-tools: Bash(git:*)\n")
    user_skill(mnt, "hidden", "disable-model-invocation: true\n")
    proj = mnt.project / ".rnix/skills/reader"
    proj.mkdir(parents=True)
    (proj / "SKILL.md").write_text("---\nname: reader\ndescription: r\nallowed-tools: Read\n---\nR\n")
    agent(mnt, "open", "name: open\ndescription: o\nskills: [reader]\n")
    agent(mnt, "strict", "name: strict\ndescription: s\ntools: [Read]\n")
    out = {}
    for name in ("open", "strict"):
        mark = f"JOIN-{name}"
        scripted_server.enqueue({"match": mark, "tool_calls": [
            call("Skill", {"name": "gitty"}, "a"), call("Skill", {"name": "hidden"}, "b"),
            call("Bash", {"command": "git --version"}, "c")]})
        scripted_server.enqueue({"match": mark, "content": "ok"})
        pid = spawn(mnt, {"intent": mark, "agent": name})
        assert mnt.wait(pid).startswith("exited(0)")
        out[name] = (pid, tool_results(mnt, pid), mnt.status(pid), trace(mnt, pid))
    pid, r, st, t = out["open"]
    assert "Tools granted by this skill: Bash(git:*)" in r[0]
    assert "disable-model-invocation" in r[1] and r[1].startswith("error: permission denied")
    assert r[2].startswith("git version")
    assert "Bash(git:*)" in st["allowed_tools"] and 'Grant("Bash(git:*)")' in t
    pid, r, st, t = out["strict"]
    assert "not granted: Bash(git:*) (the agent's tools list is explicit)" in r[0]
    assert r[2].startswith("error: permission denied: Bash is not allowed")
    assert st["allowed_tools"] == ["Read", "Skill"]
    # the hidden skill is never in a catalog
    system = context(mnt, pid)[0]["content"]
    assert "<name>\nhidden\n</name>" not in system and "<name>\ngitty\n</name>" in system


def test_scoped_bash_grant_on_the_mount(mnt, scripted_server):
    agent(mnt, "gitonly", "name: gitonly\ndescription: g\ntools: [\"Bash(git:*)\"]\n")
    mark = "GIT-ONLY"
    lines = ["git --version", "git --version && touch x1", "git status; touch x2", "git $(touch x3)",
             "git `touch x4`", "git log | touch x5", "(touch x6)", "git --version > x7",
             "git log <<EOF\nx\nEOF", "touch x8"]
    scripted_server.enqueue({"match": mark, "tool_calls": [
        call("Bash", {"command": c}, f"c{i}") for i, c in enumerate(lines)]})
    scripted_server.enqueue({"match": mark, "content": "ok"})
    pid = spawn(mnt, {"intent": mark, "agent": "gitonly"})
    assert mnt.wait(pid).startswith("exited(0)")
    r = tool_results(mnt, pid)
    assert r[0].startswith("git version") and r[0].rstrip().endswith("[exit 0]")
    for line, res in zip(lines[1:], r[1:]):
        assert res.startswith("error: permission denied"), (line, res)
    assert not list(mnt.project.glob("x*"))
    assert trace(mnt, pid).count("-1 [PERMISSION]") == len(lines) - 1


def test_agent_cannot_rewrite_its_own_limits(mnt, scripted_server):
    agent(mnt, "writer", "name: writer\ndescription: w\ntools: [Read, Write, Edit]\n")
    manifest = mnt.project / ".rnix/agents/writer/agent.yaml"
    before = manifest.read_bytes()
    (mnt.project / ".mcp.json").write_text("{}\n")
    (mnt.project / "alias").symlink_to(".rnix/agents/writer")
    mark = "SELF-EDIT"
    scripted_server.enqueue({"match": mark, "tool_calls": [
        call("Write", {"path": ".rnix/agents/writer/agent.yaml",
                       "content": "name: writer\ndescription: w\ntools: [Bash]\n"}, "a"),
        call("Edit", {"path": ".rnix/agents/writer/agent.yaml", "old_string": "Read", "new_string": "Bash"}, "b"),
        call("Write", {"path": "alias/agent.yaml", "content": "tools: [Bash]\n"}, "c"),
        call("Write", {"path": f"{mnt.project}/.rnix/agents/writer/agent.yaml", "content": "x"}, "d"),
        call("Write", {"path": ".rnix/state/trusted", "content": ""}, "e"),
        call("Write", {"path": ".agents/skills/evil/SKILL.md", "content": "x"}, "f"),
        call("Edit", {"path": ".mcp.json", "old_string": "{}", "new_string": "{\"x\": 1}"}, "g"),
        call("Read", {"path": ".rnix/agents/writer/agent.yaml"}, "h"),
        call("Write", {"path": "ok.txt", "content": "fine"}, "i")]})
    scripted_server.enqueue({"match": mark, "content": "ok"})
    pid = spawn(mnt, {"intent": mark, "agent": "writer"})
    assert mnt.wait(pid).startswith("exited(0)")
    r = tool_results(mnt, pid)
    for res in r[:7]:
        assert res.startswith("error: permission denied") and "holds agent limits" in res, res
    assert r[7] == before.decode() and r[8].startswith("wrote 4 bytes")
    assert manifest.read_bytes() == before
    assert (mnt.project / ".mcp.json").read_text() == "{}\n"
    assert not (mnt.project / ".rnix/state/trusted").exists()
    assert not (mnt.project / ".agents").exists()
    assert trace(mnt, pid).count("-1 [PERMISSION]") == 7


def test_bash_cannot_write_limits_and_an_explicit_grant_can(mnt, scripted_server):
    agent(mnt, "admin", "name: admin\ndescription: a\ntools: [Read, Bash, \"Write(.rnix/**)\"]\n")
    agent(mnt, "shell", "name: shell\ndescription: s\ntools: [Read, Bash, Write]\n")
    target = mnt.project / ".rnix/agents/shell/agent.yaml"
    before = target.read_text()
    mark = "BASH-LIMITS"
    scripted_server.enqueue({"match": mark, "tool_calls": [
        call("Bash", {"command": f"echo 'tools: [Bash]' >> .rnix/agents/shell/agent.yaml"}, "a"),
        call("Bash", {"command": "sed -i s/Read/Bash/ .rnix/agents/shell/agent.yaml"}, "b"),
        call("Bash", {"command": "cat .rnix/agents/shell/agent.yaml"}, "c")]})
    scripted_server.enqueue({"match": mark, "content": "ok"})
    pid = spawn(mnt, {"intent": mark, "agent": "shell"})
    assert mnt.wait(pid).startswith("exited(0)")
    r = tool_results(mnt, pid)
    assert r[0].startswith("error: permission denied") and r[1].startswith("error: permission denied")
    assert r[2].startswith("name: shell") and target.read_text() == before
    mark = "ADMIN-LIMITS"
    scripted_server.enqueue({"match": mark, "tool_calls": [
        call("Write", {"path": ".rnix/agents/shell/notes.md", "content": "ok"}, "a")]})
    scripted_server.enqueue({"match": mark, "content": "ok"})
    pid = spawn(mnt, {"intent": mark, "agent": "admin"})
    assert mnt.wait(pid).startswith("exited(0)")
    assert tool_results(mnt, pid)[0].startswith("wrote 2 bytes")


LOREM = ("Extract, transform and summarise documents of many kinds; use when the user asks for "
         "reports, tables, charts, conversions between formats, or checks of structure. ")


def test_default_spawn_prompt_stays_small_with_500_skills(mount_factory, scripted_server):
    m = mount_factory(scripted_providers(scripted_server.url))
    root = m.config_dir / "skills"
    for i in range(500):
        d = root / f"skill-{i:03d}"
        d.mkdir(parents=True)
        desc = (LOREM * (1 + i % 6))[: 200 + (i * 37) % 800].strip()
        extra = "disable-model-invocation: true\n" if i == 7 else ""
        (d / "SKILL.md").write_text(f"---\nname: skill-{i:03d}\ndescription: {desc}\n{extra}---\n"
                                    + "Instructions.\n" * 200)
        (d / "references").mkdir()
        (d / "references/notes.md").write_text("notes\n")
    mark = "BIG-CATALOG"
    scripted_server.enqueue({"match": mark, "tool_calls": [
        call("Skill", {"query": "skill-49"}, "a"), call("Skill", {"name": "skill-499"}, "b")]})
    scripted_server.enqueue({"match": mark, "content": "ok"})
    pid = spawn(m, {"intent": mark})
    assert m.wait(pid, timeout=120).startswith("exited(0)")
    system = context(m, pid)[0]["content"]
    assert len(system.encode()) < 48 * 1024
    assert "<name>\nskill-000\n</name>" in system and "<name>\nskill-007\n</name>" not in system
    assert "more skills are not listed" in system and '{"query": "<words>"}' in system
    r = tool_results(m, pid)
    assert "skill-499:" in r[0] and "skill-490:" in r[0]
    assert r[1].startswith(f"Base directory for this skill: {root / 'skill-499'}")
    assert r[1].count("Instructions.") == 200


def test_catalog_budget_is_configurable(mount_factory, scripted_server, monkeypatch):
    monkeypatch.setenv("RNIXFS_SKILL_CATALOG_TOKENS", "0")
    m = mount_factory(scripted_providers(scripted_server.url))
    for i in range(3):
        d = m.config_dir / "skills" / f"tiny-{i}"
        d.mkdir(parents=True)
        (d / "SKILL.md").write_text(f"---\nname: tiny-{i}\ndescription: tiny\n---\nx\n")
    pid = spawn(m, {"intent": "CATALOG-ZERO"})
    assert m.wait(pid).startswith("exited(0)")
    system = context(m, pid)[0]["content"]
    assert "<name>\ntiny-0\n</name>" not in system and "more skills are not listed" in system
    assert os.environ["RNIXFS_SKILL_CATALOG_TOKENS"] == "0"


def test_scoped_bash_from_a_skills_allowed_tools(mnt, scripted_server):
    user_skill(mnt, "gitskill", "allowed-tools: Read, Bash(git:*)\n")
    mark = "SKILL-GIT"
    scripted_server.enqueue({"match": mark, "tool_calls": [
        call("Bash", {"command": "git --version"}, "a"),
        call("Bash", {"command": "git --version && touch x"}, "b")]})
    scripted_server.enqueue({"match": mark, "content": "ok"})
    pid = spawn(mnt, {"intent": mark, "skills": ["gitskill"]})
    assert mnt.wait(pid).startswith("exited(0)")
    r = tool_results(mnt, pid)
    assert r[0].startswith("git version") and r[1].startswith("error: permission denied")
    assert not (mnt.project / "x").exists()
    assert mnt.status(pid)["allowed_tools"] == ["Bash(git:*)", "Read", "Skill"]
    t = trace(mnt, pid)
    assert "-1 [PERMISSION]" in t and "touch x" in t
