"""Untrusted text on terminals: rnixfs.textsafe, and `rnixfs ps/show/status`
run against a real mount with an intent, a model name and skill names that
carry escape sequences (the bytes that reach the terminal are checked)."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from rnixfs.textsafe import Column, block, clean, json_text, one_line, table, truncate, width
from tests.mountutil import RNIXFS, needs_fuse, scripted_providers, sh, wait_for
from tests.t2_skills_cli import HOSTILE, assert_terminal_safe, yaml_quoted

# hostile or untrusted project content: the daemon warns, as it should
pytestmark = pytest.mark.expect_log('untrusted project')

# --------------------------------------------------------------------- textsafe


@pytest.mark.parametrize("raw,shown", [
    ("plain", "plain"),
    ("\x1b[2J", "\\x1b[2J"),
    ("a\rb\nc\td", "a\\rb\\nc\\td"),
    ("\x9b31m\x85", "\\x9b31m\\x85"),
    ("\x7f\x00", "\\x7f\\x00"),
    ("\u202egnp.exe\u2066\u200f", "\\u202egnp.exe\\u2066\\u200f"),
    ("\u2028\ufeff", "\\u2028\\ufeff"),
    ("bad\udcffname", "bad\\udcffname"),            # an undecodable file-name byte
    ("café 日本 ✓", "café 日本 ✓"),                  # printable text is untouched
])
def test_clean(raw, shown):
    assert clean(raw) == shown


def test_block_keeps_lines_and_tabs_only():
    assert block("a\r\n\tb\x1b[2J\rc\n") == "a\n\tb\\x1b[2J\\rc\n"


def test_one_line_folds_whitespace_then_escapes():
    assert one_line("  a\n\n b\r\n\x1b ") == "a b \\x1b"


def test_json_text_is_the_same_value():
    value = {"k": HOSTILE + "\u2066\udcff"}
    encoded = json_text(json.dumps(value, ensure_ascii=False))
    assert json.loads(encoded) == value
    assert not [c for c in encoded if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or c in "\u202e\u2066"]


def test_width_and_truncate_count_display_columns():
    assert width("日本") == 4 and width("e\u0301") == 1
    assert truncate("日本語スキル", 7) == "日本..." and width(truncate("日本語スキル", 7)) <= 7
    assert truncate("abcdef", 6) == "abcdef" and truncate("abcdefg", 6) == "abc..."


def test_table_aligns_wide_and_hostile_cells():
    cols = (Column("NAME", 4, 10), Column("X", 1, 3), Column("DESC", 0, 8, fold=True))
    lines = table(cols, [("日本語", "1", "a\nb"), ("n\x1b", "long", "x" * 20)], prefix="[t]")
    assert lines == ["[t] NAME   X   DESC",
                     "[t] 日本語 1   a b",
                     "[t] n\\x1b  ... xxxxx..."]


# ------------------------------------------------------- ps, show, status (mount)


def run_bytes(*args) -> subprocess.CompletedProcess:
    return subprocess.run([*RNIXFS, *args], capture_output=True, timeout=120, stdin=subprocess.DEVNULL)


@needs_fuse
@pytest.mark.mount
def test_ps_show_status_escape_untrusted_text(mount_factory, scripted_server):
    model = "scripted" + HOSTILE
    yaml = scripted_providers(scripted_server.url).replace("model: scripted-model", f"model: {yaml_quoted(model)}")
    m = mount_factory(yaml)
    pid = m.spawn(json.dumps({"intent": "go " + HOSTILE}))
    m.wait(pid)

    res = run_bytes("ps", "--all", "--state-dir", str(m.state_dir))
    assert res.returncode == 0, res.stderr
    lines = assert_terminal_safe(res.stdout).splitlines()
    assert len(lines) == 2, lines                     # header + one row: the intent forged none
    assert lines[0].split() == ["PID", "PPID", "STATE", "EXIT", "STEPS", "TOKENS", "AGENT", "INTENT"]
    assert "go \\x1b[2J\\x1b]0;pwn\\a cleared FAKE ROW" in lines[1]
    rows = [json.loads(x) for x in run_bytes("ps", "--all", "--json", "--state-dir",
                                             str(m.state_dir)).stdout.splitlines()]
    assert [r["intent"] for r in rows if r["pid"] == pid] == ["go " + HOSTILE]   # JSON exact

    res = run_bytes("show", str(pid), "--state-dir", str(m.state_dir))
    assert res.returncode == 0, res.stderr
    out = assert_terminal_safe(res.stdout)
    assert "--- result\necho: go \\x1b[2J" in out and "--- trace\n" in out
    shown = json.loads(run_bytes("show", str(pid), "--json", "--state-dir", str(m.state_dir)).stdout)
    assert shown["intent"] == "go " + HOSTILE

    res = run_bytes("status", str(m.path))
    assert res.returncode == 0, res.stderr
    out = assert_terminal_safe(res.stdout)
    assert "model=scripted\\x1b[2J\\x1b]0;pwn\\a cleared\\r\\nFAKE ROW" in out
    info = json.loads(run_bytes("status", str(m.path), "--json").stdout)
    assert info["providers"]["providers"]["scripted"]["model"] == model

    res = run_bytes("show", "999999", "--state-dir", str(m.state_dir))
    assert res.returncode == 1 and b"no process 999999" in res.stderr


@needs_fuse
@pytest.mark.mount
@pytest.mark.expect_log('skipped skill', 'untrusted project', 'name mismatch')
def test_skill_referenced_by_frontmatter_name_and_xattrs_show_both(mnt):
    d = mnt.p("skills/dir-a")
    assert sh(f'mkdir "{d}" && printf -- "---\\nname: alpha\\ndescription: A.\\n---\\nAlpha body.\\n"'
              f' > "{d}/SKILL.md"').returncode == 0
    assert "dir-a" in os.listdir(mnt.p("skills"))             # the tree keeps directory names
    assert os.getxattr(d, "user.rnix.name") == b"alpha"
    assert os.getxattr(d, "user.rnix.directory") == b"dir-a"
    pid = mnt.spawn(json.dumps({"intent": "use it", "skills": ["alpha"]}))
    wait_for(lambda: mnt.status(pid)["state"] in ("running", "zombie"), 30, what="spawned")
    assert mnt.status(pid)["skills"] == ["alpha"]
    bad = sh(f'exec 3<>"{mnt.p("proc/new")}"; printf "%s" \'{{"intent": "x", "skills": ["dir-b"]}}\' >&3')
    assert bad.returncode != 0
