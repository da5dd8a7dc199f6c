"""AGENTS.md injection, the system prompt, skill selection, allowed tools."""
from __future__ import annotations

import os

import pytest

from rnixfs.agents.prompt import CATALOG_INTRO
from rnixfs.agents import (
    allowed_tools, build_system_prompt, load_agent, parse_agent_yaml, project_doc, select_skills,
)
from rnixfs.skills import SkillInvalid, SkillNotFound, resolve_skills

MARK = "\n\n[truncated: AGENTS.md exceeded {} bytes]"


# --- project_doc ------------------------------------------------------------------------


def test_nearest_agents_md_wins(tmp_path):
    root = tmp_path / "proj"
    sub = root / "pkg" / "src"
    sub.mkdir(parents=True)
    (root / "AGENTS.md").write_text("root rules\n")
    (root / "pkg" / "AGENTS.md").write_text("pkg rules\n")
    assert project_doc(sub, root) == "pkg rules\n"
    assert project_doc(root / "pkg", root) == "pkg rules\n"
    assert project_doc(root, root) == "root rules\n"


def test_never_past_the_project_root(tmp_path):
    (tmp_path / "AGENTS.md").write_text("above the project\n")
    root = tmp_path / "proj"
    (root / "a").mkdir(parents=True)
    assert project_doc(root / "a", root) is None
    outside = tmp_path / "other"
    outside.mkdir()
    (outside / "AGENTS.md").write_text("not this project\n")
    assert project_doc(outside, root) is None                 # cwd outside the project


def test_only_agents_md_counts(tmp_path):
    (tmp_path / "CLAUDE.md").write_text("claude\n")
    (tmp_path / "agents.md").write_text("lowercase\n")
    (tmp_path / "RNIX.md").write_text("rnix\n")
    assert project_doc(tmp_path, tmp_path) is None
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "AGENTS.md").mkdir()                   # a directory is not a document
    (tmp_path / "AGENTS.md").write_text("the one\n")
    assert project_doc(tmp_path / "sub", tmp_path) == "the one\n"


