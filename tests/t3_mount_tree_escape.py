"""Hostile: nothing under skills/ or agents/ reads, writes or deletes outside
its scope root, whatever symlinks the tree holds or swaps in
(docs/skills.md, "Symlinks in skills/ and agents/")."""
from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from tests.mountutil import needs_fuse, sh, wait_for
from tests.swaputil import stop_swapping, swap_forever

# hostile or untrusted project content: the daemon warns, as it should
pytestmark = [needs_fuse, pytest.mark.mount, pytest.mark.expect_log('untrusted project', 'refused: ', '\\[skill\\] warning')]

SKILL = "---\nname: {name}\ndescription: {desc}\n---\n{body}\n"


def run(m, script, **kw):
    return sh(script, env={**os.environ, "M": str(m.path)}, **kw)


def skill(root, name, desc="a skill", body="Body."):
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "SKILL.md").write_text(SKILL.format(name=name, desc=desc, body=body))
    return d


def tree(path) -> dict[str, bytes]:
    """Every file below ``path`` with its bytes (symlinks as their text)."""
    out = {}
    for dirpath, dirs, files in os.walk(path):
        for n in dirs + files:
            p = os.path.join(dirpath, n)
            if os.path.islink(p):
                out[os.path.relpath(p, path)] = b"-> " + os.fsencode(os.readlink(p))
            elif os.path.isfile(p):
                with open(p, "rb") as f:
                    out[os.path.relpath(p, path)] = f.read()
    return out


@pytest.fixture
def outside(tmp_path):
    d = tmp_path / "elsewhere"
    skill(tmp_path, "elsewhere", desc="outside", body="OUTSIDE-SECRET-BODY")
    (d / "secret.txt").write_text("OUTSIDE-SECRET\n")
    os.chmod(d / "secret.txt", 0o600)
    (d / "sub").mkdir()
    (d / "sub" / "deep.txt").write_text("OUTSIDE-DEEP\n")
    return d


def listed(m, tree_name, name):
    return wait_for(lambda: name in os.listdir(m.p(tree_name)), 10, what=f"{tree_name}/{name}")


@pytest.mark.parametrize("scope", ["project", "user"])
def test_a_skill_symlinked_out_of_its_scope_is_sealed(mnt, outside, scope):
    root = (mnt.project / ".rnix/skills") if scope == "project" else (mnt.config_dir / "skills")
    root.mkdir(parents=True, exist_ok=True)
    os.symlink(outside, root / "esc")
    before = tree(outside)
    listed(mnt, "skills", "esc")
    res = run(mnt, 'echo x > "$M/skills/esc/pwn.txt"')
    assert res.returncode != 0 and "Permission denied" in res.stderr, res.stderr
    res = run(mnt, 'mkdir "$M/skills/esc/newdir"; touch "$M/skills/esc/sub/t"; '
                   'ln -s x "$M/skills/esc/l"; mv "$M/skills/esc/secret.txt" "$M/skills/esc/s2"')
    assert res.returncode != 0
    for cmd in ('cat "$M/skills/esc/secret.txt"', 'cat "$M/skills/esc/SKILL.md"',
                'ls "$M/skills/esc/"', 'cat "$M/skills/esc/sub/deep.txt"',
                'readlink "$M/skills/esc"'):
        res = run(mnt, cmd)
        assert res.returncode != 0, cmd
        assert "OUTSIDE" not in res.stdout and "elsewhere" not in res.stdout, cmd
    x = {k: os.getxattr(mnt.p("skills/esc"), k).decode() for k in os.listxattr(mnt.p("skills/esc"))}
    assert x["user.rnix.valid"] == "false" and "leaves" in x["user.rnix.diagnostics"]
    assert tree(outside) == before
    # rm -r removes the link, never what it points to
    res = run(mnt, 'rm -r "$M/skills/esc"')
    assert res.returncode == 0, res.stderr
    assert not os.path.lexists(root / "esc") and tree(outside) == before
    assert "refused" in mnt.log() and mnt.daemon_alive()


