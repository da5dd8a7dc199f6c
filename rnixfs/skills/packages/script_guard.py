"""Keep agents from running the scripts of skills installed without --allow-scripts.

``blocked_script(command, cwd)`` reads a shell command the way bash would
split it and looks at the words that get *executed*: the command word of
each simple command (after ``;``, ``&&``, ``|``, ``then``, … and variable
assignments, through launchers such as ``env``, ``timeout``, ``xargs``,
``nohup``, ``exec``), the script an interpreter runs (``bash x.sh``,
``python3 x.py``, ``node``, ``perl``, ``source``/``.``), and the command
string of ``sh -c``. Such a word naming an existing file (relative to
``cwd`` or absolute, through the mount too) inside an installed skill — the
nearest directory above it holding a ``.registry.yaml`` — whose record does
not say ``allow_scripts: true`` blocks the command. Reading the files
(``cat``, ``grep``) stays allowed. It is a guard against running
unreviewed package code by name, not a sandbox: a command that ``cd``s into
the skill first or builds the path at run time is not seen.
docs/packages.md.
"""
from __future__ import annotations

import os
import re
import shlex
import stat

from .registry_file import REGISTRY_FILE, scripts_allowed

MAX_WORDS = 512
MAX_UP = 12
MAX_DEPTH = 3
SEPARATORS = {";", "&&", "||", "|", "&", "(", ")", "|&", ";;", ";&", "{", "}", "`", "$("}
KEYWORDS = {"then", "do", "else", "elif", "if", "while", "until", "!", "time", "coproc"}
LAUNCHERS = {"exec", "env", "nohup", "timeout", "nice", "ionice", "sudo", "xargs", "command", "builtin",
             "stdbuf", "setsid", "strace", "ltrace", "chroot", "unbuffer", "flock", "taskset", "chrt",
             "doas", "runuser", "watch", "parallel"}
SHELL_RE = re.compile(r"(ba|z|da|k|c|tc|fi|a|mk)?sh")
INTERPRETER_RE = re.compile(r"python[0-9.]*|pypy[0-9.]*|node(js)?|perl[0-9.]*|ruby[0-9.]*|php[0-9.]*"
                            r"|deno|bun|lua[0-9.]*|luajit|Rscript|tclsh[0-9.]*|pwsh|source|\.|osascript")
ASSIGN_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=")
DURATION_RE = re.compile(r"[0-9.]+[smhd]?")


def _words(command: str) -> list[str]:
    text = command.replace("\n", " ; ").replace("$(", " ( ").replace("`", " ; ")
    try:
        lex = shlex.shlex(text, posix=True, punctuation_chars=";&|()<>")
        lex.whitespace_split = True
        return list(lex)[:MAX_WORDS]
    except ValueError:                 # unbalanced quotes: fall back to whitespace
        return text.split()[:MAX_WORDS]


def _package_dir(path: str) -> str | None:
    d = os.path.dirname(path)
    for _ in range(MAX_UP):
        if os.path.lexists(os.path.join(d, REGISTRY_FILE)):
            return d
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent
    return None


def _locked(word: str, cwd: str) -> str | None:
    if not word:
        return None
    path = os.path.normpath(os.path.join(cwd, os.path.expanduser(word)))
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
    except (OSError, ValueError):
        return None
    skill = _package_dir(path)
    if skill is not None and not scripts_allowed(skill):
        return (f"{word}: belongs to the installed skill {os.path.basename(skill)!r}, whose scripts "
                f"agents may not run (reinstall it with --allow-scripts to allow)")
    return None


def blocked_script(command: str, cwd, _depth: int = 0) -> str | None:
    """The reason ``command`` may not run, or None."""
    cwd = os.fspath(cwd)
    expect_cmd, launcher = True, ""
    interp = ""                        # "shell" or "other" while its script word is pending
    words = _words(command)
    i = 0
    while i < len(words):
        w = words[i]
        i += 1
        if w and set(w) <= set("<>&") and ("<" in w or ">" in w):
            i += 1                     # a redirection: the next word is a file, not a command
            continue
        if w in SEPARATORS or set(w) <= set(";&|()<>"):
            expect_cmd, launcher, interp = True, "", ""
            continue
        if expect_cmd:
            if w in KEYWORDS or ASSIGN_RE.match(w):
                continue
            if launcher and (w.startswith("-") or (launcher == "timeout" and DURATION_RE.fullmatch(w))):
                continue
            if (why := _locked(w, cwd)) is not None:
                return why
            base = os.path.basename(w)
            if base in LAUNCHERS:
                launcher = base
                continue
            expect_cmd, launcher = False, ""
            interp = "shell" if SHELL_RE.fullmatch(base) else "other" if INTERPRETER_RE.fullmatch(base) else ""
            continue
        if interp:
            if interp == "shell" and w == "-c" and i < len(words):
                if _depth < MAX_DEPTH and (why := blocked_script(words[i], cwd, _depth + 1)) is not None:
                    return why
                interp = ""
                i += 1
                continue
            if w.startswith("-"):
                continue
            if (why := _locked(w, cwd)) is not None:
                return why
            interp = ""
    return None
