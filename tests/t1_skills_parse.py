"""SKILL.md parsing, strict checks, lenient tiers, tool normalization."""
from __future__ import annotations

import os

import pytest

from rnixfs.skills import (
    SkillParseError, check_name, normalize_tools, parse_skill_md, union_tools, validate_strict,
)
from rnixfs.skills.model import Skill, SkillError, SkillInvalid
from rnixfs.skills.parse import (
    MAX_FRONTMATTER_BYTES, MAX_SKILL_MD_BYTES, LenientSkip, goquote, lenient_check, read_skill_md,
)
from rnixfs.skills.tool_names import split_tools


def skill_dir(tmp_path, name, text, *, dirname=None):
    d = tmp_path / (dirname or name)
    d.mkdir(parents=True, exist_ok=True)
    (d / "SKILL.md").write_text(text, encoding="utf-8")
    return d


def load(d):
    return Skill(name=d.name, path=d, scope="user", namespace="native", root=d.parent).load_metadata()


# --- parse_skill_md ----------------------------------------------------------------


def test_parse_returns_frontmatter_and_stripped_body():
    fm, body = parse_skill_md("---\nname: a\ndescription: d\n---\n\n# Title\n\ntext\n\n")
    assert fm == {"name": "a", "description": "d"}
    assert body == "# Title\n\ntext"


@pytest.mark.parametrize("text", ["", "name: a\n", "# title\n---\n", "\n---\nname: a\n---\n",
                                  "  ---\nname: a\n---\n", "\ufeff---\nname: a\n---\n", "----\n---\n"])
def test_parse_must_start_with_dashes(text):
    with pytest.raises(SkillParseError) as e:
        parse_skill_md(text)
    assert str(e.value) == "SKILL.md must start with ---"


@pytest.mark.parametrize("text", ["---", "---\n", "---\nname: a\ndescription: d\n",
                                  "---\nname: a\n  ---\n", "---\nname: a\n--- x\n"])
def test_parse_missing_closing(text):
    with pytest.raises(SkillParseError) as e:
        parse_skill_md(text)
    assert str(e.value) == "SKILL.md missing closing ---"


def test_parse_crlf_and_trailing_spaces():
    fm, body = parse_skill_md("--- \r\nname: a\r\ndescription: d\r\n---\t\r\nbody\r\n")
    assert fm == {"name": "a", "description": "d"}
    assert body == "body"


def test_body_may_contain_rules_and_frontmatter_block_may_contain_indented_dashes():
    fm, body = parse_skill_md("---\nname: a\ndescription: |\n  x\n  ---\n  y\n---\none\n---\ntwo\n")
    assert fm["description"] == "x\n---\ny\n"
    assert body == "one\n---\ntwo"


def test_scalars_stay_text():
    fm, _ = parse_skill_md("---\nname: a\ndescription: yes\nmetadata:\n  version: 1.0\n  n: 010\n---\n")
    assert fm["description"] == "yes"
    assert fm["metadata"] == {"version": "1.0", "n": "010"}


@pytest.mark.parametrize("front,reason", [
    ("a: &x 1\nb: *x", "aliases"),
    ("a: 1\na: 2", "duplicate key"),
    ("a: b: c", "mapping values"),
    ("- a\n- b", "must be a YAML mapping"),
    ("text", "must be a YAML mapping"),
    ("? [a, b]\n: c", "plain text"),
    ("a: " + "[" * 5000 + "]" * 5000, "yaml parse error"),
])
def test_bad_yaml_is_a_parse_error(front, reason):
    with pytest.raises(SkillParseError) as e:
        parse_skill_md(f"---\n{front}\n---\n")
    assert str(e.value).startswith("yaml parse error")
    assert reason in str(e.value)


def test_yaml_error_line_counts_from_the_file():
    with pytest.raises(SkillParseError) as e:
        parse_skill_md("---\nname: a\ndescription: a: b\n---\n")
    assert "line 3" in str(e.value)


def test_billion_laughs_is_refused_quickly():
    lol = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("abcdefgh", "bcdefghi"))
    with pytest.raises(SkillParseError, match="aliases"):
        parse_skill_md(f"---\n{lol}---\n")


def test_python_tags_build_no_objects():
    fm, _ = parse_skill_md("---\nname: !!python/object/apply:os.system [echo pwned]\ndescription: d\n---\n")
    assert fm["name"] == ["echo pwned"]   # a plain list of text, nothing executed


def test_frontmatter_size_cap():
    with pytest.raises(SkillParseError, match="frontmatter exceeds"):
        parse_skill_md("---\ndescription: " + "x" * (MAX_FRONTMATTER_BYTES + 10) + "\n---\n")


# --- reading files -----------------------------------------------------------------


def test_read_caps_huge_files(tmp_path):
    p = tmp_path / "SKILL.md"
    with open(p, "wb") as f:
        f.truncate(MAX_SKILL_MD_BYTES + 1)
    with pytest.raises(SkillParseError, match="the cap is"):
        read_skill_md(p)


