"""Creating and deleting skills on disk (atomic, race-safe, confined)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from .builtins import template
from .model import BadSkillName, Skill, SkillError, SkillExists, SkillNotFound
from .parse import (
    MAX_SKILL_MD_BYTES, SKILL_FILE, SkillParseError, check_name, decode_skill_md, name_key,
    parse_skill_md, validate_frontmatter,
)

DEFAULT_DESCRIPTION = "Describe what this skill does and when to use it."


def skill_template(name: str, description: str | None = None) -> str:
    desc = (description or DEFAULT_DESCRIPTION).strip()
    if "\n" in desc or len(desc) > 1024:
        raise SkillError("description must be one line of at most 1024 characters")
    quoted = '"' + desc.replace("\\", "\\\\").replace('"', '\\"') + '"'
    title = name.replace("-", " ").capitalize()
    return (template("SKILL.md").replace("__NAME__", name)
            .replace("__DESCRIPTION__", quoted).replace("__TITLE__", title))


def check_new_name(name: str) -> None:
    """A new skill's name must satisfy the spec (so it validates strictly)."""
    if not isinstance(name, str) or "/" in name or "\x00" in name or name in (".", ".."):
        raise BadSkillName(f"invalid skill name {str(name)[:80]!r}: no path separators")
    errors = check_name(name)
    if errors:
        raise BadSkillName(f"invalid skill name {name[:80]!r}: {errors[0]}")


def create_skill(name: str, scope_root: Path, *, description: str | None = None,
                 text: str | bytes | None = None, confine: Path | None = None) -> Path:
    """Create ``<scope_root>/<name>/SKILL.md`` from ``text`` or the template.

    The text must pass strict validation with ``name`` as its directory.
    Exactly one of several concurrent creators of the same name succeeds; the
    others get SkillExists. With ``confine`` (the project directory, for the
    project scope) the scope root may not be a symlink leading out of it.
    The name is stored in its normal form (``name_key``: NFKC), so a name
    typed decomposed (NFD) makes the same directory as one typed composed.
    Returns the new skill directory.
    """
    if isinstance(name, str):
        name = name_key(name)
    check_new_name(name)
    if text is None:
        content = skill_template(name, description)
    else:
        if isinstance(text, bytes):
            if len(text) > MAX_SKILL_MD_BYTES:
                raise SkillError(f"SKILL.md is {len(text)} bytes; the cap is {MAX_SKILL_MD_BYTES}")
            try:
                content = decode_skill_md(text)
            except SkillParseError as exc:
                raise SkillError(str(exc)) from None
        else:
            content = text
        if len(content.encode("utf-8", "surrogatepass")) > MAX_SKILL_MD_BYTES:
            raise SkillError(f"SKILL.md is larger than {MAX_SKILL_MD_BYTES} bytes")
    try:
        fm, _ = parse_skill_md(content)
    except SkillParseError as exc:
        raise SkillError(str(exc)) from None
    errors = validate_frontmatter(fm, name)
    if errors:
        raise SkillError(f"invalid SKILL.md: {errors[0]}" + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""))
    root = Path(scope_root)
    root.mkdir(parents=True, exist_ok=True)
    if confine is not None:
        from .model import is_within
        if not is_within(os.path.realpath(root), os.path.realpath(confine)):
            raise SkillError(f"{root} is a symlink that leaves the project")
    target = root / name
    twin = _same_name(root, name)
    if twin is not None:
        raise SkillExists(f'skill "{name}" already exists at {root / twin} (the same name, '
                          f'written another way)')
    try:
        os.mkdir(target, 0o755)        # the atomic claim: one creator wins
    except FileExistsError:
        raise SkillExists(f'skill "{name}" already exists at {target}') from None
    tmp = target / f".{SKILL_FILE}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(content)
        os.replace(tmp, target / SKILL_FILE)
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    return target


def _same_name(root: Path, name: str) -> str | None:
    """A directory in ``root`` whose name is ``name`` in another Unicode form."""
    try:
        with os.scandir(root) as it:
            for entry in it:
                if entry.name != name and not entry.name.startswith(".") and name_key(entry.name) == name:
                    return entry.name
    except OSError:
        return None
    return None


def delete_skill(resolution, name: str) -> Skill:
    """Delete the winning copy of ``name`` (valid or not); returns it.

    A symlinked skill directory loses only its link, never the target.
    Concurrent deletes: one succeeds, the others get SkillNotFound.
    """
    if not name or "/" in name or name in (".", "..") or "\x00" in name:
        raise BadSkillName(f"invalid skill name {str(name)[:80]!r}")
    skill = resolution.lookup(name)      # the frontmatter name, else the directory name
    if skill is None:
        raise SkillNotFound(f'skill "{name}" not found')
    path = skill.path
    if path.parent != skill.root or path.name != skill.name:
        raise SkillError(f"refusing to delete {path}: not inside {skill.root}")
    if path.is_symlink():
        try:
            path.unlink()
        except FileNotFoundError:
            raise SkillNotFound(f'skill "{name}" not found') from None
        return skill
    # Rename first (atomic: one deleter wins), then remove at leisure.
    grave = skill.root / f".{skill.name}.deleted-{os.getpid()}-{id(skill)}"
    try:
        os.rename(path, grave)
    except FileNotFoundError:
        raise SkillNotFound(f'skill "{name}" not found') from None
    shutil.rmtree(grave, ignore_errors=True)
    return skill
