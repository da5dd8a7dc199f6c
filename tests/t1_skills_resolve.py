"""Four-path resolution, shadowing, diagnostics, trust, ancestors, built-ins."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import threading
from pathlib import Path

import pytest

from rnixfs.skills import (
    SkillInvalid, SkillNotFound, ensure_builtins, find_project, is_trusted, resolve_skills,
    skill_roots, validate_strict, write_scope,
)
from rnixfs.skills.builtins import MARKER, packaged
from rnixfs.skills.trust import check_trust, trust_line


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A project, a config dir and a HOME, all under tmp_path."""
    home = tmp_path / "home"
    (home / ".agents").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("RNIXFS_ASCII", raising=False)
    project = tmp_path / "proj"
    project.mkdir()

    class Env:
        pass

    e = Env()
    e.tmp, e.home, e.project, e.cfg = tmp_path, home, project, home / ".config" / "rnix"
    e.roots = {
        "pn": project / ".rnix" / "skills",
        "pa": project / ".agents" / "skills",
        "un": e.cfg / "skills",
        "ua": home / ".agents" / "skills",
    }
    return e


def put(root: Path, name: str, description: str = "", *, declared: str | None = None, body: str = "",
        extra: str = "") -> Path:
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    desc = description or f"{name} at {root}"
    (d / "SKILL.md").write_text(
        f"---\nname: {declared or name}\ndescription: {desc}\n{extra}---\n{body or 'body of ' + name}\n")
    return d


def resolve(env, **kw):
    return resolve_skills(env.project, env.cfg, home=env.home, **kw)


# --- priority and shadowing ------------------------------------------------------------


def test_four_paths_priority_and_one_warning_per_shadow_event(env):
    for key in ("pn", "pa", "un", "ua"):
        put(env.roots[key], "dup", f"from {key}")
    lines = []
    res = resolve(env, warn=lines.append)
    assert res.skills["dup"].description == "from pn"
    assert (res.skills["dup"].scope, res.skills["dup"].namespace) == ("project", "native")
    win = env.roots["pn"] / "dup"
    expected = [
        f'[skill] warning: shadowed skill "dup": winner={win} (project/native); '
        f'shadowed={env.roots[k] / "dup"} ({s}/{n})'
        for k, s, n in (("pa", "project", "agents"), ("un", "user", "native"), ("ua", "user", "agents"))]
    assert [ln for ln in lines if "shadowed skill" in ln] == expected
    assert [w.shadowed_path for w in res.diagnostics.warnings] == [str(env.roots[k] / "dup") for k in ("pa", "un", "ua")]
    assert [c.path for c in res.shadowed["dup"]] == [env.roots[k] / "dup" for k in ("pa", "un", "ua")]


@pytest.mark.parametrize("present,winner", [
    (("pa", "un", "ua"), "pa"), (("un", "ua"), "un"), (("ua",), "ua"), (("pn", "ua"), "pn"),
    (("pa", "ua"), "pa"),
])
def test_priority_pairs(env, present, winner):
    for key in present:
        put(env.roots[key], "s", f"from {key}")
    res = resolve(env)
    assert res.skills["s"].description == f"from {winner}"
    assert len(res.diagnostics.warnings) == len(present) - 1


def test_winner_replaces_shadowed_copy_whole(env):
    put(env.roots["pn"], "s", "project copy")
    put(env.roots["un"], "s", "user copy", extra="allowed-tools: Bash\nlicense: MIT\nmetadata:\n  version: '9'\n")
    s = resolve(env).skills["s"]
    assert s.allowed_tools == [] and s.license is None and s.version == ""   # no field merging


def test_invalid_winner_does_not_fall_back(env):
    d = env.roots["pn"] / "s"
    d.mkdir(parents=True)
    (d / "SKILL.md").write_text("---\nname: s\n---\n")
    put(env.roots["un"], "s", "valid user copy")
    res = resolve(env)
    assert "s" not in res.skills and res.winners["s"].path == d
    assert res.diagnostics.skipped[0].reason == "missing description"
    with pytest.raises(SkillInvalid, match='skill "s" is not loaded: missing description'):
        res.require("s")
    with pytest.raises(SkillNotFound, match='skill "nope" not found'):
        res.require("nope")


