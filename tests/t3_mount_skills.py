"""Tier 3: skills/ and agents/ as real files in a real mount."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.mountutil import needs_fuse, sh, wait_for

# hostile or untrusted project content: the daemon warns, as it should
pytestmark = [needs_fuse, pytest.mark.mount, pytest.mark.expect_log('untrusted project', 'refused: ')]

GOOD = """---
name: {name}
description: {desc}
allowed-tools: {tools}
metadata:
  version: "{version}"
---
# {name}

Body of {name}.
"""


def write_skill(root, name, desc="a skill", tools="Read", version="1.0"):
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "SKILL.md").write_text(GOOD.format(name=name, desc=desc, tools=tools, version=version))
    return d


def xattrs(path) -> dict:
    return {k: os.getxattr(path, k).decode() for k in os.listxattr(path)}


def run(m, script: str, **kw):
    return sh(script, env={**os.environ, "M": str(m.path)}, **kw)


def test_builtins_are_real_files_with_provenance(mnt):
    names = sorted(os.listdir(mnt.p("skills")))
    assert "code-analysis" in names and "code-analyst" in os.listdir(mnt.p("agents"))
    text = open(mnt.p("skills/code-analysis/SKILL.md")).read()
    assert text == (mnt.config_dir / "skills/code-analysis/SKILL.md").read_text()
    x = xattrs(mnt.p("skills/code-analysis"))
    assert x["user.rnix.scope"] == "user" and x["user.rnix.source"] == "builtin"
    assert x["user.rnix.valid"] == "true" and x["user.rnix.version"] == "1.0"
    res = run(mnt, 'getfattr -d "$M/skills/code-analysis"')
    if shutil.which("getfattr"):
        assert 'user.rnix.scope="user"' in res.stdout


@pytest.mark.expect_log('shadowed skill', 'skipped skill', 'untrusted project')
def test_project_copy_shadows_user_copy_whole(mnt):
    user = write_skill(mnt.config_dir / "skills", "shared", desc="user copy", version="1")
    (user / "extra.txt").write_text("only in the user copy")
    write_skill(mnt.project / ".rnix/skills", "shared", desc="project copy", version="2")
    wait_for(lambda: "shared" in os.listdir(mnt.p("skills")), 10, what="skill to appear")
    wait_for(lambda: "project copy" in open(mnt.p("skills/shared/SKILL.md")).read(), 10,
             what="the project copy to win")
    assert sorted(os.listdir(mnt.p("skills/shared"))) == ["SKILL.md"]  # the winner replaces, no merge
    x = xattrs(mnt.p("skills/shared"))
    assert x["user.rnix.scope"] == "project" and x["user.rnix.version"] == "2"
    assert str(user) in x["user.rnix.shadowed"] and x["user.rnix.trust"] == "untrusted"
    (mnt.project / ".rnix/state").mkdir(parents=True)
    (mnt.project / ".rnix/state/trusted").write_text("")
    wait_for(lambda: xattrs(mnt.p("skills/shared"))["user.rnix.trust"] == "trusted", 10, what="trust")
    assert "shadow" in mnt.log().lower()


def test_create_through_the_mount_writes_into_the_project(mnt):
    res = run(mnt, 'mkdir "$M/skills/fresh" && cat > "$M/skills/fresh/SKILL.md" <<EOF\n'
                   '---\nname: fresh\ndescription: made through the mount\nallowed-tools: Grep\n---\nBody\nEOF')
    assert res.returncode == 0, res.stderr
    real = mnt.project / ".rnix/skills/fresh/SKILL.md"
    assert real.read_text().startswith("---\nname: fresh")
    assert xattrs(mnt.p("skills/fresh"))["user.rnix.valid"] == "true"
    pid = mnt.spawn(json.dumps({"intent": "x", "skills": ["fresh"]}))
    assert mnt.wait(pid).startswith("exited(0)")
    assert mnt.status(pid)["allowed_tools"] == ["Grep", "Skill"]  # Skill: a catalog is shown


@pytest.mark.expect_log('skipped skill', 'untrusted project')
def test_invalid_skill_md_is_kept_and_explained(mnt):
    res = run(mnt, 'mkdir "$M/skills/broken" && printf -- "---\\nname: broken\\n" > "$M/skills/broken/SKILL.md"')
    assert res.returncode == 0, res.stderr
    assert (mnt.project / ".rnix/skills/broken/SKILL.md").read_bytes() == b"---\nname: broken\n"
    assert open(mnt.p("skills/broken/SKILL.md")).read() == "---\nname: broken\n"
    x = xattrs(mnt.p("skills/broken"))
    assert x["user.rnix.valid"] == "false"
    assert "SKILL.md missing closing ---" in x["user.rnix.diagnostics"]
    res = run(mnt, """echo '{"intent": "x", "skills": ["broken"]}' > "$M/proc/new" """)
    assert res.returncode != 0 and "Invalid argument" in res.stderr
    # fixing it through the mount makes it load
    run(mnt, 'printf -- "---\\nname: broken\\ndescription: fixed\\n---\\n" > "$M/skills/broken/SKILL.md"', check=True)
    wait_for(lambda: xattrs(mnt.p("skills/broken"))["user.rnix.valid"] == "true", 10, what="fix")


@pytest.mark.expect_log('name mismatch', 'skipped skill', 'untrusted project')
def test_rename_and_delete_act_on_real_files(mnt):
    write_skill(mnt.project / ".rnix/skills", "old-name")
    wait_for(lambda: "old-name" in os.listdir(mnt.p("skills")), 10, what="skill")
    res = run(mnt, 'mv "$M/skills/old-name" "$M/skills/new-name"')
    assert res.returncode == 0, res.stderr
    assert (mnt.project / ".rnix/skills/new-name/SKILL.md").exists()
    assert not (mnt.project / ".rnix/skills/old-name").exists()
    res = run(mnt, 'rm -r "$M/skills/new-name"')
    assert res.returncode == 0, res.stderr
    assert not (mnt.project / ".rnix/skills/new-name").exists()
    wait_for(lambda: "new-name" not in os.listdir(mnt.p("skills")), 10, what="gone")


def test_disk_changes_show_up(mnt):
    write_skill(mnt.config_dir / "skills", "ondisk")
    wait_for(lambda: "ondisk" in os.listdir(mnt.p("skills")), 10, what="new skill on disk")
    shutil.rmtree(mnt.config_dir / "skills/ondisk")
    wait_for(lambda: "ondisk" not in os.listdir(mnt.p("skills")), 10, what="removed on disk")


def test_spawning_an_agent_records_its_tools(mnt):
    pid = mnt.spawn('{"agent": "code-analyst", "intent": "review"}')
    assert mnt.wait(pid).startswith("exited(0)")
    st = mnt.status(pid)
    assert st["agent"] == "code-analyst" and st["skills"] == ["code-analysis"]
    assert st["allowed_tools"] == ["Bash", "Glob", "Grep", "Read"]
    assert st["budget"]["max_steps"] == 20
    system = json.loads(open(mnt.p(f"proc/{pid}/context")).readline())
    assert system["role"] == "system" and "Code analysis" in system["content"]


def test_agent_written_through_the_mount(mnt):
    res = run(mnt, 'mkdir "$M/agents/helper" && printf "name: helper\\ndescription: helps\\nmax_steps: 3\\n" '
                   '> "$M/agents/helper/agent.yaml" && echo "Be brief." > "$M/agents/helper/instructions.md"')
    assert res.returncode == 0, res.stderr
    assert (mnt.project / ".rnix/agents/helper/agent.yaml").exists()
    pid = wait_for(lambda: _try_spawn(mnt, '{"agent": "helper", "intent": "hi"}'), 10, what="agent")
    assert mnt.wait(pid).startswith("exited(0)")
    assert mnt.status(pid)["budget"]["max_steps"] == 3
    assert "Be brief." in open(mnt.p(f"proc/{pid}/context")).readline()


def _try_spawn(m, req):
    try:
        return m.spawn(req)
    except AssertionError:
        return None


@pytest.mark.parametrize("cmd,err", [
    ('mkdir "$M/skills/Bad_Name"', "Invalid argument"),
    ('mkdir "$M/skills/code-analysis"', "File exists"),
    ('touch "$M/skills/loose-file"', "Permission denied"),
    ('mkdir "$M/skills/-dash"', "Invalid argument"),
    ('mkdir "$M/agents/../proc/x"', "Permission denied"),
    ('ln -s /etc "$M/skills/link"', "Permission denied"),
    # rename(2) across the trees is EXDEV (mv would fall back to copy + delete)
    ('python3 -c "import os,sys; os.rename(sys.argv[1], sys.argv[2])" "$M/skills/code-analysis" "$M/agents/x"',
     "Invalid cross-device link"),
])
def test_bad_tree_changes(mnt, cmd, err):
    before = sorted(os.listdir(mnt.p("skills")))
    res = run(mnt, cmd)
    assert res.returncode != 0 and err in res.stderr, res.stderr
    assert sorted(os.listdir(mnt.p("skills"))) == before and mnt.daemon_alive()


@pytest.mark.expect_log('refused', 'skipped skill', 'untrusted project')
def test_parallel_skill_creation(mnt):
    res = run(mnt, 'for i in $(seq 1 10); do (mkdir "$M/skills/p$i" && printf -- "---\\nname: p$i\\n'
                   'description: d\\n---\\n" > "$M/skills/p$i/SKILL.md") & done; wait')
    assert res.returncode == 0, res.stderr
    names = set(os.listdir(mnt.p("skills")))
    assert {f"p{i}" for i in range(1, 11)} <= names
    assert all(xattrs(mnt.p(f"skills/p{i}"))["user.rnix.valid"] == "true" for i in range(1, 11))


def test_a_symlink_swapped_in_below_a_skill_cannot_lead_out(mnt, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("outside secret\n")
    skill = write_skill(mnt.project / ".rnix/skills", "swapped")
    (skill / "sub").mkdir()
    (skill / "sub" / "secret").write_text("inside\n")
    wait_for(lambda: "swapped" in os.listdir(mnt.p("skills")), 10, what="skill")
    assert open(mnt.p("skills/swapped/sub/secret")).read() == "inside\n"
    os.rename(skill / "sub", skill / "old-sub")
    os.symlink(outside, skill / "sub")
    res = run(mnt, 'cat "$M/skills/swapped/sub/secret"; echo planted > "$M/skills/swapped/sub/planted"')
    assert "outside secret" not in res.stdout
    assert not (outside / "planted").exists()
    assert res.returncode != 0 and mnt.daemon_alive()


def _resolver(m) -> dict:
    return json.loads(os.getxattr(m.p("skills"), "user.rnix.resolver"))


@pytest.mark.expect_log('skipped skill', 'untrusted project')
def test_writes_re_resolve_only_what_they_touch(mnt, tmp_path):
    """cp -r of a 30-file skill among 150 installed ones parses its SKILL.md,
    not the others' (docs/skills.md, "Caching")."""
    for i in range(150):
        write_skill(mnt.config_dir / "skills", f"installed-{i:03d}")
    wait_for(lambda: "installed-149" in os.listdir(mnt.p("skills")), 10, what="installed skills")
    src = tmp_path / "src" / "copied"
    (src / "references").mkdir(parents=True)
    write_skill(src.parent, "copied")
    for i in range(28):
        (src / "references" / f"r{i}.md").write_text(f"reference {i}\n")
    os.symlink("references/r0.md", src / "main.md")
    before = _resolver(mnt)
    run(mnt, f'cp -r "{src}" "$M/skills/"', check=True)
    after = _resolver(mnt)
    assert after["parses"] - before["parses"] <= 4 + 2 * (after["sweeps"] - before["sweeps"])
    assert after["updates"] - before["updates"] <= 6
    assert xattrs(mnt.p("skills/copied"))["user.rnix.valid"] == "true"
    assert open(mnt.p("skills/copied/main.md")).read() == "reference 0\n"
    # an edit on disk is still seen by the poll, and parses only that skill
    (mnt.config_dir / "skills/installed-007/SKILL.md").write_text(
        GOOD.format(name="installed-007", desc="edited on disk", tools="Read", version="7"))
    wait_for(lambda: xattrs(mnt.p("skills/installed-007"))["user.rnix.version"] == "7", 10,
             what="the edit on disk")
    assert _resolver(mnt)["parses"] - after["parses"] <= 3