@pytest.mark.expect_log('leaves the project; ignored')
def test_symlink_leaving_the_project_is_ignored(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    secret = tmp_path / "secret"
    secret.write_text("secret\n")
    os.symlink(secret, root / "AGENTS.md")
    assert project_doc(root, root) is None
    inner = root / "docs.md"
    inner.write_text("inner\n")
    (root / "AGENTS.md").unlink()
    os.symlink(inner, root / "AGENTS.md")
    assert project_doc(root, root) == "inner\n"


@pytest.mark.expect_log('exceeded soft cap')
def test_truncation_is_utf8_safe_with_marker(tmp_path):
    text = "é" * 40000                                          # 80000 bytes, 2 per character
    (tmp_path / "AGENTS.md").write_text(text)
    doc = project_doc(tmp_path, tmp_path)
    assert doc == "é" * 32768 + MARK.format(65536)
    doc = project_doc(tmp_path, tmp_path, budget=101)             # cuts inside a character
    assert doc == "é" * 50 + MARK.format(101)
    (tmp_path / "AGENTS.md").write_text("€" * 10)                # 3 bytes each
    for budget, keep in ((4, 1), (5, 1), (6, 2)):
        assert project_doc(tmp_path, tmp_path, budget=budget) == "€" * keep + MARK.format(budget)


def test_exact_budget_is_not_truncated(tmp_path):
    (tmp_path / "AGENTS.md").write_bytes(b"x" * 100)
    assert project_doc(tmp_path, tmp_path, budget=100) == "x" * 100


def test_unreadable_or_special_files_degrade(tmp_path):
    os.mkfifo(tmp_path / "AGENTS.md")
    assert project_doc(tmp_path, tmp_path) is None
    os.unlink(tmp_path / "AGENTS.md")
    (tmp_path / "AGENTS.md").write_bytes(b"bad \xff byte\n")
    assert project_doc(tmp_path, tmp_path) == "bad \ufffd byte\n"


@pytest.mark.expect_log('exceeded soft cap')
def test_huge_file_reads_only_the_budget(tmp_path):
    with open(tmp_path / "AGENTS.md", "wb") as f:
        f.truncate(1 << 30)                                        # 1 GiB sparse file
    doc = project_doc(tmp_path, tmp_path)
    assert doc.endswith(MARK.format(65536)) and len(doc) < 70000


# --- prompt ------------------------------------------------------------------------------


@pytest.fixture
def world(tmp_path):
    cfg = tmp_path / "cfg"
    root = cfg / "skills"

    def skill(name, body, extra=""):
        d = root / name
        d.mkdir(parents=True)
        (d / "SKILL.md").write_text(f"---\nname: {name}\ndescription: does {name} <&>\n{extra}---\n{body}\n")
        return d

    skill("alpha", "Alpha body.", "allowed-tools: Read Grep\nsynergy:\n  - with: beta\n    instruction: Use alpha then beta.\n")
    skill("beta", "Beta body.", "allowed-tools: /dev/shell\nsynergy:\n  - with: alpha\n    instruction: Use alpha then beta.\n  - with: gamma\n    instruction: Never shown.\n")
    skill("gamma", "Gamma body.")
    skill("delta", "", "allowed-tools: Write\n")
    bad = root / "broken"
    bad.mkdir()
    (bad / "SKILL.md").write_text("---\nname: broken\n---\n")
    adir = cfg / "agents" / "dev"
    adir.mkdir(parents=True)
    (adir / "agent.yaml").write_text("name: dev\nskills: [alpha, beta]\ntools: [Edit]\nlanguage: French\n")
    (adir / "instructions.md").write_text("You are dev.\n\n")
    res = resolve_skills(None, cfg, home=tmp_path / "home")
    return load_agent("dev", None, cfg), res, root


def test_prompt_order_and_seeds_format(world):
    agent, res, root = world
    loaded, available = select_skills(agent, res)
    assert [s.name for s in loaded] == ["alpha", "beta"]
    assert [s.name for s in available] == ["delta", "gamma"]      # broken is not available
    prompt = build_system_prompt(agent, "Project rules.\n", loaded, available)
    assert prompt == (
        "You are dev.\n\n"
        "# Project Instructions (AGENTS.md)\n\nProject rules.\n\n"
        f"Base directory for this skill: {root / 'alpha'}\n\nAlpha body.\n\n"
        f"Base directory for this skill: {root / 'beta'}\n\nBeta body.\n\n"
        "[Skill Synergy]\n\nUse alpha then beta.\n\n"
        f"{CATALOG_INTRO}\n\n"
        "<available_skills>\n"
        f"<skill>\n<name>\ndelta\n</name>\n<description>\ndoes delta &lt;&amp;&gt;\n</description>\n"
        f"<location>\n{root / 'delta' / 'SKILL.md'}\n</location>\n</skill>\n"
        f"<skill>\n<name>\ngamma\n</name>\n<description>\ndoes gamma &lt;&amp;&gt;\n</description>\n"
        f"<location>\n{root / 'gamma' / 'SKILL.md'}\n</location>\n</skill>\n"
        "</available_skills>\n\n"
        "Always respond in French.")


def test_prompt_is_byte_identical_and_bodies_frozen(world):
    agent, res, root = world
    loaded, available = select_skills(agent, res)
    first = build_system_prompt(agent, "doc", loaded, available)
    (root / "alpha" / "SKILL.md").write_text("---\nname: alpha\ndescription: changed\n---\nNEW BODY\n")
    assert build_system_prompt(agent, "doc", loaded, available) == first
    assert build_system_prompt(agent, "doc", list(loaded), list(reversed(available))) == first


def test_project_doc_opt_out_and_no_agent(world):
    agent, res, _ = world
    agent.project_doc = False
    assert "AGENTS.md" not in build_system_prompt(agent, "rules", [], [])
    p = build_system_prompt(None, "rules", [], [], default_instructions="Default.")
    assert p == "Default.\n\n# Project Instructions (AGENTS.md)\n\nrules"
    assert build_system_prompt(None, "  \n", [], []) == ""


def test_request_skills_deduplicated_and_errors(world):
    agent, res, _ = world
    loaded, available = select_skills(agent, res, ["gamma", "alpha"])
    assert [s.name for s in loaded] == ["alpha", "beta", "gamma"]
    assert [s.name for s in available] == ["delta"]
    with pytest.raises(SkillNotFound, match='skill "nope" not found'):
        select_skills(agent, res, ["nope"])
    with pytest.raises(SkillInvalid, match="missing description"):
        select_skills(agent, res, ["broken"])
    loaded, available = select_skills(None, res, list_available=False)
    assert loaded == [] and available == []


def test_deferred_skills_limit_the_available_list(world):
    agent, res, _ = world
    agent.deferred_skills = ["gamma"]
    _, available = select_skills(agent, res)
    assert [s.name for s in available] == ["gamma"]
    agent.deferred_skills = ["ghost"]
    with pytest.raises(SkillNotFound):
        select_skills(agent, res)


def test_allowed_tools_union(world):
    agent, res, _ = world
    loaded, _ = select_skills(agent, res)
    assert allowed_tools(agent, loaded) == ["Bash", "Edit", "Grep", "Read"]
    assert allowed_tools(None, [res.skills["gamma"]]) == []           # empty = unrestricted
    assert allowed_tools(parse_agent_yaml("name: x\ntools: /dev/fs\n"), []) == [
        "Edit", "Glob", "Grep", "Read", "Write"]
    bare = parse_agent_yaml("name: x\n")
    assert allowed_tools(bare, [res.skills["delta"], res.skills["gamma"]]) == ["Write"]


def test_builtin_code_analyst_end_to_end(tmp_path, monkeypatch):
    from rnixfs.skills import ensure_builtins

    monkeypatch.delenv("RNIXFS_NO_BUILTINS", raising=False)
    cfg = tmp_path / "cfg"
    ensure_builtins(cfg)
    agent = load_agent("code-analyst", tmp_path, cfg)
    res = resolve_skills(tmp_path, cfg, home=tmp_path)
    loaded, available = select_skills(agent, res)
    assert [s.name for s in loaded] == ["code-analysis"] and available == []
    assert allowed_tools(agent, loaded) == ["Bash", "Glob", "Grep", "Read"]
    (tmp_path / "AGENTS.md").write_text("Run make test.\n")
    prompt = build_system_prompt(agent, project_doc(tmp_path, tmp_path), loaded, available)
    assert prompt.startswith("# Code analyst")
    assert "# Project Instructions (AGENTS.md)\n\nRun make test." in prompt
    assert f"Base directory for this skill: {cfg / 'skills' / 'code-analysis'}" in prompt
    assert agent.source == "builtin" and agent.step_timeout_s == 300.0