def test_dot_dirs_files_and_missing_skill_md(env):
    root = env.roots["pn"]
    put(root, ".hidden")
    root.mkdir(parents=True, exist_ok=True)
    (root / "file.txt").write_text("not a skill")
    (root / "empty").mkdir()
    res = resolve(env)
    assert ".hidden" not in res.winners and "file.txt" not in res.winners
    assert res.winners["empty"].error == "missing SKILL.md"


def test_scope_filter_applies_before_shadowing(env):
    put(env.roots["pn"], "s", "project")
    put(env.roots["un"], "s", "user")
    user = resolve(env, scope="user")
    assert user.skills["s"].description == "user" and not user.diagnostics.warnings
    assert [p.scope for p in user.paths] == ["user", "user"]
    proj = resolve(env, scope="project")
    assert proj.skills["s"].description == "project" and len(proj.paths) == 2
    with pytest.raises(ValueError):
        resolve(env, scope="bogus")


def test_no_project_means_user_roots_only(env):
    put(env.roots["pn"], "p")
    put(env.roots["un"], "u")
    res = resolve_skills(None, env.cfg, home=env.home)
    assert list(res.skills) == ["u"] and len(res.paths) == 2 and res.trusted is None


def test_path_status(env):
    env.roots["pa"].mkdir(parents=True)
    env.roots["un"].mkdir(parents=True)
    (env.roots["un"] / ".hidden").mkdir()
    put(env.roots["ua"], "x")
    statuses = [p.status for p in skill_roots(env.project, env.cfg, home=env.home)]
    assert statuses == ["not-found", "existed-but-empty", "existed-but-empty", "existed-non-empty"]


def test_unreadable_root_status(env):
    """Root reads everything, so as root the check runs as `nobody` (setpriv)."""
    import shutil
    import subprocess
    import sys
    import tempfile

    if os.geteuid() != 0:
        env.roots["pn"].mkdir(parents=True)
        os.chmod(env.roots["pn"], 0)
        try:
            assert skill_roots(env.project, env.cfg, home=env.home)[0].status.startswith("unreadable")
        finally:
            os.chmod(env.roots["pn"], 0o755)
        return
    assert shutil.which("setpriv"), "setpriv (util-linux) is needed to drop root"
    base = Path(tempfile.mkdtemp(prefix="rnixfs-unreadable-"))
    try:
        os.chmod(base, 0o755)
        project, cfg, home = base / "proj", base / "cfg", base / "home"
        (project / ".rnix" / "skills").mkdir(parents=True)
        cfg.mkdir()
        home.mkdir()
        os.chmod(project / ".rnix" / "skills", 0)
        code = ("import sys; from pathlib import Path; from rnixfs.skills import skill_roots; "
                "print(skill_roots(Path(sys.argv[1]), Path(sys.argv[2]), home=Path(sys.argv[3]))[0].status)")
        res = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                              sys.executable, "-c", code, str(project), str(cfg), str(home)],
                             capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip().startswith("unreadable"), res.stdout
    finally:
        os.chmod(base / "proj" / ".rnix" / "skills", 0o755)
        shutil.rmtree(base)


def test_lenient_warnings_recorded_and_rendered(env):
    put(env.roots["pn"], "renamed", declared="old-name")
    lines = []
    res = resolve(env, warn=lines.append)
    assert "old-name" in res.skills and res.skills["old-name"].name == "renamed"
    assert res.winners["renamed"] is res.skills["old-name"]
    assert (f"[skill] warning: {env.roots['pn'] / 'renamed'}: name: name mismatch parent dir "
            f'(manifest.Name="old-name", parentDir="renamed")') in lines
    assert res.diagnostics.to_json()["lenient"][0]["field"] == "name"


