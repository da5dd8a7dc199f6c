"""The write-scope table for every flag combination, inside and outside a project;
git and local sources; trust; agent create / agent skill."""
from __future__ import annotations

import os
import subprocess

import pytest

from tests.pkg_registry import skill_md
from tests.pkgutil import Sandbox, pkg_registry  # noqa: F401

TABLE = [
    # flags,            inside,  outside
    ((),                "pn",    "un"),
    (("-g",),           "un",    "un"),
    (("--shared",),     "pa",    "ua"),
    (("-g", "--shared"), "ua",   "ua"),
]


@pytest.mark.parametrize("flags,inside,outside", TABLE)
def test_scope_table(tmp_path, pkg_registry, flags, inside, outside):
    sb = Sandbox(tmp_path, pkg_registry)
    pkg_registry.add_skill("scoped")
    sub = sb.project / "src" / "deep"
    sub.mkdir(parents=True)
    for cwd, key in ((sub, inside), (sb.outside, outside)):
        code, out = sb.json("skill", "install", "scoped", *flags, cwd=cwd)
        assert code == 0, out
        assert out["data"]["installed"][0]["path"] == str(sb.roots[key] / "scoped")
        assert (sb.roots[key] / "scoped" / "SKILL.md").is_file()
        others = [k for k in sb.roots if k != key]
        assert not any((sb.roots[k] / "scoped").exists() for k in others)
        # remove with the same flags finds the same copy
        rflags = [f for f in flags]
        code, out = sb.json("skill", "remove", "scoped", *rflags, cwd=cwd)
        assert code == 0 and out["data"]["removed"]["path"] == str(sb.roots[key] / "scoped"), out
    # an explicit --project counts as inside
    code, out = sb.json("skill", "install", "scoped", *flags, "--project", str(sb.project), cwd=sb.outside)
    assert out["data"]["installed"][0]["path"] == str(sb.roots[inside] / "scoped")


def test_project_root_symlink_leaving_the_project_refused(tmp_path, pkg_registry):
    sb = Sandbox(tmp_path, pkg_registry)
    pkg_registry.add_skill("s")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, sb.project / ".rnix" / "skills")
    r = sb.run("skill", "install", "s")
    assert r.returncode == 1 and "leaves the project" in r.stderr
    assert list(elsewhere.iterdir()) == []


def git(*args, cwd):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                   capture_output=True)


def test_git_and_local_sources(tmp_path):
    sb = Sandbox(tmp_path)
    repo = tmp_path / "repo"
    (repo / "skills" / "gamma").mkdir(parents=True)
    (repo / "skills" / "gamma" / "SKILL.md").write_bytes(skill_md("gamma"))
    (repo / ".claude" / "skills" / "delta").mkdir(parents=True)
    (repo / ".claude" / "skills" / "delta" / "SKILL.md").write_bytes(skill_md("delta"))
    git("init", "-q", "-b", "main", cwd=repo)
    git("add", ".", cwd=repo)
    git("commit", "-qm", "one", cwd=repo)
    git("tag", "v1", cwd=repo)
    url = f"file://{repo}"
    r = sb.run("skill", "install", url)
    assert r.returncode == 2 and "delta, gamma" in r.stderr.replace("gamma, delta", "delta, gamma")
    r = sb.run("skill", "install", url + "#v1", "--all")
    assert r.returncode == 0, r.stderr
    rec = (sb.roots["pn"] / "gamma" / ".registry.yaml").read_text()
    assert "type: git" in rec and "ref: v1" in rec and "commit:" in rec
    assert not (sb.roots["pn"] / "gamma" / ".git").exists()
    # new commit on main; gamma was pinned to v1 so it stays, a main install updates
    (repo / "skills" / "gamma" / "SKILL.md").write_bytes(skill_md("gamma", "Gamma, second edition"))
    git("commit", "-qam", "two", cwd=repo)
    code, out = sb.json("skill", "check", "gamma")
    assert out["data"]["skills"][0]["outcome"] == "up-to-date"
    r = sb.run("skill", "install", url + "#main:skills/gamma", "--force")
    assert r.returncode == 0, r.stderr
    (repo / "skills" / "gamma" / "SKILL.md").write_bytes(skill_md("gamma", "Gamma, third edition"))
    git("commit", "-qam", "three", cwd=repo)
    code, out = sb.json("skill", "check", "gamma")
    assert out["data"]["skills"][0]["outcome"] == "update-available"
    r = sb.run("skill", "update", "gamma")
    assert r.returncode == 0 and b"third edition" in (sb.roots["pn"] / "gamma" / "SKILL.md").read_bytes()
    r = sb.run("skill", "install", f"file://{tmp_path}/no-such-repo.git")
    assert r.returncode in (3, 5) and "git clone failed" in r.stderr
    # local directory and local archive; local sources need no --yes for scripts
    local = tmp_path / "local" / "epsilon"
    (local / "scripts").mkdir(parents=True)
    (local / "SKILL.md").write_bytes(skill_md("epsilon"))
    (local / "scripts" / "x.sh").write_text("#!/bin/sh\n")
    r = sb.run("skill", "install", str(local), "-g")
    assert r.returncode == 0, r.stderr
    assert "trust: local" in (sb.roots["un"] / "epsilon" / ".registry.yaml").read_text()
    os.symlink("/etc/passwd", local / "leak")
    r = sb.run("skill", "install", str(local), "-g", "--force")
    assert r.returncode == 7 and "leads out" in r.stderr
    assert not (sb.roots["un"] / "epsilon" / "leak").exists()
    r = sb.run("skill", "install", str(tmp_path / "missing"))
    assert r.returncode == 3


