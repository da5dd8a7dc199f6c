"""The grant model (rnixfs.kernel.grants) and the Skill tool in both tool
modes, against a live kernel and the scripted server (docs/skills.md)."""
from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from rnixfs.devices.fs import Workspace
from rnixfs.fileio import confined_dir
from rnixfs.kernel.grants import (
    Grants, Unparsed, check_bash_protected, intersect, path_matches, protected, split_commands,
)
from rnixfs.kernel.plan import SpawnPlan
from rnixfs.kernel.request import parse
from rnixfs.kernel.tools import Tools
from rnixfs.skills import resolve_skills
from tests.kernelutil import registry, run_with_kernel

GIT = Grants(["Bash(git:*)", "Read"])


@pytest.mark.parametrize("line", [
    "git --version", "git status", "git log --oneline | git show", "(git status)",
    "git status 2>&1", "git status >/dev/null 2>&1", "git log --format='%H;rm -rf /'",
    "git diff \"a b\"", "git status &", "git log \\\n --oneline", "'git' log", "git log $(git rev-parse HEAD)",
    "git status # rm -rf /",
])
def test_scoped_bash_allows_only_matching_lines(line):
    assert GIT.check_command(line) is None, line


@pytest.mark.parametrize("line", [
    "git --version && touch x", "git status; rm -rf /", "git $(rm x)", "git `rm x`",
    "git log | sh", "git status || rm x", "(git status; rm x)", "git status & rm x",
    "git status\nrm x", "git diff \"$(rm -rf ~)\"", "git log <(rm x)", "git log >(rm x)",
    "git status > out", "git status >> out", "git status &> out", "git log <<EOF\nx\nEOF",
    "FOO=1 git status", "git ${X:-$(rm x)}", "git $((1+2))", "{ git status; }",
    "git status && ", "&& git status", "gitk", "/usr/bin/git status", "$GIT status",
    "eval git status", "exec git status", "git 'unterminated", "git \"unterminated", "git status\\",
    "if git status; then rm x; fi", "git status && && ls", "git\0status", "",
])
def test_scoped_bash_denies_everything_else(line):
    assert GIT.check_command(line) is not None, line


def test_bash_grant_forms():
    npm = Grants(["Bash(npm run test:*)"])
    assert npm.check_command("npm run test -- --watch") is None
    assert npm.check_command("npm run test") is None
    assert npm.check_command("npm run testx") is not None and npm.check_command("npm run build") is not None
    exact = Grants(["Bash(git status)"])
    assert exact.check_command("git status") is None and exact.check_command("git status -s") is not None
    wild = Grants(["Bash(ls *)"])
    assert wild.check_command("ls -la src") is None and wild.check_command("ls -la; rm x") is not None
    assert Grants(["Bash"]).check_command("anything && at all") is None
    assert Grants([]).check_command("anything") is None
    assert Grants(["Bash(*)"]).check_command("rm -rf x") is None      # the whole tool
    assert Grants(["Bash()"]).check_command("ls") is not None          # nothing


def test_split_commands_reaches_every_part():
    assert split_commands("a && b | c; (d || e) & f `g` $(h $(i))") == [
        ["a"], ["b"], ["c"], ["d"], ["e"], ["g"], ["i"], ["h", "$(…)"], ["f", "`…`", "$(…)"]]
    with pytest.raises(Unparsed):
        split_commands("cat <<EOF\nx\nEOF")


def test_path_grants():
    assert path_matches("src/**", "src/a/b.py") and not path_matches("src/**", "srcx/a.py")
    assert path_matches("docs/*.md", "docs/a.md") and not path_matches("docs/*.md", "docs/x/a.md")
    assert path_matches("*.md", "a/b/c.md") and path_matches("./src/**", "src/x")
    g = Grants(["Read(src/**)", "Write(docs/*.md)"])
    assert g.check_path("Read", "src/main.py") is None and g.check_path("Read", "secret.txt")
    assert g.check_path("Write", "docs/a.md") is None and g.check_path("Write", "src/a.md")
    assert not g.allows_tool("Bash") and g.allows_tool("Read")