def test_render_order_and_json_channels(env):
    put(env.roots["pn"], "dup")
    put(env.roots["un"], "dup")
    put(env.roots["pn"], "renamed", declared="x")
    (env.roots["pn"] / "bad").mkdir()
    (env.roots["pn"] / "bad" / "SKILL.md").write_text("no frontmatter")
    res = resolve(env)
    kinds = [ln.split(": ", 1)[1].split(" ")[0] for ln in res.warning_lines()]
    assert kinds[0] == "shadowed" and kinds[1] == "skipped" and kinds[-1] == "untrusted"
    j = res.to_json()
    assert set(j["diagnostics"]) == {"warnings", "skipped", "lenient", "trust"}
    assert j["diagnostics"]["skipped"] == [{"path": str(env.roots["pn"] / "bad"),
                                            "reason": "SKILL.md must start with ---"}]
    assert [s["name"] for s in j["skills"]] == ["dup", "x"]
    assert set(j["skills"][0]) == {"name", "directory", "version", "path", "description", "source", "scope",
                                   "namespace", "shadowed"}


def test_empty_diagnostics_is_empty_object(env):
    put(env.roots["un"], "u")
    assert resolve(env).to_json()["diagnostics"] == {}


# --- trust ----------------------------------------------------------------------------


def test_trust_warning_format(env):
    put(env.roots["pn"], "a")
    put(env.roots["pa"], "b")
    lines = []
    res = resolve(env, warn=lines.append)
    p = env.project
    assert res.trusted is False and res.skills["a"] and res.skills["b"]   # still loads
    assert lines[-1] == (
        f'[skill] warning: untrusted project "{p}": 2 skill root(s) will load \u2014 untrusted repo can '
        f"inject agent instructions. Policy: warn-only (not blocking). To dismiss this warning, run: "
        f"rnixfs trust {p}")
    t = res.diagnostics.to_json()["trust"][0]
    assert t == {"project_dir": str(p), "skills_root_paths": [str(env.roots["pn"]), str(env.roots["pa"])],
                 "reason": "untrusted repo can inject agent instructions",
                 "policy": "warn-only (not blocking)",
                 "recommendation": f"To dismiss this warning, run: rnixfs trust {p}"}


def test_trust_ascii_and_quoting(env, monkeypatch):
    monkeypatch.setenv("RNIXFS_ASCII", "1")
    odd = env.tmp / 'we"ird dir'
    put(odd / ".rnix" / "skills", "a")
    line = trust_line(check_trust(skill_roots(odd, env.cfg, home=env.home))[0])
    assert line.startswith('[skill] warning: untrusted project "' + str(env.tmp) + '/we\\"ird dir": 1 skill root(s) will load - ')
    # The command it recommends works when pasted: the path is shell-quoted.
    assert line.endswith("To dismiss this warning, run: rnixfs trust " + shlex.quote(str(odd)))


def test_trusted_marker_regular_file_only(env):
    put(env.roots["pn"], "a")
    state = env.project / ".rnix" / "state"
    state.mkdir(parents=True)
    target = env.tmp / "elsewhere"
    target.write_text("")
    os.symlink(target, state / "trusted")
    assert not is_trusted(env.project) and resolve(env).trusted is False
    (state / "trusted").unlink()
    (state / "trusted").mkdir()
    assert not is_trusted(env.project)
    (state / "trusted").rmdir()
    (state / "trusted").write_text("anything at all")
    assert is_trusted(env.project)
    res = resolve(env)
    assert res.trusted is True and not res.diagnostics.trust


def test_user_scope_never_warns(env):
    put(env.roots["un"], "u")
    put(env.roots["ua"], "v")
    assert resolve(env).diagnostics.trust == [] and resolve(env).trusted is None


# --- symlinks ---------------------------------------------------------------------------