def test_trust_command(tmp_path):
    sb = Sandbox(tmp_path)
    (sb.project / ".rnix" / "skills" / "p").mkdir(parents=True)
    (sb.project / ".rnix" / "skills" / "p" / "SKILL.md").write_bytes(skill_md("p"))
    assert "untrusted project" in sb.run("skill", "list").stderr
    state = sb.project / ".rnix" / "state"
    state.mkdir()
    os.symlink("/etc/hostname", state / "trusted")         # a symlink never counts, and is replaced
    r = sb.run("trust", str(sb.project))
    assert r.returncode == 0 and (state / "trusted").is_file() and not (state / "trusted").is_symlink()
    assert "untrusted project" not in sb.run("skill", "list").stderr
    assert sb.run("trust", "--revoke", str(sb.project)).returncode == 0
    assert "untrusted project" in sb.run("skill", "list").stderr
    assert sb.run("trust", str(tmp_path / "nope")).returncode != 0


def test_agent_create_and_skill_edits_keep_comments(tmp_path):
    sb = Sandbox(tmp_path)
    r = sb.run("agent", "create", "reviewer", "--skills", "a,b", "--model", "m1", "--provider", "p1")
    assert r.returncode == 0, r.stderr
    path = sb.project / ".rnix" / "agents" / "reviewer" / "agent.yaml"
    assert (path.parent / "instructions.md").is_file()
    r = sb.run("agent", "show", "reviewer", "--json")
    import json
    d = json.loads(r.stdout)["data"]
    assert d["skills"] == ["a", "b"] and d["models"]["preferred"] == "m1" and d["models"]["provider"] == "p1"
    assert sb.run("agent", "create", "reviewer").returncode != 0
    assert sb.run("agent", "create", "../evil").returncode != 0
    r = sb.run("agent", "create", "globalone", "-g", cwd=sb.outside)
    assert r.returncode == 0 and (sb.cfg / "agents" / "globalone" / "agent.yaml").is_file()
    # a hand-written agent.yaml with comments and an unusual key order
    path.write_text("# my reviewer\nskills:   # what it knows\n  - a   # first\n  - b\n"
                    "name: reviewer  # keep me\ndescription: 'quoted'\nmax_steps: 7\n")
    assert sb.run("agent", "skill", "add", "reviewer", "c", "a").returncode == 0
    assert sb.run("agent", "skill", "remove", "reviewer", "b").returncode == 0
    text = path.read_text()
    for keep in ("# my reviewer", "# what it knows", "# first", "# keep me", "'quoted'"):
        assert keep in text, text
    assert text.index("skills:") < text.index("name:") < text.index("max_steps")
    r = sb.run("agent", "skill", "list", "reviewer")
    assert r.stdout.split() == ["a", "c"]
    r = sb.run("agent", "skill", "remove", "reviewer", "zzz")
    assert r.returncode != 0 and "not in the agent's skills" in r.stderr
    assert sb.run("agent", "skill", "add", "reviewer", "Bad Name").returncode != 0
    assert sb.run("agent", "skill", "list", "nobody").returncode != 0


def test_create_and_delete_are_audited(tmp_path):
    sb = Sandbox(tmp_path)
    assert sb.run("skill", "create", "noted").returncode == 0
    assert sb.run("skill", "delete", "noted").returncode == 0
    lines = [(a["action"], a["skill"], a["scope"], a["outcome"]) for a in sb.audit()]
    assert lines == [("create", "noted", "project", "ok"), ("delete", "noted", "project", "ok")]
    assert oct((sb.state / "audit.jsonl").stat().st_mode & 0o777) == "0o600"