def test_protected_paths_and_explicit_grants():
    for rel in (".rnix", ".rnix/agents/a/agent.yaml", ".rnix/state/trusted", ".agents/skills/x/SKILL.md",
                ".mcp.json"):
        assert protected(rel), rel
    for rel in (".rnixx", "src/.rnix", ".agents/other", ".mcp.json.bak"):
        assert not protected(rel), rel
    assert Grants(["Write(.rnix/**)"]).names_protected("Write", ".rnix/agents/a/agent.yaml")
    assert not Grants(["Write(**)"]).names_protected("Write", ".rnix/agents/a/agent.yaml")
    assert not Grants(["Write"]).names_protected("Write", ".rnix/x")
    assert not Grants(["Write(.rnix/**)"]).names_protected("Edit", ".rnix/x")
    assert check_bash_protected("cat .rnix/agents/a/agent.yaml") is None
    assert check_bash_protected("ls .*") is None and check_bash_protected("rm -f *.o") is None
    assert check_bash_protected("rm .rnix/x", Grants(["Bash", "Write(.rnix/**)"])) is None
    assert check_bash_protected("rm .rnix/x .mcp.json", Grants(["Bash", "Write(.rnix/**)"]))
    assert check_bash_protected("rm .rnix/x", Grants(["Bash", "Write"]))
    for line in ("echo x > .rnix/a", "sed -i s/a/b/ .rnix/a", "rm -rf .agents/skills", "cp x .mcp.json",
                 "cat .rnix/a | tee .rnix/b", "cd .rnix && rm -r agents", "rm -rf .*", "rm -r ./.r?ix",
                 "mv .[a-z]* /tmp"):
        assert check_bash_protected(line), line


def test_children_intersect_with_patterns():
    assert intersect(["Bash", "Read"], ["Bash(git:*)", "Read(src/**)", "Write"]) == ["Bash(git:*)", "Read(src/**)"]
    assert intersect(["Bash(npm:*)"], ["Bash(git:*)"]) == []
    assert intersect([], ["Read"]) == ["Read"] and intersect(["Read"], []) == ["Read"]


# -- the Skill tool against a live kernel -------------------------------------------------

PROVIDERS = """default: main
providers:
  main: {{type: openai, base_url: "{url}", model: m, max_retries: 0}}
  schema: {{type: openai, base_url: "{url}", model: m, tool_mode: schema, max_retries: 0}}
"""


def make_skill(root: Path, name: str, front: str = "", body: str = "Do the thing.\n") -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "SKILL.md").write_text(f"---\nname: {name}\ndescription: {name} skill\n{front}---\n{body}")
    return d


def run(tmp_path, url, body, config=None, **plan_fields):
    config = config or tmp_path / "config"
    project = tmp_path

    def plan(req, *, default_provider, driver_models, cwd):
        base = dict(agent="default", provider=req.provider or default_provider, model=None,
                    skills=[], allowed_tools=[], system_prompt="SYS")
        base.update(plan_fields)
        return SpawnPlan(**base)

    tools = functools.partial(Tools, Workspace(project), None,
                              skills=lambda: resolve_skills(project, config), open_root=confined_dir)
    return run_with_kernel(tmp_path, lambda: registry(PROVIDERS.format(url=url), tmp_path), body,
                           planner=plan, tools=tools)


async def spawn_wait(k, **req):
    p = await k.spawn(parse(json.dumps(req).encode()))
    await p.exited_event.wait()
    return p


