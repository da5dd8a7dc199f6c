"""Hostile, in-process and fast: a directory swapped for a symlink while
SKILL.md, agent.yaml, instructions.md, AGENTS.md and skill resources are
read or listed never puts an outside file into what is read (docs/skills.md,
"Symlinks in skills/ and agents/")."""
from __future__ import annotations

import pytest

import os
import time
from pathlib import Path

from rnixfs.agents import AgentError, load_agent, project_doc
from rnixfs.skills import resolve_skills
from rnixfs.skills.model import SkillError
from rnixfs.skills.parse import SkillParseError
from tests.swaputil import stop_swapping, swap_forever

SKILL = "---\nname: {name}\ndescription: d\n---\n{body}\n"


@pytest.mark.expect_log('leaves the project; ignored')
def test_reads_at_spawn_never_leak_an_outside_file(tmp_path):
    project, cfg = tmp_path / "project", tmp_path / "cfg"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "SKILL.md").write_text("---\nname: s\ndescription: OUTSIDE\n---\nOUTSIDE\n")
    (outside / "agent.yaml").write_text("name: a\ndescription: OUTSIDE\n")
    (outside / "instructions.md").write_text("OUTSIDE")
    (outside / "AGENTS.md").write_text("OUTSIDE")
    for f in outside.iterdir():
        f.chmod(0o600)
    skill = project / ".rnix/skills/s"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text(SKILL.format(name="s", body="inside"))
    (skill / "ref.md").write_text("inside")
    (outside / "ref.md").write_text("OUTSIDE")
    agent = project / ".rnix/agents/a"
    agent.mkdir(parents=True)
    (agent / "agent.yaml").write_text("name: a\ndescription: inside\n")
    (agent / "instructions.md").write_text("inside")
    sub = project / "sub"
    sub.mkdir()
    (sub / "AGENTS.md").write_text("inside")
    (project / "AGENTS.md").write_text("top")
    cfg.mkdir()
    dirs = (skill, agent, sub)
    swappers = [swap_forever(d, outside) for d in dirs]
    seen = {"ok": 0, "refused": 0}
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            for s in resolve_skills(project, cfg).winners.values():
                if s.name != "s":
                    continue
                try:
                    body = s.body()
                    assert "OUTSIDE" not in body and s.description != "OUTSIDE"
                    seen["ok"] += 1
                except (SkillError, SkillParseError):
                    seen["refused"] += 1
                assert set(s.resources()) <= {"ref.md"}   # never a name from outside, never raises
                try:
                    assert s.read_resource("ref.md") == b"inside"
                except SkillError as exc:
                    assert "OUTSIDE" not in str(exc)
            try:
                m = load_agent("a", project, cfg)
                assert "OUTSIDE" not in m.instructions and m.description != "OUTSIDE"
                seen["ok"] += 1
            except AgentError as exc:
                assert "OUTSIDE" not in str(exc)
                seen["refused"] += 1
            doc = project_doc(project / "sub", project)
            assert doc in (None, "inside", "top"), doc
    finally:
        for p, d in zip(swappers, dirs):
            stop_swapping(p, d)
    assert seen["ok"] and seen["refused"]  # both sides of the swap were hit


def test_confined_dir_and_read_in_scope(tmp_path):
    import pytest

    from rnixfs.fileio import ScopeEscape, confined_dir, read_in_scope

    scope, outside = tmp_path / "scope", tmp_path / "outside"
    (scope / "skills" / "real").mkdir(parents=True)
    (scope / "skills" / "real" / "f.md").write_text("inside")
    outside.mkdir()
    (outside / "f.md").write_text("OUTSIDE")
    os.symlink("real", scope / "skills" / "alias")
    os.symlink(outside, scope / "skills" / "esc")
    os.symlink("../../outside", scope / "skills" / "esc-rel")
    with confined_dir(scope, scope / "skills" / "alias") as ws:
        assert ws.read_file("f.md", 100) == (b"inside", False)
        with pytest.raises(Exception):
            ws.read_file("../esc/f.md", 100)
    for esc in ("esc", "esc-rel"):
        with pytest.raises(ScopeEscape):
            confined_dir(scope, scope / "skills" / esc)
        with pytest.raises(ScopeEscape):
            read_in_scope(scope, scope / "skills" / esc / "f.md", 100)
    with pytest.raises(ScopeEscape):
        read_in_scope(scope, tmp_path / "elsewhere.md", 100)   # not below the scope root at all
    assert read_in_scope(scope, scope / "skills" / "alias" / "f.md", 100) == (b"inside", 6)


def test_a_skill_root_swapped_for_a_symlink_never_breaks_resolution(tmp_path):
    """``.rnix/skills`` itself trading places with a symlink leading out:
    resolution neither raises (realpath racing the swap) nor takes an outside skill."""
    project, cfg, outside = tmp_path / "project", tmp_path / "cfg", tmp_path / "outside"
    root = project / ".rnix/skills"
    for base, desc in ((root, "inside"), (outside, "OUTSIDE")):
        (base / "s").mkdir(parents=True)
        (base / "s" / "SKILL.md").write_text(f"---\nname: s\ndescription: {desc}\n---\nbody\n")
    cfg.mkdir()
    swapper = swap_forever(root, outside)
    seen = {"inside": 0, "absent": 0}
    try:
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            res = resolve_skills(project, cfg)
            s = res.winners.get("s")
            assert s is None or s.description in ("inside", "")   # "": refused mid-swap
            seen["inside" if s is not None and s.description else "absent"] += 1
    finally:
        stop_swapping(swapper, root)
    assert seen["inside"] and seen["absent"]  # both sides of the swap were hit
