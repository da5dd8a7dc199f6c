"""`rnixfs skill ...` through the real CLI (subprocesses), including hostile input."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

RNIXFS = [sys.executable, "-m", "rnixfs.cli"]
HEADER = ("[skill] NAME                 VERSION    SOURCE      SCOPE     NAMESPACE  DESCRIPTION")


class Sandbox:
    def __init__(self, tmp: Path, builtins: bool = False):
        self.tmp = tmp
        self.home = tmp / "home"
        self.home.mkdir()
        self.cfg = self.home / ".config" / "rnix"
        self.project = tmp / "proj"
        self.project.mkdir()
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("RNIXFS_CONFIG_DIR", "RNIXFS_ASCII", "XDG_CONFIG_HOME")}
        self.env.update(HOME=str(self.home), XDG_CONFIG_HOME=str(self.home / ".config"))
        if not builtins:
            self.env["RNIXFS_NO_BUILTINS"] = "1"
        else:
            self.env.pop("RNIXFS_NO_BUILTINS", None)

    def run(self, *args, cwd=None, input=None, timeout=60) -> subprocess.CompletedProcess:
        return subprocess.run([*RNIXFS, *args], cwd=cwd or self.project, env=self.env, input=input,
                              capture_output=True, text=True, timeout=timeout)

    def root(self, key: str) -> Path:
        return {"pn": self.project / ".rnix" / "skills", "pa": self.project / ".agents" / "skills",
                "un": self.cfg / "skills", "ua": self.home / ".agents" / "skills"}[key]

    def put(self, key: str, name: str, description: str = "", extra: str = "", declared=None) -> Path:
        d = self.root(key) / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "SKILL.md").write_text(
            f"---\nname: {declared or name}\ndescription: {description or name + ' from ' + key}\n{extra}---\n"
            f"Body of {name} ({key}).\n")
        return d


@pytest.fixture
def sb(tmp_path):
    return Sandbox(tmp_path)


def ok(res):
    assert res.returncode == 0, res.stderr
    return res


def fails(res, text=None):
    assert res.returncode != 0, res.stdout
    assert "Traceback" not in res.stderr
    if text is not None:
        assert text in res.stderr, res.stderr
    return res


# --- list -----------------------------------------------------------------------------


def test_list_table_four_paths_and_warnings(sb):
    for key in ("pn", "pa", "un", "ua"):
        sb.put(key, "dup")
    sb.put("ua", "only-user", "A very long description that goes past forty characters easily",
           extra="metadata:\n  version: '1.2.3'\n")
    res = ok(sb.run("skill", "list"))
    lines = res.stdout.splitlines()
    assert lines[0] == HEADER
    assert lines[1] == "[skill] dup                                         project   native     dup from pn"
    assert lines[2] == ("[skill] only-user            1.2.3                  user      agents     "
                        "A very long description that goes pas...")
    assert len(lines) == 3
    err = res.stderr.splitlines()
    shadow = [ln for ln in err if "shadowed skill" in ln]
    assert len(shadow) == 3 and all(ln.startswith('[skill] warning: shadowed skill "dup": winner=') for ln in shadow)
    assert err[-1].startswith(f'[skill] warning: untrusted project "{sb.project}": 2 skill root(s) will load \u2014 ')


def test_list_empty_diagnostics(sb):
    sb.root("pa").mkdir(parents=True)
    sb.root("un").mkdir(parents=True)
    res = ok(sb.run("skill", "list"))
    assert res.stdout.splitlines() == [
        HEADER,
        "[skill] No skills found. Scanned paths:",
        f"[skill]   - {sb.root('pn')} (not-found)",
        f"[skill]   - {sb.root('pa')} (existed-but-empty)",
        f"[skill]   - {sb.root('un')} (existed-but-empty)",
        f"[skill]   - {sb.root('ua')} (not-found)",
        "[skill] Tip: rnixfs skill create <name> to add a skill.",
    ]
    g = ok(sb.run("skill", "list", "-g")).stdout.splitlines()
    assert [ln for ln in g if ln.startswith("[skill]   - ")] == [
        f"[skill]   - {sb.root('un')} (existed-but-empty)", f"[skill]   - {sb.root('ua')} (not-found)"]
    p = ok(sb.run("skill", "list", "-p")).stdout.splitlines()
    assert [ln for ln in p if ln.startswith("[skill]   - ")] == [
        f"[skill]   - {sb.root('pn')} (not-found)", f"[skill]   - {sb.root('pa')} (existed-but-empty)"]


def test_list_json_always_has_diagnostics(sb):
    res = ok(sb.run("skill", "list", "--json"))
    assert res.stdout.count("\n") == 1 and res.stderr == ""
    assert json.loads(res.stdout) == {"ok": True, "data": {"skills": [], "diagnostics": {}}}
    sb.put("pn", "a")
    sb.put("un", "a")
    bad = sb.root("pn") / "bad"
    bad.mkdir()
    (bad / "SKILL.md").write_text("---\nname: bad\ndescription: a: b\n---\n")
    sb.put("pa", "renamed", declared="other")
    res = ok(sb.run("skill", "list", "--json"))
    assert res.stderr == ""                        # JSON mode: diagnostics only in the node
    data = json.loads(res.stdout)["data"]
    assert [s["name"] for s in data["skills"]] == ["a", "other"]   # the frontmatter name
    assert data["skills"][1]["directory"] == "renamed"
    assert data["skills"][0] == {"name": "a", "directory": "a", "version": "", "path": str(sb.root("pn") / "a"),
                                 "description": "a from pn", "source": "", "scope": "project",
                                 "namespace": "native", "shadowed": False}
    d = data["diagnostics"]
    assert d["warnings"] == [{"skill_name": "a", "winning_path": str(sb.root("pn") / "a"),
                              "winning_scope": "project", "winning_ns": "native",
                              "shadowed_path": str(sb.root("un") / "a"), "shadowed_scope": "user",
                              "shadowed_ns": "native"}]
    assert d["skipped"][0]["reason"].startswith("yaml parse error: line 3: mapping values")
    assert d["lenient"][0]["reason"] == "name mismatch parent dir"
    assert d["trust"][0]["project_dir"] == str(sb.project)


def test_list_quiet_and_filters(sb):
    sb.put("pn", "p1")
    sb.put("ua", "u1")
    assert ok(sb.run("skill", "list", "--quiet")).stdout == "p1\nu1\n"
    assert ok(sb.run("skill", "list", "-q", "-g")).stdout == "u1\n"
    assert ok(sb.run("skill", "list", "-q", "--project-scope")).stdout == "p1\n"
    assert ok(sb.run("skill", "list", "-q", "--project", str(sb.tmp))).stdout == "u1\n"


def test_list_flag_conflicts(sb):
    fails(sb.run("skill", "list", "-g", "-p"), "mutually exclusive")
    res = fails(sb.run("skill", "list", "-g", "-p", "--json"))
    assert json.loads(res.stdout)["ok"] is False
    res = fails(sb.run("skill", "list", "--json", "--quiet"))
    assert json.loads(res.stdout)["error"]["message"] == "--json and --quiet are mutually exclusive"
    fails(sb.run("skill", "list", "--bogus"), "No such option")


def test_list_trust_marker_and_ascii(sb):
    sb.put("pn", "p1")
    assert "untrusted project" in sb.run("skill", "list").stderr
    sb.env["RNIXFS_ASCII"] = "1"
    assert "will load - untrusted repo" in sb.run("skill", "list").stderr
    state = sb.project / ".rnix" / "state"
    state.mkdir()
    os.symlink("/etc/hostname", state / "trusted")
    assert "untrusted project" in sb.run("skill", "list").stderr          # a symlink never counts
    (state / "trusted").unlink()
    (state / "trusted").write_text("")
    res = ok(sb.run("skill", "list"))
    assert res.stderr == "" and "p1" in res.stdout


def test_list_ancestors_flag(sb):
    (sb.tmp / ".git").mkdir()
    sb.put("pn", "local")
    mono = sb.tmp / ".rnix" / "skills" / "from-root"
    mono.mkdir(parents=True)
    (mono / "SKILL.md").write_text("---\nname: from-root\ndescription: root\n---\n")
    assert "from-root" not in ok(sb.run("skill", "list", "-q")).stdout
    assert "from-root" in ok(sb.run("skill", "list", "-q", "--ancestors")).stdout


def test_list_hostile_tree(sb):
    root = sb.root("pn")
    root.mkdir(parents=True)
    outside = sb.tmp / "outside" / "evil"
    outside.mkdir(parents=True)
    (outside / "SKILL.md").write_text("---\nname: evil\ndescription: outside\n---\nsecret\n")
    os.symlink(outside, root / "evil")
    os.symlink(root / "loop", root / "loop")
    huge = root / "huge"
    huge.mkdir()
    with open(huge / "SKILL.md", "wb") as f:
        f.truncate(5 << 20)
    fifo = root / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "SKILL.md")
    (root / "binary").mkdir()
    (root / "binary" / "SKILL.md").write_bytes(os.urandom(4096))
    (root / "nested").mkdir()
    (root / "nested" / "SKILL.md").write_text("---\nname: nested\ndescription: " + "[" * 3000 + "\n---\n")
    res = ok(sb.run("skill", "list", timeout=30))
    assert res.stdout.splitlines()[1:3] == ["[skill] No skills found. Scanned paths:",
                                            f"[skill]   - {root} (existed-non-empty)"]
    err = res.stderr
    assert f"skipped skill at {root / 'evil'}: skill directory is a symlink that leaves the project" in err
    assert f"skipped skill at {root / 'huge'}: SKILL.md is 5242880 bytes; the cap is 1048576" in err
    assert f"skipped skill at {root / 'fifo'}: SKILL.md is not a regular file" in err
    assert f"skipped skill at {root / 'nested'}: yaml parse error" in err
    assert f"skipped skill at {root / 'binary'}:" in err


def test_list_from_a_deleted_cwd(sb):
    gone = sb.tmp / "gone"
    gone.mkdir()
    proc = subprocess.run(
        ["sh", "-c", f'cd "{gone}" && rmdir "{gone}" && exec "$0" "$@"', *RNIXFS, "skill", "list"],
        env=sb.env, capture_output=True, text=True, timeout=60)
    fails(proc, "cannot resolve the current directory")


def test_list_unwritable_config_dir_still_lists(sb, tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    sb.env.pop("RNIXFS_NO_BUILTINS")
    sb.put("pn", "p1")
    res = ok(sb.run("skill", "list", "-q", "--config-dir", str(blocker / "cfg")))
    assert res.stdout == "p1\n"


# --- show -------------------------------------------------------------------------------


def test_show(sb):
    sb.put("pn", "s", "Shows things", extra="license: MIT\nallowed-tools: /dev/fs\nmetadata:\n  version: '2'\n")
    sb.put("ua", "s")
    (sb.root("pn") / "s" / "scripts").mkdir()
    (sb.root("pn") / "s" / "scripts" / "run.sh").write_text("echo\n")
    out = ok(sb.run("skill", "show", "s")).stdout.splitlines()
    assert out[:7] == ["name: s", "description: Shows things", "scope: project", "namespace: native",
                       f"path: {sb.root('pn') / 's'}", "version: 2", "license: MIT"]
    assert "allowed-tools: Read Write Edit Glob Grep" in out
    assert "trust: untrusted" in out
    assert f"shadowed: {sb.root('ua') / 's'} (user/agents)" in out
    assert "resource: scripts/run.sh" in out
    assert out[-2:] == ["---", "Body of s (pn)."]
    data = json.loads(ok(sb.run("skill", "show", "s", "--json")).stdout)["data"]
    assert data["body"] == "Body of s (pn)." and data["resources"] == ["scripts/run.sh"]
    assert data["shadowed"][0]["namespace"] == "agents"


def test_show_errors(sb):
    fails(sb.run("skill", "show", "ghost"), 'skill "ghost" not found')
    d = sb.root("pn") / "broken"
    d.mkdir(parents=True)
    (d / "SKILL.md").write_text("---\nname: broken\n---\n")
    fails(sb.run("skill", "show", "broken"), 'skill "broken" is not loaded: missing description')
    for name in ("../x", "/etc", "a/../../b", ""):
        res = fails(sb.run("skill", "show", name))
        assert "not found" in res.stderr
    res = fails(sb.run("skill", "show", "ghost", "--json"))
    assert json.loads(res.stdout)["error"]["code"] == "NOT_FOUND"


# --- validate ----------------------------------------------------------------------------


def test_validate(sb):
    d = sb.put("pn", "good")
    res = ok(sb.run("skill", "validate", str(d)))
    assert res.stdout == f"Valid skill: {d}\n"
    ok(sb.run("skill", "validate", str(d / "SKILL.md")))
    bad = sb.put("pn", "bad", declared="Bad_Name", extra="tags: x\n")
    res = fails(sb.run("skill", "validate", str(bad)))
    err = res.stderr.splitlines()
    assert err[0] == f"Validation failed for {bad}:"
    assert "  - Skill name 'Bad_Name' must be lowercase" in err
    assert any(ln.startswith("  - Unexpected fields in frontmatter: tags.") for ln in err)
    j = json.loads(fails(sb.run("skill", "validate", "--json", str(bad))).stdout)
    assert j["ok"] is False and j["data"]["valid"] is False and len(j["data"]["errors"]) >= 3


def test_validate_hostile_paths(sb):
    fails(sb.run("skill", "validate", str(sb.tmp / "missing")), "Path does not exist")
    f = sb.tmp / "file"
    f.write_text("x")
    fails(sb.run("skill", "validate", str(f)), "Not a directory")
    d = sb.tmp / "huge"
    d.mkdir()
    with open(d / "SKILL.md", "wb") as fh:
        fh.truncate(50 << 20)
    fails(sb.run("skill", "validate", str(d)), "the cap is")
    d = sb.tmp / "fifo"
    d.mkdir()
    os.mkfifo(d / "SKILL.md")
    fails(sb.run("skill", "validate", str(d), timeout=20), "not a regular file")
    d = sb.tmp / "aliases"
    d.mkdir()
    (d / "SKILL.md").write_text("---\nname: &a aliases\ndescription: *a\n---\n")
    fails(sb.run("skill", "validate", str(d)), "aliases (*name) are not allowed")


def test_validate_while_the_file_is_rewritten(sb):
    d = sb.put("un", "flux")
    texts = [(d / "SKILL.md").read_text(), "---\nname: flux\n", "", "---\nname: flux\ndescription: x\n---\n"]

    def rewrite(i):
        tmp = d / f".tmp{i}"
        tmp.write_text(texts[i % len(texts)])
        os.replace(tmp, d / "SKILL.md")

    with ThreadPoolExecutor(6) as pool:
        runs = [pool.submit(sb.run, "skill", "validate", str(d)) for _ in range(6)]
        writes = [pool.submit(rewrite, i) for i in range(200)]
        results = [f.result() for f in runs]
        [f.result() for f in writes]
    for r in results:
        assert r.returncode in (0, 1) and "Traceback" not in r.stderr


# --- create ------------------------------------------------------------------------------


def test_create_from_template_in_project_scope(sb):
    (sb.project / ".rnix").mkdir()
    sub = sb.project / "src"
    sub.mkdir()
    res = ok(sb.run("skill", "create", "my-skill", "-d", 'Does "things": well', cwd=sub))
    target = sb.root("pn") / "my-skill"
    assert res.stdout == f"[skill] Created my-skill (project/native: {target})\n"
    ok(sb.run("skill", "validate", str(target)))
    text = (target / "SKILL.md").read_text()
    assert 'description: "Does \\"things\\": well"' in text
    assert "my-skill" in ok(sb.run("skill", "list", "-q")).stdout


def test_create_goes_to_user_scope_without_a_project(sb):
    res = ok(sb.run("skill", "create", "u-skill", "--from-template"))     # no .rnix/ in the project
    assert f"(user/native: {sb.root('un') / 'u-skill'})" in res.stdout
    ok(sb.run("skill", "create", "p-skill", "--project", str(sb.project)))
    assert (sb.root("pn") / "p-skill" / "SKILL.md").is_file()
    (sb.project / ".rnix").mkdir(exist_ok=True)
    ok(sb.run("skill", "create", "g-skill", "-g"))
    assert (sb.root("un") / "g-skill" / "SKILL.md").is_file()


def test_create_from_file_and_stdin(sb):
    src = sb.tmp / "mine.md"
    src.write_text("---\nname: from-file\ndescription: Written by hand.\n---\nHand body.\n")
    ok(sb.run("skill", "create", "from-file", "-f", str(src), "--project", str(sb.project)))
    assert (sb.root("pn") / "from-file" / "SKILL.md").read_text() == src.read_text()
    text = "---\nname: from-stdin\ndescription: Piped.\n---\n"
    ok(sb.run("skill", "create", "from-stdin", "-f", "-", "-g", input=text))
    assert (sb.root("un") / "from-stdin" / "SKILL.md").read_text() == text


@pytest.mark.parametrize("name,msg", [
    ("../x", "invalid skill name"), ("/etc/x", "invalid skill name"), ("a/b", "invalid skill name"),
    ("..", "invalid skill name"), ("Bad", "must be lowercase"), ("-x", "hyphen"),
    ("x" * 65, "exceeds 64"), ("a b", "invalid characters"), (".hidden", "invalid characters"),
])
def test_create_bad_names(sb, name, msg):
    fails(sb.run("skill", "create", "-g", "--", name), msg)
    assert not (sb.tmp / "x").exists() and not any(sb.home.rglob("SKILL.md"))


def test_create_bad_files(sb):
    bad = sb.tmp / "bad.md"
    bad.write_text("---\nname: other\ndescription: d\n---\n")
    fails(sb.run("skill", "create", "mine", "-f", str(bad), "-g"), "must match skill name")
    bad.write_text("---\nname: mine\ndescription: [unclosed\n---\n")
    fails(sb.run("skill", "create", "mine", "-f", str(bad), "-g"), "yaml parse error")
    bad.write_text("no frontmatter\n")
    fails(sb.run("skill", "create", "mine", "-f", str(bad), "-g"), "SKILL.md must start with ---")
    with open(bad, "wb") as f:
        f.truncate(3 << 20)
    fails(sb.run("skill", "create", "mine", "-f", str(bad), "-g"), "larger than")
    fails(sb.run("skill", "create", "mine", "-f", str(sb.tmp / "nope"), "-g"), "No such file")
    fails(sb.run("skill", "create", "mine", "-f", "-", "-g", input="x" * (2 << 20)), "larger than")
    fails(sb.run("skill", "create", "mine", "-f", str(bad), "--from-template", "-g"), "mutually exclusive")
    fails(sb.run("skill", "create", "mine", "-g", "-d", "two\nlines"), "one line")
    assert not (sb.root("un") / "mine").exists()


def test_create_refuses_a_project_root_leading_out(sb):
    elsewhere = sb.tmp / "elsewhere"
    elsewhere.mkdir()
    (sb.project / ".rnix").mkdir()
    os.symlink(elsewhere, sb.root("pn"))
    fails(sb.run("skill", "create", "x"), "is a symlink that leaves the project")
    assert list(elsewhere.iterdir()) == []


def test_create_existing_and_concurrent(sb):
    ok(sb.run("skill", "create", "once", "-g"))
    fails(sb.run("skill", "create", "once", "-g"), 'skill "once" already exists')
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: sb.run("skill", "create", "race", "-g"), range(8)))
    assert sum(r.returncode == 0 for r in results) == 1
    assert all("already exists" in r.stderr for r in results if r.returncode != 0)
    assert (sb.root("un") / "race" / "SKILL.md").is_file()
    assert not [p for p in (sb.root("un") / "race").iterdir() if p.name != "SKILL.md"]


# --- delete ------------------------------------------------------------------------------


def test_delete_winner_reveals_shadowed(sb):
    sb.put("pn", "s")
    sb.put("un", "s")
    res = ok(sb.run("skill", "delete", "s"))
    assert res.stdout.splitlines() == [
        f"[skill] Deleted s (project/native: {sb.root('pn') / 's'})",
        f"[skill] s now resolves to {sb.root('un') / 's'} (user/native)"]
    assert not (sb.root("pn") / "s").exists()
    ok(sb.run("skill", "delete", "s"))
    fails(sb.run("skill", "delete", "s"), 'skill "s" not found')


def test_delete_invalid_skill_and_symlink(sb):
    d = sb.root("un") / "broken"
    d.mkdir(parents=True)
    (d / "SKILL.md").write_text("garbage")
    ok(sb.run("skill", "delete", "broken"))
    assert not d.exists()
    real = sb.tmp / "store" / "linked"
    real.mkdir(parents=True)
    (real / "SKILL.md").write_text("---\nname: linked\ndescription: d\n---\n")
    sb.root("ua").mkdir(parents=True)
    os.symlink(real, sb.root("ua") / "linked")
    ok(sb.run("skill", "delete", "linked"))
    assert not (sb.root("ua") / "linked").is_symlink() and (real / "SKILL.md").is_file()


@pytest.mark.parametrize("name", ["../proj", "..", ".", "/etc", "a/b", ".rnix", ""])
def test_delete_bad_names_touch_nothing(sb, name):
    sb.put("pn", "keep")
    fails(sb.run("skill", "delete", name))
    assert (sb.root("pn") / "keep" / "SKILL.md").is_file() and sb.project.is_dir()


def test_delete_concurrent(sb):
    sb.put("un", "victim")
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda _: sb.run("skill", "delete", "victim"), range(6)))
    assert sum(r.returncode == 0 for r in results) == 1
    assert all('skill "victim" not found' in r.stderr for r in results if r.returncode != 0)
    assert not any(p.name.startswith(".victim") for p in sb.root("un").iterdir())


def test_list_while_creating_and_deleting(sb):
    def churn(i):
        name = f"c{i % 4}"
        if i % 2:
            return sb.run("skill", "create", name, "-g")
        return sb.run("skill", "delete", name)

    def lister(_):
        return sb.run("skill", "list", "--json")

    with ThreadPoolExecutor(8) as pool:
        churned = list(pool.map(churn, range(16)))
        listed = list(pool.map(lister, range(8)))
    for r in churned + listed:
        assert "Traceback" not in r.stderr
    for r in listed:
        assert r.returncode == 0 and json.loads(r.stdout)["ok"] is True


# --- built-ins through the CLI -------------------------------------------------------------


def test_first_use_extracts_builtins(tmp_path):
    sb = Sandbox(tmp_path, builtins=True)
    res = ok(sb.run("skill", "list"))
    assert ("[skill] code-analysis        1.0        builtin     user      native     "
            "Review source code for bugs, error-ha...") in res.stdout.splitlines()
    md = sb.cfg / "skills" / "code-analysis" / "SKILL.md"
    md.write_text(md.read_text().replace("Review source code", "My review"))
    ok(sb.run("skill", "list"))
    assert "My review" in md.read_text()
    ok(sb.run("skill", "delete", "code-analysis"))
    assert "code-analysis" not in ok(sb.run("skill", "list", "-q")).stdout


# --- terminal safety, names, resources, seed metadata ----------------------------------------

# Escape sequences and controls a SKILL.md can carry: clear screen, set the window
# title, carriage return, a forged row, the 8-bit CSI and a right-to-left override.
HOSTILE = "\x1b[2J\x1b]0;pwn\x07 cleared\r\nFAKE ROW\x9b31m \u202egnp.exe\x7f"


def raw(sb, *args, env=None) -> subprocess.CompletedProcess:
    """Run the CLI and keep stdout/stderr as bytes (what reaches the terminal)."""
    return subprocess.run([*RNIXFS, *args], cwd=sb.project, env=env or sb.env,
                          capture_output=True, timeout=60)


def assert_terminal_safe(data: bytes) -> str:
    """No C0 control but newline and tab, no DEL, no C1 control, no bidi override."""
    bad = [b for b in data if (b < 0x20 and b not in b"\n\t") or b == 0x7F]
    assert not bad, data
    text = data.decode("utf-8")
    assert not [c for c in text if 0x80 <= ord(c) <= 0x9F or c in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"], text
    return text


def yaml_quoted(text: str) -> str:
    return json.dumps(text)       # a JSON string is a valid YAML double-quoted scalar


def test_hostile_names_and_descriptions_are_escaped_for_humans(sb):
    sb.put("pn", "evil", yaml_quoted(HOSTILE), extra=f"metadata:\n  version: {yaml_quoted('1' + HOSTILE[:4])}\n")
    d = sb.root("pn") / "forged"
    d.mkdir(parents=True)
    (d / "SKILL.md").write_text(f"---\nname: {yaml_quoted('forged' + HOSTILE)}\ndescription: d\n---\n"
                                f"body \x1b[2J line\x9b\r\nnext\tcol\n")
    res = raw(sb, "skill", "list")
    assert res.returncode == 0
    out = assert_terminal_safe(res.stdout)
    lines = out.splitlines()
    assert len(lines) == 3, out                       # header + two rows: no forged row
    assert "\\x1b[2J\\x1b]0;pwn\\a cleared FAKE ROW" in lines[1]   # description: escaped and folded
    assert lines[2].startswith("[skill] forged\\x1b[2J\\x1b]0;pwn\\a cleared\\r\\nFAKE ROW\\x9b31m")
    assert_terminal_safe(res.stderr)
    for name in ("evil", "forged" + HOSTILE):
        res = raw(sb, "skill", "show", name)
        assert res.returncode == 0, res.stderr
        out = assert_terminal_safe(res.stdout)
    assert "body \\x1b[2J line\\x9b\nnext\tcol" in out          # the body keeps its lines and tabs
    assert "name: forged\\x1b[2J\\x1b]0;pwn\\a cleared\\r\\nFAKE ROW\\x9b31m \\u202egnp.exe\\x7f" in out
    # --json stays exact: the same strings come back after parsing
    res = raw(sb, "skill", "list", "--json")
    assert_terminal_safe(res.stdout)
    skills = {s["name"]: s for s in json.loads(res.stdout)["data"]["skills"]}
    assert skills["evil"]["description"] == HOSTILE.strip() and skills["evil"]["version"] == "1" + HOSTILE[:4]
    assert "forged" + HOSTILE in skills
    data = json.loads(raw(sb, "skill", "show", "forged" + HOSTILE, "--json").stdout)["data"]
    assert data["name"] == "forged" + HOSTILE and data["body"] == "body \x1b[2J line\x9b\r\nnext\tcol"
    # errors and warnings are escaped too
    res = raw(sb, "skill", "show", "ghost\x1b[2J")
    assert res.returncode == 1 and b"ghost\\x1b[2J" in res.stderr
    assert_terminal_safe(res.stderr)
    res = raw(sb, "skill", "validate", "forged" + HOSTILE)
    assert res.returncode == 1
    assert_terminal_safe(res.stdout + res.stderr)


def test_hostile_directory_names_in_warnings(sb):
    d = sb.root("pn") / "dir\x1b[2J\nrow"
    d.mkdir(parents=True)
    (d / "SKILL.md").write_text("---\nname: x\n---\n")          # skipped: its path is in the warning
    res = raw(sb, "skill", "list")
    err = assert_terminal_safe(res.stderr)
    assert "dir\\x1b[2J\\nrow: missing description" in err


def test_long_and_wide_names_keep_columns_aligned(sb):
    from wcwidth import wcswidth

    names = ["a" * 60, "b" * 70, "日本語-スキル", "short"]
    for n in names:
        sb.put("pn", n, "same description")
    lines = ok(sb.run("skill", "list")).stdout.splitlines()
    # every row's DESCRIPTION starts at the same display column as the header's
    header_col = wcswidth(lines[0][:lines[0].index("DESCRIPTION")])
    for line in lines[1:]:
        assert wcswidth(line[:line.index("same description")]) == header_col, line
    assert any(ln.startswith("[skill] " + "b" * 61 + "... ") for ln in lines)   # over 64: cut
    assert any(ln.startswith("[skill] " + "a" * 60 + " ") for ln in lines)      # kept whole
    assert len(lines[0]) == len(HEADER) + 44                                     # NAME grew to 64


def test_list_and_show_use_the_frontmatter_name(sb):
    sb.put("pn", "dir-a", "declared alpha", declared="alpha")
    sb.put("un", "alpha", "the user's alpha")           # a different directory, same name, lower scope
    res = ok(sb.run("skill", "list"))
    rows = res.stdout.splitlines()[1:]
    assert [r.split()[1] for r in rows] == ["alpha"] and "declared alpha" in rows[0]
    assert 'name mismatch parent dir (manifest.Name="alpha", parentDir="dir-a")' in res.stderr
    assert (f'shadowed skill "alpha": winner={sb.root("pn") / "dir-a"} (project/native); '
            f'shadowed={sb.root("un") / "alpha"} (user/native)') in res.stderr
    out = ok(sb.run("skill", "show", "alpha")).stdout.splitlines()
    assert out[:3] == ["name: alpha", "directory: dir-a", "description: declared alpha"]
    assert ok(sb.run("skill", "show", "dir-a")).stdout.splitlines()[0] == "name: alpha"   # fallback
    data = json.loads(ok(sb.run("skill", "list", "--json")).stdout)["data"]["skills"]
    assert [(s["name"], s["directory"]) for s in data] == [("alpha", "dir-a")]
    assert ok(sb.run("skill", "list", "-q")).stdout == "alpha\n"
    res = ok(sb.run("skill", "delete", "alpha"))            # delete goes by the same name
    assert not (sb.root("pn") / "dir-a").exists()
    assert f"alpha now resolves to {sb.root('un') / 'alpha'} (user/native)" in res.stdout


def test_nfc_and_nfd_names_are_one_name(sb):
    import unicodedata

    nfc, nfd = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")
    assert nfc != nfd
    d = sb.put("pn", nfd, "decomposed directory", declared=nfc)
    res = ok(sb.run("skill", "list"))
    assert "mismatch" not in res.stderr and res.stdout.splitlines()[1].startswith(f"[skill] {nfc} ")
    ok(sb.run("skill", "validate", str(d)))                 # validate agrees with loading
    for arg in (nfc, nfd):
        assert ok(sb.run("skill", "show", arg)).stdout.startswith(f"name: {nfc}\n")
        ok(sb.run("skill", "validate", arg))
    ok(sb.run("skill", "create", unicodedata.normalize("NFD", "thé"), "--project", str(sb.project)))
    assert (sb.root("pn") / unicodedata.normalize("NFC", "thé") / "SKILL.md").is_file()   # stored NFC
    fails(sb.run("skill", "create", nfc, "--project", str(sb.project)), "already exists")


def test_seed_style_metadata_loads_with_a_warning_but_does_not_validate(sb):
    d = sb.put("pn", "seedy", "seed style", extra=(
        "tags: [a, b]\ntriggers:\n  keywords: [x, y]\n  nested:\n    deep: '1'\n"
        "metadata:\n  version: '1.0'\n  tags: [a, b]\n  author:\n    name: me\n"))
    res = ok(sb.run("skill", "list"))
    assert res.stdout.splitlines()[1].startswith("[skill] seedy                1.0 ")
    assert (f"[skill] warning: {d}: metadata: metadata is not a mapping of string keys to string "
            f"values (type=mapping; non-text values kept as written)") in res.stderr
    data = json.loads(ok(sb.run("skill", "show", "seedy", "--json")).stdout)["data"]
    assert data["metadata"] == {"version": "1.0", "tags": ["a", "b"], "author": {"name": "me"}}
    err = fails(sb.run("skill", "validate", "seedy")).stderr
    assert "Field 'metadata' must be a mapping of string keys to string values" in err
    assert "Unexpected fields in frontmatter: tags, triggers." in err
    # a malformed allowed-tools still skips: a grant that cannot be read is no grant
    sb.put("pn", "tools", extra="allowed-tools:\n  Bash: yes\n")
    res = ok(sb.run("skill", "list"))
    assert "skipped skill at" in res.stderr and "invalid allowed-tools" in res.stderr
    assert "tools" not in ok(sb.run("skill", "list", "-q")).stdout.split()


def test_show_lists_every_file_of_the_skill(sb, tmp_path):
    d = sb.put("pn", "full")
    for rel in ("LICENSE.txt", "templates/page.html", "examples/a/b/c.md", "scripts/run.sh",
                ".git/config", ".DS_Store", "nested/.hidden"):
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(rel)
    os.symlink("templates/page.html", d / "inside-link.html")     # stays inside: listed
    os.symlink(tmp_path, d / "outside-dir")                         # leaves the skill: not followed
    os.symlink("/etc/passwd", d / "outside-file")
    os.symlink(".", d / "examples" / "loop")                        # a loop: walked once
    data = json.loads(ok(sb.run("skill", "show", "full", "--json", timeout=60)).stdout)["data"]
    assert data["resources"] == ["LICENSE.txt", "examples/a/b/c.md", "inside-link.html",
                                 "scripts/run.sh", "templates/page.html"]
    out = ok(sb.run("skill", "show", "full")).stdout
    assert "resource: LICENSE.txt\n" in out and "outside" not in out


def test_validate_takes_a_name(sb):
    sb.put("pn", "good")
    sb.put("pn", "dir-b", declared="beta")
    res = ok(sb.run("skill", "validate", "good"))
    assert res.stdout == f"Valid skill: {sb.root('pn') / 'good'}\n"
    res = fails(sb.run("skill", "validate", "beta"))                  # by frontmatter name
    assert f"Validation failed for {sb.root('pn') / 'dir-b'}:" in res.stderr
    assert "Directory name 'dir-b' must match skill name 'beta'" in res.stderr
    fails(sb.run("skill", "validate", "nosuch"), "Path does not exist: nosuch")
    # an existing path wins over a name
    (sb.project / "good").mkdir()
    fails(sb.run("skill", "validate", "good"), "Missing required file: SKILL.md")
    j = json.loads(ok(sb.run("skill", "validate", "--json", "good", "--project", str(sb.project),
                             cwd=sb.tmp)).stdout)
    assert j["data"]["valid"] is True


def test_create_shared(sb):
    res = ok(sb.run("skill", "create", "shared-one", "--shared", "--project", str(sb.project)))
    assert (sb.root("pa") / "shared-one" / "SKILL.md").is_file()
    assert "(project/agents:" in res.stdout
    res = ok(sb.run("skill", "create", "shared-two", "--shared", "-g"))
    assert (sb.root("ua") / "shared-two" / "SKILL.md").is_file() and "(user/agents:" in res.stdout
    ok(sb.run("skill", "validate", "shared-two"))


def editor(sb, script: str) -> dict:
    path = sb.tmp / "editor.sh"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    env = dict(sb.env, EDITOR=f"{path} --flag")
    env.pop("VISUAL", None)
    return env


def test_create_edit_opens_the_editor(sb):
    env = editor(sb, '[ "$1" = --flag ] || exit 9\n'
                     'sed -i "s/^description: .*/description: Written in the editor./" "$2"\n'
                     'echo "Edited body." >> "$2"\n')
    res = subprocess.run([*RNIXFS, "skill", "create", "edited", "--edit", "--project", str(sb.project)],
                         cwd=sb.project, env=env, capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr
    text = (sb.root("pn") / "edited" / "SKILL.md").read_text()
    assert "description: Written in the editor." in text and text.endswith("Edited body.\n")
    ok(sb.run("skill", "validate", "edited"))


def test_create_edit_failures_create_nothing(sb):
    for script, msg in (('echo "---" > "$2"\n', "SKILL.md missing closing ---"),
                        ('sed -i "s/^name: .*/name: other/" "$2"\n', "must match skill name 'other'"),
                        ("exit 3\n", "the editor exited with status 3")):
        env = editor(sb, script)
        res = subprocess.run([*RNIXFS, "skill", "create", "draft", "--edit", "--project", str(sb.project)],
                             cwd=sb.project, env=env, capture_output=True, text=True, timeout=60,
                             stdin=subprocess.DEVNULL)
        assert res.returncode == 1 and msg in res.stderr, res.stderr
        assert not (sb.root("pn") / "draft").exists()
        kept = res.stderr.split("kept at ")[1].strip()
        assert os.path.isfile(kept)                       # the user's edits are not lost
    env = dict(sb.env, EDITOR="", VISUAL="", PATH="/nonexistent")
    res = subprocess.run([*RNIXFS, "skill", "create", "draft", "--edit"], cwd=sb.project, env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "--edit needs an editor" in res.stderr