def test_project_symlinks_may_not_leave_the_project(env):
    outside = put(env.tmp / "outside", "evil", "outside the project")
    env.roots["pn"].mkdir(parents=True)
    os.symlink(outside, env.roots["pn"] / "evil")
    inner = put(env.project / "vendor", "inner", "inside the project")
    os.symlink(inner, env.roots["pn"] / "inner")
    d = env.roots["pn"] / "mdlink"
    d.mkdir()
    os.symlink(outside / "SKILL.md", d / "SKILL.md")
    res = resolve(env)
    assert res.winners["evil"].error == "skill directory is a symlink that leaves the project"
    assert res.winners["mdlink"].error == "SKILL.md is a symlink that leaves the project"
    assert res.skills["inner"].description == "inside the project"


def test_project_root_symlink_leaving_the_project(env):
    outside = env.tmp / "outside-root"
    put(outside, "x")
    (env.project / ".rnix").mkdir()
    os.symlink(outside, env.roots["pn"])
    res = resolve(env)
    assert "x" not in res.winners
    assert "leaves the project" in res.diagnostics.skipped[0].reason


def test_user_scope_symlinks_are_followed_inside_their_scope(env):
    real = put(env.home / ".agents" / "store", "linked", "installed by symlink")
    env.roots["ua"].mkdir(parents=True)
    os.symlink(real, env.roots["ua"] / "linked")
    outside = put(env.tmp / "store", "far", "outside the user scope")
    os.symlink(outside, env.roots["ua"] / "far")
    res = resolve(env)
    assert res.skills["linked"].description == "installed by symlink"
    assert res.winners["far"].error == "skill directory is a symlink that leaves its scope"


def test_dangling_and_looping_symlinks_do_not_crash(env):
    env.roots["pn"].mkdir(parents=True)
    os.symlink(env.tmp / "missing", env.roots["pn"] / "dangling")
    os.symlink(env.roots["pn"] / "loop", env.roots["pn"] / "loop")
    res = resolve(env)
    assert "dangling" not in res.winners and "loop" not in res.winners


# --- ancestors ----------------------------------------------------------------------------


def test_ancestor_traversal(env):
    mono = env.tmp / "mono"
    pkg = mono / "packages" / "pkg"
    pkg.mkdir(parents=True)
    (mono / ".git").mkdir()
    put(mono / ".rnix" / "skills", "shared", "from the monorepo root")
    put(mono / "packages" / ".agents" / "skills", "mid", "from packages/")
    put(pkg / ".rnix" / "skills", "shared", "from the package")
    put(env.tmp / ".rnix" / "skills", "above-git", "above the repository")
    assert "mid" not in resolve_skills(pkg, env.cfg, home=env.home).winners      # off by default
    res = resolve_skills(pkg, env.cfg, home=env.home, ancestors=True)
    assert res.skills["shared"].description == "from the package"
    assert res.skills["mid"].description == "from packages/"
    assert res.shadowed["shared"][0].path == mono / ".rnix" / "skills" / "shared"
    assert "above-git" not in res.winners                                         # stops at .git
    assert [p.path for p in res.paths if p.ancestor] == [mono / "packages" / ".agents" / "skills",
                                                         mono / ".rnix" / "skills"]
    assert len(res.diagnostics.trust) == 3          # pkg, packages, mono: one warning each


def test_ancestor_limits(env):
    deep = env.tmp / "a" / "node_modules" / "b" / "c" / "d" / "e" / "f" / "g" / "h"
    deep.mkdir(parents=True)
    put(env.tmp / "a" / "node_modules" / ".rnix" / "skills", "nm", "in node_modules")
    put(env.tmp / "a" / "b-skip" / ".rnix" / "skills", "x")
    put(env.tmp / "a" / ".rnix" / "skills", "too-far", "eight levels up")
    put(deep.parent.parent / ".rnix" / "skills", "near", "two levels up")
    res = resolve_skills(deep, env.cfg, home=env.home, ancestors=True)
    assert "near" in res.skills
    assert "too-far" not in res.winners             # beyond 6 levels
    assert "nm" not in res.winners                  # node_modules level skipped