@pytest.mark.expect_log('refused')
def test_an_agent_symlinked_to_the_root_reads_nothing(mnt):
    base = mnt.project / ".rnix/agents"
    base.mkdir(parents=True)
    os.symlink("/", base / "rootfs")
    listed(mnt, "agents", "rootfs")
    for cmd in ('cat "$M/agents/rootfs/etc/shadow"', 'cat "$M/agents/rootfs/etc/hostname"',
                'ls "$M/agents/rootfs/"', 'ls "$M/agents/rootfs/etc"'):
        res = run(mnt, cmd)
        assert res.returncode != 0 and res.stdout == "", cmd
    res = run(mnt, 'echo x > "$M/agents/rootfs/tmp/rnix-pwn-$$"; echo $$')
    assert res.returncode == 0  # echo $$ ran; the write itself failed:
    assert not os.path.exists(f"/tmp/rnix-pwn-{res.stdout.strip()}")
    res = run(mnt, """echo '{"agent": "rootfs", "intent": "x"}' > "$M/proc/new" """)
    assert res.returncode != 0
    res = run(mnt, 'rm -r "$M/agents/rootfs"')
    assert res.returncode == 0, res.stderr
    assert not os.path.lexists(base / "rootfs") and os.path.exists("/etc/hostname")


@pytest.mark.expect_log('refused', 'skipped skill', 'untrusted project')
def test_symlink_chains_are_followed_only_while_inside(mnt, outside):
    p = mnt.project
    root = p / ".rnix/skills"
    root.mkdir(parents=True)
    (p / "hop2").symlink_to(outside)               # project/hop2 -> outside
    (p / "hop1").symlink_to("hop2")                # project/hop1 -> hop2
    os.symlink("../../hop1", root / "chain")       # .rnix/skills/chain -> ../../hop1
    real = skill(p / "vendor", "inner", body="INSIDE-BODY")
    (p / "via").symlink_to("vendor")
    os.symlink("../../via/inner", root / "inner")  # in-scope chain
    listed(mnt, "skills", "inner")
    assert "INSIDE-BODY" in open(mnt.p("skills/inner/SKILL.md")).read()
    res = run(mnt, 'cat "$M/skills/chain/secret.txt"; echo x > "$M/skills/chain/pwn"')
    assert res.returncode != 0 and "OUTSIDE" not in res.stdout
    assert not (outside / "pwn").exists()
    # an in-scope alias shows its target, but rm -r never deletes through it
    run(mnt, 'rm -r "$M/skills/inner"')
    assert (real / "SKILL.md").is_file()


@pytest.mark.expect_log('name mismatch', 'refused', 'shadowed skill', 'untrusted project')
def test_links_inside_the_scope_are_followed_and_shown(mnt, outside):
    root = mnt.project / ".rnix/skills"
    shared = skill(root, "shared", desc="shared", body="SHARED-BODY")
    d = root / "linked"
    (d / "docs").mkdir(parents=True)
    (d / "docs" / "guide.md").write_text("GUIDE\n")
    os.symlink("../shared/SKILL.md", d / "SKILL.md")        # another skill, same scope
    os.symlink("docs/guide.md", d / "guide.md")              # inside the skill: a link
    os.symlink("docs", d / "latest")
    os.symlink(str(outside / "secret.txt"), d / "leak.txt")  # absolute, leads out
    os.symlink("../../../../elsewhere/secret.txt", d / "leak2.txt")
    os.symlink("missing/nowhere", d / "dangling")
    listed(mnt, "skills", "linked")
    assert open(mnt.p("skills/linked/SKILL.md")).read() == (shared / "SKILL.md").read_text()
    assert os.path.isfile(mnt.p("skills/linked/SKILL.md"))   # shown as what it points to
    assert os.readlink(mnt.p("skills/linked/guide.md")) == "docs/guide.md"
    assert open(mnt.p("skills/linked/guide.md")).read() == "GUIDE\n"
    assert open(mnt.p("skills/linked/latest/guide.md")).read() == "GUIDE\n"
    assert os.readlink(mnt.p("skills/linked/dangling")) == "missing/nowhere"
    for leak in ("leak.txt", "leak2.txt"):
        res = run(mnt, f'cat "$M/skills/linked/{leak}"; readlink "$M/skills/linked/{leak}"')
        assert res.returncode != 0 and "OUTSIDE" not in res.stdout and "elsewhere" not in res.stdout
    x = {k: os.getxattr(mnt.p("skills/linked"), k).decode() for k in os.listxattr(mnt.p("skills/linked"))}
    assert x["user.rnix.valid"] == "true"
    # rm of a link removes the link only
    run(mnt, 'rm "$M/skills/linked/leak.txt" "$M/skills/linked/latest" "$M/skills/linked/SKILL.md"', check=True)
    assert not os.path.lexists(d / "leak.txt") and (outside / "secret.txt").exists()
    assert not os.path.lexists(d / "latest") and (d / "docs" / "guide.md").exists()
    assert (shared / "SKILL.md").exists()