def test_skill_tool_in_schema_mode(tmp_path, scripted_server):
    make_skill(tmp_path / "config/skills", "notes", "allowed-tools: Read\n", "Write notes.\n")
    scripted_server.enqueue(json.dumps({"tool": "Skill", "arguments": {"name": "notes"}}))
    scripted_server.enqueue(json.dumps({"tool": "answer", "arguments": {"text": "done"}}))
    p = run(tmp_path, scripted_server.url, lambda k: spawn_wait(k, intent="x", provider="schema"))
    assert p.exit_code == 0 and p.result == "done"
    enum = scripted_server.requests[0]["response_format"]["json_schema"]["schema"]["properties"]["tool"]["enum"]
    assert "Skill" in enum and "Skill(name, query)" in scripted_server.requests[0]["messages"][0]["content"]
    result = scripted_server.requests[1]["messages"][-1]["content"]
    assert result.startswith("Result of Skill:\nBase directory for this skill: ")
    assert result.endswith("Write notes.")
    assert 'Skill("notes") = ' in p.trace.decode() and "notes" in p.skills


def test_skill_tool_errors_are_traced(tmp_path, scripted_server):
    root = tmp_path / "config/skills"
    make_skill(root, "manual", "disable-model-invocation: true\n")
    make_skill(root, "other")
    (root / "broken").mkdir()
    (root / "broken/SKILL.md").write_text("no frontmatter\n")
    calls = [("a", {"name": "nope"}), ("b", {"name": "manual"}), ("c", {"name": "broken"}),
             ("d", {}), ("e", {"name": "other"}), ("f", {"query": "other skill"}), ("g", {"query": "zzz"})]
    scripted_server.enqueue({"tool_calls": [
        {"id": cid, "function": {"name": "Skill", "arguments": json.dumps(a)}} for cid, a in calls]})
    scripted_server.enqueue("ok")
    p = run(tmp_path, scripted_server.url, lambda k: spawn_wait(k, intent="x"),
            usable_skills=["manual", "broken"])
    r = [m["content"] for m in p.messages if m["role"] == "tool"]
    assert r[0] == 'error: skill "nope" not found'
    assert r[1].startswith("Base directory")  # the agent lists it: a user choice, not the model's
    assert r[2].startswith("error: skill \"broken\" is not loadable") or r[2].startswith('error: skill "broken" not found')
    assert r[3].startswith('error: missing argument "name"')
    assert r[4] == 'error: permission denied: skill "other" is not among the skills this agent may use'
    assert r[5] == "no skill matches 'other skill'" and r[6] == "no skill matches 'zzz'"
    t = p.trace.decode()
    assert '-1 [NOT_FOUND]' in t and '-1 [PERMISSION]' in t


def test_disable_model_invocation_is_refused_without_an_agent_list(tmp_path, scripted_server):
    make_skill(tmp_path / "config/skills", "manual", "disable-model-invocation: true\n")
    scripted_server.enqueue({"tool_calls": [
        {"id": "a", "function": {"name": "Skill", "arguments": json.dumps({"name": "manual"})}}]})
    scripted_server.enqueue("ok")
    p = run(tmp_path, scripted_server.url, lambda k: spawn_wait(k, intent="x"))
    r = [m["content"] for m in p.messages if m["role"] == "tool"]
    assert r[0].startswith('error: permission denied: skill "manual" sets disable-model-invocation')


def test_activated_grants_never_exceed_the_parent(tmp_path, scripted_server):
    make_skill(tmp_path / "config/skills", "wide", "allowed-tools: Bash Write\n")
    scripted_server.enqueue({"match": "PARENT", "tool_calls": [
        {"id": "s", "function": {"name": "Spawn", "arguments": json.dumps({"intent": "CHILD"})}}]})
    scripted_server.enqueue({"match": '"content": "CHILD"', "tool_calls": [
        {"id": "a", "function": {"name": "Skill", "arguments": json.dumps({"name": "wide"})}}]})
    scripted_server.enqueue({"match": '"content": "CHILD"', "content": "child done"})
    scripted_server.enqueue({"match": "PARENT", "content": "parent done"})

    async def body(k):
        parent = await k.spawn(parse(b"PARENT"))
        await parent.exited_event.wait()
        child = next(p for p in k.table.values() if p.intent == "CHILD")
        await child.exited_event.wait()
        return child

    child = run(tmp_path, scripted_server.url, body,
                allowed_tools=["Read", "Skill", "Spawn", "Bash(git:*)"])
    assert "Bash" not in child.allowed_tools and "Write" not in child.allowed_tools
    assert child.allowed_tools == ["Bash(git:*)", "Read", "Skill", "Spawn"]
    r = [m["content"] for m in child.messages if m["role"] == "tool"]
    assert "not granted: Bash, Write (beyond the parent's grants)" in r[0]


