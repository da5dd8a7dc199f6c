"""Keep agents from running the scripts of skills installed without --allow-scripts.

``blocked_script(command, cwd)`` looks at every word of a shell command that
names an existing file (relative to ``cwd`` or absolute, through the mount
too) and walks up from it to the nearest directory holding a
``.registry.yaml``: an installed skill whose record does not say
``allow_scripts: true`` blocks the command. It catches ``./scripts/x.sh``,
``bash skills/foo/scripts/x.sh``, ``python3 $M/skills/foo/run.py``; it is a
guard against running unreviewed package code by name, not a sandbox (a
command that first ``cd``s into the skill or builds the path at run time is
not seen). docs/packages.md.
"""
from __future__ import annotations

import os
import shlex
import stat

from .registry_file import REGISTRY_FILE, scripts_allowed

MAX_WORDS = 256
MAX_UP = 12


def _words(command: str) -> list[str]:
    try:
        lex = shlex.shlex(command, posix=True, punctuation_chars=";&|()<>")
        lex.whitespace_split = True
        words = list(lex)
    except ValueError:                 # unbalanced quotes: fall back to whitespace
        words = command.split()
    out = []
    for w in words[:MAX_WORDS]:
        out.append(w)
        if "=" in w:                   # VAR=path and --opt=path
            out.append(w.split("=", 1)[1])
    return out


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


def blocked_script(command: str, cwd) -> str | None:
    """The reason ``command`` may not run, or None."""
    cwd = os.fspath(cwd)
    for w in _words(command):
        if not w or w.startswith("-") and "/" not in w:
            continue
        path = os.path.normpath(os.path.join(cwd, os.path.expanduser(w)))
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):
                continue
        except (OSError, ValueError):
            continue
        skill = _package_dir(path)
        if skill is not None and not scripts_allowed(skill):
            return (f"{w}: belongs to the installed skill {os.path.basename(skill)!r}, whose scripts "
                    f"agents may not run (reinstall it with --allow-scripts to allow)")
    return None