@pytest.mark.expect_log('refused', 'skipped skill', 'untrusted project')
def test_cp_r_of_a_skill_with_relative_symlinks(mnt, tmp_path):
    src = tmp_path / "src" / "carrier"
    (src / "references").mkdir(parents=True)
    (src / "references" / "api.md").write_text("API\n")
    (src / "SKILL.md").write_text(SKILL.format(name="carrier", desc="d", body="B"))
    os.symlink("references/api.md", src / "api.md")
    os.symlink("references", src / "refs")
    os.symlink("SKILL.md", src / "references" / "skill-link")   # dangling from there: inside anyway
    res = run(mnt, f'cp -r "{src}" "$M/skills/"')
    assert res.returncode == 0, res.stderr
    dst = mnt.project / ".rnix/skills/carrier"
    assert os.readlink(dst / "api.md") == "references/api.md"
    assert os.readlink(dst / "refs") == "references"
    assert os.readlink(dst / "references" / "skill-link") == "SKILL.md"
    assert open(mnt.p("skills/carrier/api.md")).read() == "API\n"
    assert sorted(os.listdir(mnt.p("skills/carrier/refs"))) == ["api.md", "skill-link"]


@pytest.mark.parametrize("target", ["/etc/passwd", "../../../../../../etc", "../../../..", "/"])
@pytest.mark.expect_log('refused', 'untrusted project')
def test_symlinks_leading_out_cannot_be_created(mnt, target):
    skill(mnt.project / ".rnix/skills", "host")
    listed(mnt, "skills", "host")
    res = run(mnt, f'ln -s "{target}" "$M/skills/host/evil"')
    assert res.returncode != 0 and "Permission denied" in res.stderr
    assert not os.path.lexists(mnt.project / ".rnix/skills/host/evil")
    assert "refused" in mnt.log()


@pytest.mark.expect_log('refused', 'refused to create', 'skipped skill', 'untrusted project')
def test_mkdir_through_a_skills_root_leading_out(mnt, tmp_path):
    """`.rnix/skills` itself a symlink out of the project: mkdir creates nothing there."""
    far = tmp_path / "far"
    far.mkdir()
    (mnt.project / ".rnix").mkdir()
    os.symlink(far, mnt.project / ".rnix/skills")
    res = run(mnt, 'mkdir "$M/skills/newone"')
    assert res.returncode != 0
    assert os.listdir(far) == []