def test_hostile_skill_paths_stay_inside_the_skill(tmp_path, scripted_server):
    config = tmp_path.parent / f"{tmp_path.name}-config"  # the user scope, outside the project
    d = make_skill(config / "skills", "docs")
    (d / "references").mkdir()
    (d / "references/a.md").write_text("A\n")
    (config / "providers.yaml").write_text("secret: KEY-123\n")
    (d / "references/out").symlink_to(config)
    calls = [("a", "Read", {"path": "/skills/docs/../../providers.yaml"}),
             ("b", "Read", {"path": f"{d}/references/../../../providers.yaml"}),
             ("c", "Read", {"path": f"{d}/references/out/providers.yaml"}),
             ("d", "Skill", {"name": "../docs"}),
             ("e", "Read", {"path": "/skills/../config/providers.yaml"}),
             ("f", "Glob", {"pattern": f"{d}/../*/providers.yaml"}),
             ("g", "Grep", {"pattern": "KEY", "glob": f"{d}/**"}),
             ("h", "Read", {"path": "/skills/docs/references/a.md"})]
    scripted_server.enqueue({"tool_calls": [
        {"id": cid, "function": {"name": n, "arguments": json.dumps(a)}} for cid, n, a in calls]})
    scripted_server.enqueue("ok")
    p = run(tmp_path, scripted_server.url, lambda k: spawn_wait(k, intent="x"), config=config)
    r = [m["content"] for m in p.messages if m["role"] == "tool"]
    assert all("KEY-123" not in x for x in r), r
    for x in r[:6]:
        assert x.startswith("error:") or x == "(no matches)", x
    assert r[6] == "(no matches)" and r[7] == "A\n"


def test_path_grants_on_the_tools(tmp_path, scripted_server):
    (tmp_path / "src").mkdir()
    (tmp_path / "src/a.py").write_text("A = 1\n")
    (tmp_path / "secret.txt").write_text("A = secret\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "src/link.py").symlink_to(tmp_path / "secret.txt")
    calls = [("a", "Read", {"path": "src/a.py"}), ("b", "Read", {"path": "secret.txt"}),
             ("c", "Read", {"path": "src/link.py"}), ("d", "Write", {"path": "docs/n.md", "content": "x"}),
             ("e", "Write", {"path": "docs/sub/n.md", "content": "x"}), ("f", "Write", {"path": "n.md", "content": "x"}),
             ("g", "Glob", {"pattern": "**/*"}), ("h", "Grep", {"pattern": "A =", "glob": "**"})]
    scripted_server.enqueue({"tool_calls": [
        {"id": cid, "function": {"name": n, "arguments": json.dumps(a)}} for cid, n, a in calls]})
    scripted_server.enqueue("ok")
    p = run(tmp_path, scripted_server.url, lambda k: spawn_wait(k, intent="x"),
            allowed_tools=["Read(src/**)", "Write(docs/*.md)", "Glob(src/**)", "Grep(src/*.py)"])
    r = [m["content"] for m in p.messages if m["role"] == "tool"]
    assert r[0] == "A = 1\n"
    assert r[1].startswith("error: permission denied: Read of secret.txt is not allowed")
    assert r[2].startswith("error: permission denied: Read of secret.txt")   # the real path counts
    assert r[3] == "wrote 1 bytes to docs/n.md" and (tmp_path / "docs/n.md").exists()
    assert r[4].startswith("error: permission denied") and r[5].startswith("error: permission denied")
    assert not (tmp_path / "n.md").exists()
    assert set(r[6].splitlines()) == {"src/a.py", "src/link.py"}
    assert r[7] == "src/a.py:1: A = 1"   # the symlink is not followed by Grep's walk
    assert p.trace.decode().count("-1 [PERMISSION]") == 4