def test_ancestor_stops_at_home_and_project_git(env):
    put(env.home / ".rnix" / "skills", "home-level")
    proj = env.home / "work" / "proj"
    proj.mkdir(parents=True)
    assert "home-level" not in resolve_skills(proj, env.cfg, home=env.home, ancestors=True).winners
    put(env.home / "work" / ".rnix" / "skills", "work-level")
    assert "work-level" in resolve_skills(proj, env.cfg, home=env.home, ancestors=True).winners
    (proj / ".git").write_text("gitdir: elsewhere\n")   # a worktree: the project is the repo root
    assert "work-level" not in resolve_skills(proj, env.cfg, home=env.home, ancestors=True).winners


def test_ancestor_truncation_warning(env):
    deep = env.tmp / "x" / "y" / "z"
    deep.mkdir(parents=True)
    put(env.tmp / "x" / ".rnix" / "skills", "far")
    lines = []
    res = resolve_skills(deep, env.cfg, home=env.home, ancestors=True, max_dirs=6, warn=lines.append)
    assert res.truncated
    assert lines[0] == ("[skillscope] resolve_skills truncated: scanned 6 dirs, returning partial "
                        "results. Pass max_dirs=... to override.")
    assert "far" not in res.winners


# --- describe, helpers -----------------------------------------------------------------------


def test_describe_for_xattrs(env):
    put(env.roots["pn"], "s", extra="metadata:\n  version: '3.1'\n")
    put(env.roots["ua"], "s")
    d = resolve(env).describe("s")
    assert d["scope"] == "project" and d["namespace"] == "native" and d["version"] == "3.1"
    assert d["path"] == str(env.roots["pn"] / "s") and d["trust"] == "untrusted"
    assert d["shadowed"] == [{"path": str(env.roots["ua"] / "s"), "scope": "user", "namespace": "agents"}]
    assert d["diagnostics"] == [] and resolve(env).describe("nope") is None
    json.dumps(d)


def test_write_scope_and_find_project(env):
    assert write_scope(env.project, env.cfg).path == env.project / ".rnix" / "skills"
    assert write_scope(None, env.cfg).path == env.cfg / "skills"
    assert write_scope(env.project, env.cfg, "agents").path == env.project / ".rnix" / "agents"
    with pytest.raises(ValueError):
        write_scope(None, env.cfg, "../etc")
    sub = env.project / "a" / "b"
    sub.mkdir(parents=True)
    assert find_project(sub, home=env.home) is None
    (env.project / ".rnix").mkdir()
    assert find_project(sub, home=env.home) == env.project
    (env.home / ".rnix").mkdir()
    inside_home = env.home / "x"
    inside_home.mkdir()
    assert find_project(inside_home, home=env.home) == env.home


def test_concurrent_resolution_while_skills_churn(env):
    """Skills created and deleted underneath never crash a resolution."""
    import shutil

    stop = threading.Event()
    errors = []

    def churn():
        i = 0
        while not stop.is_set():
            d = put(env.roots["pn"], f"c{i % 5}")
            shutil.rmtree(d, ignore_errors=True)
            i += 1

    t = threading.Thread(target=churn)
    t.start()
    try:
        for _ in range(100):
            try:
                resolve(env)
            except Exception as exc:  # pragma: no cover - the assertion reports it
                errors.append(exc)
    finally:
        stop.set()
        t.join()
    assert errors == []


def test_many_skills_are_capped(env, monkeypatch):
    import rnixfs.skills.resolve as resolve_mod

    monkeypatch.setattr(resolve_mod, "MAX_SKILLS_PER_ROOT", 3)
    for i in range(5):
        put(env.roots["un"], f"s{i}")
    res = resolve(env)
    assert list(res.winners) == ["s0", "s1", "s2"]
    assert "only the first 3" in res.warning_lines()[0]


# --- built-ins ------------------------------------------------------------------------------


@pytest.fixture
def builtins_on(monkeypatch):
    monkeypatch.delenv("RNIXFS_NO_BUILTINS", raising=False)


