"""Finding skills inside a downloaded tree (a repository or an archive).

As vercel-labs/skills does: a SKILL.md at the root is the one skill;
otherwise the root's children, ``skills/``, ``.agents/skills/`` and
``.claude/skills/`` are searched, and if that finds nothing the whole tree
is searched (at most MAX_DEPTH levels, never into ``.git`` or
``node_modules``, never into a skill found, never through a symlink).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..parse import SKILL_FILE, SkillParseError, parse_skill_md, read_skill_md

MAX_DEPTH = 6
MAX_DIRS = 5000
SKIP = {".git", "node_modules"}
PLACES = ("", "skills", ".agents/skills", ".claude/skills")


@dataclass
class Found:
    name: str            # frontmatter name when it has one, else the directory name
    path: Path
    rel: str             # path inside the tree ("" for the root)


def _has_skill_md(d: Path) -> bool:
    p = d / SKILL_FILE
    return p.is_file() and not p.is_symlink()


def _found(d: Path, tree: Path) -> Found:
    name = d.name
    try:
        fm, _ = parse_skill_md(read_skill_md(d / SKILL_FILE))
        if isinstance(fm.get("name"), str) and fm["name"].strip():
            name = fm["name"].strip()
    except SkillParseError:
        pass
    rel = d.relative_to(tree).as_posix()
    return Found(name, d, "" if rel == "." else rel)


def _children(d: Path) -> list[Path]:
    try:
        return sorted(p for p in d.iterdir() if p.is_dir() and not p.is_symlink() and p.name not in SKIP)
    except OSError:
        return []


def discover(tree: Path) -> list[Found]:
    tree = Path(tree)
    if _has_skill_md(tree):
        return [_found(tree, tree)]
    out: list[Found] = []
    seen: set[Path] = set()
    for place in PLACES:
        d = tree / place if place else tree
        if d.is_symlink() or not d.is_dir():
            continue
        for c in _children(d):
            if c not in seen and _has_skill_md(c):
                seen.add(c)
                out.append(_found(c, tree))
    if out:
        return out
    count = 0
    stack = [(tree, 0)]
    while stack:
        d, depth = stack.pop()
        for c in _children(d):
            count += 1
            if count > MAX_DIRS:
                return out
            if _has_skill_md(c):
                out.append(_found(c, tree))
            elif depth + 1 < MAX_DEPTH:
                stack.append((c, depth + 1))
    return sorted(out, key=lambda f: f.rel)


def find_in_tree(tree: Path, path: str | None, source: str) -> list[Found]:
    """Skills at ``path`` inside the tree (or, if no such directory, named ``path``)."""
    from .package_errors import NotFound, UsageError

    if not path:
        found = discover(tree)
        if not found:
            raise NotFound(f"{source}: no SKILL.md found (searched the root, skills/, .agents/skills/, "
                           ".claude/skills/ and below)")
        return found
    parts = [p for p in path.strip("/").split("/") if p]
    if any(p in ("..", ".") for p in parts):
        raise UsageError(f"{source}: path {path!r} may not contain '.' or '..'")
    sub = tree.joinpath(*parts)
    real_tree = os.path.realpath(tree)
    if sub.is_dir() and os.path.realpath(sub).startswith(real_tree + os.sep):
        found = discover(sub)
        for f in found:
            f.rel = sub.joinpath(f.rel).relative_to(tree).as_posix() if f.rel else sub.relative_to(tree).as_posix()
        if found:
            return found
    named = [f for f in discover(tree) if f.name == parts[-1] or f.path.name == parts[-1]]
    if named:
        return named[:1]
    raise NotFound(f"{source}: no skill at {path!r} (no such directory holding a SKILL.md, and no skill by that name)")