def test_read_refuses_fifo_without_blocking(tmp_path):
    p = tmp_path / "SKILL.md"
    os.mkfifo(p)
    with pytest.raises(SkillParseError, match="not a regular file"):
        read_skill_md(p)


def test_read_refuses_directory_and_missing(tmp_path):
    (tmp_path / "SKILL.md").mkdir()
    with pytest.raises(SkillParseError, match="directory"):
        read_skill_md(tmp_path / "SKILL.md")
    with pytest.raises(SkillParseError, match="missing SKILL.md"):
        read_skill_md(tmp_path / "nope" / "SKILL.md")


def test_read_refuses_invalid_utf8(tmp_path):
    p = tmp_path / "SKILL.md"
    p.write_bytes(b"---\nname: a\ndescription: \xff\n---\n")
    with pytest.raises(SkillParseError, match="not valid UTF-8 \\(byte 25\\)"):
        read_skill_md(p)


# --- names -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "pdf-processing", "x" * 64, "pdf2text", "café"])
def test_good_names(name):
    assert check_name(name) == []


@pytest.mark.parametrize("name,msg", [
    ("", "non-empty"), ("PDF", "lowercase"), ("-a", "hyphen"), ("a-", "hyphen"),
    ("a--b", "consecutive"), ("a_b", "invalid characters"), ("a b", "invalid characters"),
    ("../x", "invalid characters"), ("a/b", "invalid characters"), ("x" * 65, "exceeds 64"),
    (["a"], "non-empty string"),
])
def test_bad_names(name, msg):
    errors = check_name(name)
    assert errors and any(msg in e for e in errors)


def test_name_must_match_directory():
    assert check_name("a", "b") == ["Directory name 'b' must match skill name 'a'"]


# --- validate_strict ------------------------------------------------------------------


def test_validate_accepts_skill_md_path(tmp_path):
    d = skill_dir(tmp_path, "good", "---\nname: good\ndescription: fine\n---\n")
    assert validate_strict(d) == []
    assert validate_strict(d / "SKILL.md") == []


def test_validate_reports_every_problem(tmp_path):
    d = skill_dir(tmp_path, "x", "---\nname: Bad_Name\nextra: 1\ncompatibility: \"\"\n---\n", dirname="x")
    errors = validate_strict(d)
    assert any("Unexpected fields in frontmatter: extra" in e for e in errors)
    assert any("must be lowercase" in e for e in errors)
    assert any("must match skill name" in e for e in errors)
    assert "Missing required field in frontmatter: description" in errors
    assert "Field 'compatibility' must be a non-empty string" in errors


def test_validate_paths(tmp_path):
    assert validate_strict(tmp_path / "nope") == [f"Path does not exist: {tmp_path / 'nope'}"]
    (tmp_path / "f").write_text("x")
    assert validate_strict(tmp_path / "f") == [f"Not a directory: {tmp_path / 'f'}"]
    (tmp_path / "empty").mkdir()
    assert validate_strict(tmp_path / "empty") == ["Missing required file: SKILL.md"]


def test_validate_synergy_shape(tmp_path):
    good = skill_dir(tmp_path, "s", "---\nname: s\ndescription: d\nsynergy:\n  - with: t\n    instruction: i\n---\n")
    assert validate_strict(good) == []
    bad = skill_dir(tmp_path, "u", "---\nname: u\ndescription: d\nsynergy: t\n---\n")
    assert validate_strict(bad) == ["Field 'synergy' must be a list of {with, instruction} mappings"]


# --- lenient tiers ---------------------------------------------------------------------


def test_lenient_name_mismatch_detail():
    w = lenient_check({"name": "old-name", "description": "d"}, "renamed", "/p/renamed")
    assert [(x.field, x.reason, x.detail) for x in w] == [
        ("name", "name mismatch parent dir", 'manifest.Name="old-name", parentDir="renamed"')]


def test_lenient_long_name_detail():
    name = "n" * 70
    w = lenient_check({"name": name, "description": "d"}, name, "/p")
    assert w[0].reason == "name exceeds 64 chars"
    assert w[0].detail == f'truncated="{"n" * 61}..." (full len=70)'


@pytest.mark.parametrize("fm,reason", [
    ({"description": "d"}, "missing name"),
    ({"name": "", "description": "d"}, "missing name"),
    ({"name": "a"}, "missing description"),
    ({"name": "a", "description": "  "}, "missing description"),
    ({"name": "a", "description": "d", "allowed-tools": {"a": "b"}}, "invalid allowed-tools"),
])
def test_lenient_skips(fm, reason):
    with pytest.raises(LenientSkip) as e:
        lenient_check(fm, "a", "/p/a")
    assert e.value.reason.startswith(reason)


def test_skill_loads_metadata_and_body_lazily(tmp_path):
    d = skill_dir(tmp_path, "lazy", "---\nname: lazy\ndescription: d\nallowed-tools: /dev/fs /dev/shell\n"
                                    "metadata:\n  version: \"2.0\"\nlicense: MIT\n---\nfirst body\n")
    s = load(d)
    assert s.valid and s.version == "2.0" and s.license == "MIT"
    assert s.allowed_tools == ["Read", "Write", "Edit", "Glob", "Grep", "Bash"]
    assert s._body is None                       # metadata only at discovery
    assert s.body() == "first body"
    (d / "SKILL.md").write_text("---\nname: lazy\ndescription: d\n---\nsecond body\n")
    assert s.body() == "first body"              # frozen once read