def test_builtins_extracted_once_and_marked(env, builtins_on):
    assert sorted(ensure_builtins(env.cfg)) == ["agents/code-analyst", "skills/code-analysis"]
    assert ensure_builtins(env.cfg) == []
    res = resolve(env)
    assert res.skills["code-analysis"].source == "builtin"
    assert res.skills["code-analysis"].allowed_tools == ["Read", "Glob", "Grep", "Bash"]
    marker = json.loads((env.cfg / MARKER).read_text())
    assert marker["items"]["skills/code-analysis"]["state"] == "extracted"


def test_builtins_never_overwrite_user_edits(env, builtins_on, monkeypatch):
    ensure_builtins(env.cfg)
    md = env.cfg / "skills" / "code-analysis" / "SKILL.md"
    md.write_text(md.read_text().replace("# Code analysis", "# My own analysis"))
    import rnixfs.skills.builtins as builtins_mod

    real = packaged()
    newer = {k: dict(v) for k, v in real.items()}
    newer["skills/code-analysis"]["SKILL.md"] += b"\nNew upstream section.\n"
    newer["agents/code-analyst"]["instructions.md"] += b"\nNew upstream rule.\n"
    monkeypatch.setattr(builtins_mod, "packaged", lambda: newer)
    assert ensure_builtins(env.cfg) == ["agents/code-analyst"]      # unedited agent upgraded
    assert "# My own analysis" in md.read_text()                     # edited skill left alone
    assert "New upstream rule." in (env.cfg / "agents" / "code-analyst" / "instructions.md").read_text()


def test_builtins_deleted_stay_deleted_and_foreign_untouched(env, builtins_on):
    mine = put(env.roots["un"], "code-analysis", "my own skill of that name")
    ensure_builtins(env.cfg)
    assert "my own skill" in (mine / "SKILL.md").read_text()
    assert resolve(env).skills["code-analysis"].source == ""
    import shutil

    shutil.rmtree(env.cfg / "agents" / "code-analyst")
    assert ensure_builtins(env.cfg) == []
    assert not (env.cfg / "agents" / "code-analyst").exists()


def test_builtins_disabled_and_unwritable(env, monkeypatch, tmp_path):
    monkeypatch.setenv("RNIXFS_NO_BUILTINS", "1")
    assert ensure_builtins(env.cfg) == [] and not env.cfg.exists()
    monkeypatch.delenv("RNIXFS_NO_BUILTINS")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert ensure_builtins(blocker / "cfg") == []