@pytest.mark.parametrize("roots", [(".rnix/skills", ".rnix/agents"), (".agents/skills", ".rnix/agents")])
def test_scope_roots_symlinked_out_read_and_delete_nothing(mnt, tmp_path, roots):
    """The skills/ and agents/ roots themselves symlinks out of the project:
    nothing outside is listed, read, spawned from or deleted through the mount."""
    far = tmp_path / "far"
    skill(far / "skills", "farskill", desc="outside", body="OUTSIDE-SKILL-BODY")
    (far / "skills/farskill/secret.txt").write_text("OUTSIDE-SECRET\n")
    (far / "agents/faragent").mkdir(parents=True)
    (far / "agents/faragent/agent.yaml").write_text("name: faragent\ndescription: x\ntools: [Bash]\n")
    (far / "agents/faragent/instructions.md").write_text("OUTSIDE-PROMPT\n")
    for root, target in zip(roots, ("skills", "agents")):
        (mnt.project / root).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(far / target, mnt.project / root)
    before = tree(far)
    time.sleep(1)  # give a rescan the chance to (wrongly) pick them up
    for cmd in ('ls -a "$M/skills/" "$M/agents/"', 'cat "$M/skills/farskill/SKILL.md"',
                'cat "$M/skills/farskill/secret.txt"', 'ls "$M/skills/farskill"',
                'cat "$M/agents/faragent/agent.yaml" "$M/agents/faragent/instructions.md"',
                'cat "$M/skills/skills/farskill/SKILL.md" "$M/agents/agents/faragent/agent.yaml"',
                'find "$M/skills/" "$M/agents/"', 'grep -r OUTSIDE "$M/skills/" "$M/agents/"'):
        res = run(mnt, cmd)
        assert "OUTSIDE" not in res.stdout and "farskill" not in res.stdout, (cmd, res.stdout)
        assert "faragent" not in res.stdout, (cmd, res.stdout)
    res = run(mnt, """echo '{"agent": "faragent", "intent": "x"}' > "$M/proc/new" """)
    assert res.returncode != 0
    run(mnt, 'rm -rf "$M/skills/farskill" "$M/agents/faragent" "$M/skills/skills" "$M/agents/agents"; '
             'rm -rf "$M/skills/"* "$M/agents/"*; mv "$M/skills/farskill" "$M/skills/moved"')
    assert tree(far) == before
    assert mnt.daemon_alive()


@pytest.mark.expect_log('refused', 'untrusted project')
def test_race_swapping_a_directory_for_a_symlink(mnt, outside, tmp_path):
    root = mnt.project / ".rnix/skills"
    d = skill(root, "racer", body="INSIDE-BODY")
    (d / "sub").mkdir()
    (d / "sub" / "secret.txt").write_text("inside\n")
    (d / "sub" / "deep.txt").write_text("inside deep\n")
    whole = skill(root, "whole", body="INSIDE-BODY")
    (whole / "secret.txt").write_text("inside\n")
    other = tmp_path / "elsewhere2"
    shutil.copytree(outside, other)
    before, before2 = tree(outside), tree(other)
    listed(mnt, "skills", "racer")
    listed(mnt, "skills", "whole")
    # one directory inside a skill, and a whole skill directory, swapped
    swapped = [(d / "sub", outside), (whole, other)]
    swappers = [swap_forever(a, b) for a, b in swapped]
    try:
        res = run(mnt, 'end=$((SECONDS+4)); i=0; while [ $SECONDS -lt $end ]; do i=$((i+1)); '
                       'cat "$M/skills/racer/sub/secret.txt" "$M/skills/whole/secret.txt" '
                       '"$M/skills/whole/SKILL.md" 2>/dev/null; '
                       'echo x 2>/dev/null > "$M/skills/racer/sub/pwn$i"; '
                       'echo x 2>/dev/null > "$M/skills/whole/pwn$i"; '
                       'rm -f "$M/skills/racer/sub/deep.txt" "$M/skills/whole/secret.txt" 2>/dev/null; '
                       'mkdir "$M/skills/racer/sub/dir$i" "$M/skills/whole/dir$i" 2>/dev/null; '
                       'ls "$M/skills/racer/sub" "$M/skills/whole" 2>/dev/null; done; echo "loops=$i"',
                  timeout=120)
    finally:
        for p, (a, _) in zip(swappers, swapped):
            stop_swapping(p, a)
    assert "OUTSIDE" not in res.stdout and "loops=" in res.stdout
    assert tree(outside) == before, "something outside was created, changed or deleted"
    assert tree(other) == before2, "something outside was created, changed or deleted"
    assert mnt.daemon_alive()