def test_invalid_skill_body_raises(tmp_path):
    d = skill_dir(tmp_path, "bad", "---\nname: bad\n---\n")
    s = load(d)
    assert s.error == "missing description"
    with pytest.raises(SkillInvalid, match='skill "bad" is not loaded: missing description'):
        s.body()


def test_resources_on_demand_and_confined(tmp_path):
    d = skill_dir(tmp_path, "res", "---\nname: res\ndescription: d\n---\n")
    (d / "scripts").mkdir()
    (d / "scripts" / "run.sh").write_text("echo hi\n")
    (d / "references").mkdir()
    (d / "references" / "REF.md").write_text("ref\n")
    secret = tmp_path / "secret.txt"
    secret.write_text("secret")
    (d / "assets").mkdir()
    os.symlink(secret, d / "assets" / "leak.txt")
    s = load(d)
    assert s.resources() == ["references/REF.md", "scripts/run.sh"]   # the outside link is left out
    assert s.read_resource("scripts/run.sh") == b"echo hi\n"
    for bad in ("../secret.txt", "/etc/passwd", "assets/leak.txt", "", "a\x00b"):
        with pytest.raises(SkillError):
            s.read_resource(bad)
    with pytest.raises(SkillError, match="cap"):
        s.read_resource("scripts/run.sh", limit=3)


# --- tools -------------------------------------------------------------------------------


def test_normalize_tools():
    assert normalize_tools(["/dev/fs", "/dev/shell/", "Read", "Bash(git:*)", "Mystery", ""]) == [
        "Read", "Write", "Edit", "Glob", "Grep", "Bash", "Bash(git:*)", "Mystery"]


def test_union_tools_sorted_and_empty_means_unrestricted():
    assert union_tools(["Read"], ["/dev/shell", "Read"], []) == ["Bash", "Read"]
    assert union_tools([], []) == []


def test_split_tools_forms():
    assert split_tools("Read  Grep\tBash") == ["Read", "Grep", "Bash"]
    assert split_tools(["Bash(git log:*)", " Read "]) == ["Bash(git log:*)", "Read"]
    assert split_tools(None) == []
    with pytest.raises(TypeError):
        split_tools({"a": 1})


def test_goquote_like_go():
    assert goquote('a"b\\c\n\x01é') == '"a\\"b\\\\c\\n\\x01é"'


# --- lenient tiers for Rnix-style fields, names in one normal form ---------------------------


@pytest.mark.parametrize("fm,field", [
    ({"metadata": "x"}, "metadata"),
    ({"metadata": {"tags": ["a", "b"], "author": {"name": "me"}}}, "metadata"),
    ({"license": ["MIT", "Apache-2.0"]}, "license"),
    ({"compatibility": {"os": "linux"}}, "compatibility"),
    ({"synergy": "with everything"}, "synergy"),
])
def test_lenient_warns_on_informational_fields(fm, field):
    warnings = lenient_check({"name": "a", "description": "d", **fm}, "a", "/p/a")
    assert [w.field for w in warnings] == [field]


def test_seed_metadata_is_kept_as_written(tmp_path):
    d = skill_dir(tmp_path, "seedy", "---\nname: seedy\ndescription: d\nlicense: [MIT]\nsynergy: x\n"
                                     "metadata:\n  version: '3'\n  tags: [a, b]\n---\n")
    s = load(d)
    assert s.valid and s.version == "3" and s.metadata == {"version": "3", "tags": ["a", "b"]}
    assert s.license is None and s.synergy == []
    assert {w.field for w in s.lenient} == {"metadata", "license", "synergy"}
    assert validate_strict(d)                      # validate stays strict


def test_name_key_is_the_one_normal_form():
    import unicodedata

    from rnixfs.skills.parse import name_key

    nfd = unicodedata.normalize("NFD", "café")
    assert name_key(nfd) == name_key(" café ") == unicodedata.normalize("NFC", "café")
    assert lenient_check({"name": nfd, "description": "d"}, "café", "/p") == []
    assert check_name(nfd, "café") == []


def test_resources_are_bounded(tmp_path, monkeypatch):
    import rnixfs.skills.model as model

    d = skill_dir(tmp_path, "many", "---\nname: many\ndescription: d\n---\n")
    deep = d
    for i in range(12):
        deep = deep / f"l{i}"
        deep.mkdir()
        (deep / "f.txt").write_text("x")
    for i in range(30):
        (d / f"file{i:02}.txt").write_text("x")
    s = load(d)
    assert "l0/l1/l2/l3/l4/l5/l6/f.txt" in s.resources()
    assert not [r for r in s.resources() if r.count("/") >= model.MAX_RESOURCE_DEPTH]
    monkeypatch.setattr(model, "MAX_RESOURCES", 10)
    assert len(s.resources()) == 10