def test_builtins_concurrent_extraction(env, builtins_on):
    results = []
    threads = [threading.Thread(target=lambda: results.append(ensure_builtins(env.cfg))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(x for r in results for x in r) == ["agents/code-analyst", "skills/code-analysis"]
    assert not [p for p in (env.cfg / "skills").iterdir() if p.name.startswith(".")]


# --- reference names (the frontmatter name) -------------------------------------------------


def test_lookup_by_frontmatter_name_then_directory(env):
    put(env.roots["pn"], "dir-a", declared="alpha")
    put(env.roots["pn"], "beta", declared="gamma")       # a directory named like another skill
    put(env.roots["un"], "gamma-dir", declared="beta")
    res = resolve(env)
    assert sorted(res.skills) == ["alpha", "beta", "gamma"]
    assert res.lookup("alpha").name == "dir-a" and res.require("alpha") is res.winners["dir-a"]
    assert res.lookup("beta").name == "gamma-dir"        # the frontmatter name wins over a directory
    assert res.lookup("dir-a").name == "dir-a"           # a directory name is the fallback
    assert res.lookup("nope") is None and res.get("nope") is None
    for bad in ("", "  ", None, "../x"):
        assert res.lookup(bad) is None
    assert res.describe("alpha")["directory"] == "dir-a" and res.describe("alpha")["name"] == "alpha"
    assert res.describe_dir("beta")["name"] == "gamma"   # the mount tree asks by directory


def test_one_name_declared_by_two_directories(env):
    put(env.roots["un"], "zz-first", declared="same", description="user copy")
    put(env.roots["pa"], "b-other", declared="same", description="project copy, other dir")
    put(env.roots["pa"], "same", description="project copy, matching dir")
    res = resolve(env)
    assert res.skills["same"].description == "project copy, matching dir"   # scope, then dir == name
    shadows = [(w.skill_name, w.shadowed_path) for w in res.diagnostics.warnings]
    assert ("same", str(env.roots["pa"] / "b-other")) in shadows
    assert ("same", str(env.roots["un"] / "zz-first")) in shadows
    assert set(res.winners) == {"zz-first", "b-other", "same"}            # the tree still has all three


def test_broken_copy_keeps_its_directory_name(env):
    (env.roots["pn"] / "broken").mkdir(parents=True)
    (env.roots["pn"] / "broken" / "SKILL.md").write_text("---\nname: broken\n---\n")
    put(env.roots["un"], "other", declared="broken")     # may not stand in for the broken project copy
    res = resolve(env)
    assert res.lookup("broken").path == env.roots["pn"] / "broken"
    assert res.get("broken") is None and "broken" not in res.skills
    with pytest.raises(SkillInvalid):
        res.require("broken")


def test_nfd_directory_and_nfc_name(env):
    import unicodedata

    nfc, nfd = (unicodedata.normalize(f, "naïve-café") for f in ("NFC", "NFD"))
    put(env.roots["pn"], nfd, declared=nfc)
    res = resolve(env)
    assert not res.diagnostics.lenient and list(res.skills) == [nfc]
    assert res.lookup(nfd) is res.lookup(nfc) is res.winners[nfd]
    assert validate_strict(env.roots["pn"] / nfd) == []


def test_agent_skills_resolve_by_frontmatter_name(env):
    from rnixfs.agents.prompt import select_skills

    put(env.roots["pn"], "dir-a", declared="alpha")
    put(env.roots["pn"], "b")
    loaded, available = select_skills(None, resolve(env), ["alpha"])
    assert [s.ref_name for s in loaded] == ["alpha"] and [s.ref_name for s in available] == ["b"]
    with pytest.raises(SkillNotFound):
        select_skills(None, resolve(env), ["alpha-typo"])


def test_one_skill_by_two_names_is_loaded_once(env):
    from rnixfs.agents.prompt import select_skills

    put(env.roots["pn"], "dir-a", declared="alpha")
    put(env.roots["pn"], "b")
    loaded, available = select_skills(None, resolve(env), ["alpha", "dir-a"])
    assert [s.name for s in loaded] == ["dir-a"] and [s.name for s in available] == ["b"]


# --- caching ----------------------------------------------------------------------------


def test_cache_parses_only_what_changed(env):
    from rnixfs.skills.resolve import SkillCache, update_names

    for i in range(20):
        put(env.roots["un"], f"s{i:02d}", f"skill {i}")
    cache = SkillCache()
    res = resolve(env, cache=cache)
    assert cache.parses == 20 and len(res.skills) == 20
    res = resolve(env, cache=cache)
    assert cache.parses == 20                       # nothing changed: nothing parsed
    put(env.roots["un"], "s03", "edited", extra="license: MIT\n")
    res = resolve(env, cache=cache)
    assert cache.parses == 21 and res.skills["s03"].description == "edited"
    # one name re-resolved: a new project copy shadows the user copy
    put(env.roots["pn"], "s05", "project copy")
    new = update_names(res, ["s05", "fresh"], cache=cache)
    assert cache.parses == 22
    assert new.skills["s05"].scope == "project" and [s.scope for s in new.shadowed["s05"]] == ["user"]
    assert res.skills["s05"].scope == "user"        # the old resolution is left as it was
    assert "fresh" not in new.winners
    assert [w.skill_name for w in new.diagnostics.warnings] == ["s05"]
    assert new.diagnostics.trust                    # a project root now exists, untrusted
    shutil.rmtree(env.roots["un"] / "s07")
    assert "s07" not in update_names(new, ["s07"], cache=cache).winners