@pytest.mark.expect_log('name mismatch', 'shadowed skill', 'skipped skill', 'untrusted project')
def test_race_while_spawning(mnt, outside):
    """Swapping a skill or agent directory for a symlink while spawning never
    puts an outside file into a system prompt; failures say why."""
    root = mnt.project / ".rnix/skills"
    skill(root, "spawned", body="INSIDE-BODY")
    agent = mnt.project / ".rnix/agents/racy"
    agent.mkdir(parents=True)
    (agent / "agent.yaml").write_text("name: racy\nskills: [spawned]\n")
    (agent / "instructions.md").write_text("INSIDE-INSTRUCTIONS")
    (outside / "agent.yaml").write_text("name: racy\n")
    (outside / "instructions.md").write_text("OUTSIDE-INSTRUCTIONS")
    (mnt.project / "AGENTS.md").write_text("INSIDE-DOC")
    listed(mnt, "skills", "spawned")
    listed(mnt, "agents", "racy")
    swapped = [root / "spawned", agent]
    swappers = [swap_forever(a, outside) for a in swapped]
    pids, errors = [], 0
    try:
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline and len(pids) < 40:
            res = run(mnt, f"""echo '{json.dumps({"agent": "racy", "intent": "x"})}' > "$M/proc/new" """)
            if res.returncode != 0:
                errors += 1
                assert "Input/output error" not in res.stderr, res.stderr
                continue
            pids = [int(x) for x in os.listdir(mnt.p("proc")) if x.isdigit()]
    finally:
        for p, a in zip(swappers, swapped):
            stop_swapping(p, a)
    for pid in pids:
        first = open(mnt.p(f"proc/{pid}/context")).readline()
        assert "OUTSIDE" not in first
        assert "INSIDE-INSTRUCTIONS" in first and "INSIDE-BODY" in first
    if errors:
        assert "refused" in mnt.log() or "leaves" in mnt.log()
    assert mnt.daemon_alive()


@pytest.mark.expect_log('refused')
def test_user_agent_leading_out_of_the_config_dir(mnt, outside):
    base = mnt.config_dir / "agents"
    base.mkdir(parents=True, exist_ok=True)
    (outside / "agent.yaml").write_text("name: far\n")
    (outside / "instructions.md").write_text("OUTSIDE-INSTRUCTIONS")
    os.symlink(outside, base / "far")
    listed(mnt, "agents", "far")
    res = run(mnt, 'cat "$M/agents/far/instructions.md"')
    assert res.returncode != 0 and "OUTSIDE" not in res.stdout
    res = run(mnt, """exec 3<>"$M/proc/new"; echo '{"agent": "far", "intent": "x"}' >&3; """
                   """echo "rc=$?"; head -n1 <&3""")
    assert "rc=1" in res.stdout and "Invalid argument" in res.stderr
    assert "error: " in res.stdout and "leaves its scope" in res.stdout   # the reason, in words
    assert "leaves its scope" in mnt.log()


@pytest.mark.expect_log('name mismatch', 'refused', 'shadowed skill', 'skipped skill', 'untrusted project')
def test_every_operation_on_every_hostile_layout(mnt, outside, tmp_path):
    """A sweep: each path through a hostile link gets every operation a shell
    offers; nothing outside the scope roots changes, nothing outside is read,
    nothing the links point to inside the project is deleted."""
    p = mnt.project
    sk, ag = p / ".rnix/skills", p / ".rnix/agents"
    sk.mkdir(parents=True)
    ag.mkdir(parents=True)
    (p / "keep.txt").write_text("project file\n")
    os.symlink(outside, sk / "esc")
    os.symlink("../../../elsewhere", sk / "esc-rel")
    (p / "hop").symlink_to(outside)
    os.symlink("../../hop", sk / "chain")
    os.symlink("/", ag / "rootfs")
    os.symlink(outside, mnt.config_dir / "skills" / "user-esc")
    inner = skill(sk, "inner")
    os.symlink(outside / "secret.txt", inner / "leak")
    os.symlink("../../../../elsewhere", inner / "leakdir")
    os.symlink("../../..", inner / "updir")               # the project root: inside the scope
    os.symlink("leakdir/sub", inner / "via")              # lexically inside, resolves out
    for n in ("esc", "chain", "inner", "user-esc"):
        listed(mnt, "skills", n)
    listed(mnt, "agents", "rootfs")
    before, project_before = tree(outside), tree(p)
    paths = ["skills/esc", "skills/esc-rel", "skills/chain", "skills/user-esc", "skills/esc/sub",
             "agents/rootfs", "agents/rootfs/tmp", "skills/inner/leak", "skills/inner/leakdir",
             "skills/inner/leakdir/sub", "skills/inner/via", "skills/inner/updir"]
    ops = ['cat "$P" "$P/secret.txt" "$P/deep.txt"', 'ls -la "$P" "$P/"', 'readlink -f "$P"',
           'echo pwn > "$P/pwn"', 'echo pwn >> "$P"', 'touch "$P/t" "$P"', 'mkdir "$P/new"',
           'chmod 777 "$P" "$P/secret.txt"', 'truncate -s0 "$P/secret.txt" "$P/deep.txt" "$P"',
           'rm -f "$P/secret.txt" "$P/deep.txt" "$P/keep.txt"', 'rm -rf "$P/"*', 'rm -rf "$P/sub"',
           'mv "$P/secret.txt" "$P/moved"', 'ln -s /etc/passwd "$P/l"', 'cp /etc/hostname "$P/"',
           'cp -r "$P" "$TMPCOPY"', 'getfattr -d "$P"', 'find "$P/" -maxdepth 2', 'du -a "$P/"',
           'tar -cf - -C "$P" . | tar -tvf -']
    leaked = []
    for path in paths:
        copy = tmp_path / "copy"
        script = "; ".join(f"{op} 2>/dev/null" for op in ops)
        res = sh(script, env={**os.environ, "P": mnt.p(path), "TMPCOPY": str(copy)}, timeout=120)
        if "OUTSIDE" in res.stdout or str(outside) in res.stdout:
            leaked.append((path, res.stdout))
        if copy.exists():
            assert "OUTSIDE" not in str(tree(copy)), path
            shutil.rmtree(copy)
    assert leaked == []
    assert tree(outside) == before
    # updir leads to the project root, inside the scope: writing there through
    # it is allowed, but nothing that was there is removed or changed
    now = tree(p)
    assert {k: now.get(k) for k in project_before} == project_before
    assert os.path.exists("/etc/hostname") and mnt.daemon_alive()
    # the links themselves can go: rm -r of those leading out (shown as links
    # or sealed directories); rmdir of one shown as the directory inside the
    # scope it points to (rm -r would descend, and removing through it is refused)
    res = run(mnt, 'rm -r "$M/skills/inner/updir"')
    assert res.returncode != 0 and "Permission denied" in res.stderr
    run(mnt, 'rm -rf "$M/skills/esc" "$M/skills/esc-rel" "$M/skills/chain" "$M/skills/user-esc" '
             '"$M/agents/rootfs" "$M/skills/inner/leak" "$M/skills/inner/leakdir" '
             '"$M/skills/inner/via" && rmdir "$M/skills/inner/updir"', check=True)
    assert tree(outside) == before and (p / "keep.txt").exists()
    assert sorted(os.listdir(inner)) == ["SKILL.md"]


def test_an_alias_of_another_skill_is_a_link_in_the_mount(mnt):
    root = mnt.project / ".rnix/skills"
    real = skill(root, "real", body="REAL-BODY")
    (real / "references").mkdir()
    (real / "references" / "r.md").write_text("R\n")
    os.symlink("real", root / "alias")
    d = skill(root, "user")
    os.symlink("../real/references", d / "refs")          # into another skill: rewritten
    listed(mnt, "skills", "alias")
    assert os.readlink(mnt.p("skills/alias")) == "real"
    assert "REAL-BODY" in open(mnt.p("skills/alias/SKILL.md")).read()
    assert os.readlink(mnt.p("skills/user/refs")) == "../real/references"
    assert open(mnt.p("skills/user/refs/r.md")).read() == "R\n"
    run(mnt, 'rm -r "$M/skills/alias" "$M/skills/user/refs"', check=True)   # the links only
    assert not os.path.lexists(root / "alias") and not os.path.lexists(d / "refs")
    assert (real / "SKILL.md").is_file() and (real / "references" / "r.md").is_file()
