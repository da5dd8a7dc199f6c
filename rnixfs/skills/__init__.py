"""Skills: SKILL.md parsing and validation, four-path resolution, trust.

API (everything the kernel and the FUSE layer need; no pyfuse3, no trio)::

    # resolution (metadata only; bodies load on demand)
    resolve_skills(project: Path | None, config_dir: Path, *, ancestors=False,
                   warn: Callable[[str], None] | None = None, home: Path | None = None,
                   scope: "project" | "user" | None = None,
                   max_depth=6, max_dirs=2000, skip_dirs=(".git", "node_modules")) -> Resolution
        Resolution.winners: dict[dir, Skill]       every directory name's winning copy (valid or not)
        Resolution.by_name: dict[name, Skill]      reference (frontmatter, NFKC) name -> copy
        Resolution.skills: dict[name, Skill]       the loadable ones of by_name
        Resolution.shadowed: dict[name, list[Skill]]
        Resolution.paths: list[ScopePath]          roots with status (not-found | existed-but-empty |
                                                   existed-non-empty | unreadable (...))
        Resolution.diagnostics: Diagnostics        .warnings (shadow) .skipped .lenient .trust
        Resolution.trusted -> bool | None          None when no project root exists
        Resolution.lookup(name) -> Skill | None    by frontmatter name, else directory (valid or not)
        Resolution.get(name) -> Skill | None       loadable copy or None (via lookup)
        Resolution.require(name) -> Skill          raises SkillNotFound / SkillInvalid (via lookup)
        Resolution.describe(name) -> dict | None   scope, namespace, path, version, source,
                                                   shadowed, trust, diagnostics (via lookup)
        Resolution.describe_dir(dir) -> dict | None  the same by directory name (for xattrs)
        Resolution.to_json() -> {"skills": [...], "diagnostics": {...}}   (skill list --json)
        Resolution.warning_lines() -> list[str]    Rnix's stderr lines
    skill_roots(project, config_dir, *, home=None) -> list[ScopePath]   the canonical 2 or 4 roots
    write_scope(project: Path | None, config_dir: Path, kind="skills"|"agents", *, shared=False)
        project native when a project is given, else user native; shared: the .agents namespace
    find_project(start: Path, *, home=None) -> Path | None   nearest dir with .rnix/ (not above $HOME)

    Skill: name (directory name), declared_name, ref_name (NFKC frontmatter name), description, license, compatibility,
           metadata, allowed_tools (normalized), allowed_tools_declared, synergy,
           scope ("project"|"user"), namespace ("native"|"agents"), path, root, skill_md,
           version (metadata.version or ""), source ("builtin" or ""), valid, error,
           lenient; body() -> str (read once, then frozen); resources() -> list[str] (every file);
           read_resource(rel, limit) -> bytes (confined to the skill directory)

    # SKILL.md
    parse_skill_md(text) -> (frontmatter: dict, body: str)
        raises SkillParseError: "SKILL.md must start with ---" | "SKILL.md missing closing ---"
                                | "yaml parse error: ..."
    validate_strict(path) -> list[str]        [] = valid; agrees with `skills-ref validate`
    check_name(name, dir_name=None) -> list[str]

    # tools
    normalize_tools(values) -> list[str]      /dev/fs -> Read Write Edit Glob Grep, /dev/shell -> Bash
    union_tools(*groups) -> list[str]         sorted union; [] = unrestricted

    # trust
    is_trusted(project_dir) -> bool           .rnix/state/trusted is a regular file (not a symlink)

    # management
    ensure_builtins(config_dir) -> list[str]  extract built-ins once; never overwrites user edits
    create_skill(name, scope_root, *, description=None, text=None, confine=None) -> Path
        strict-valid SKILL.md only; atomic (one of N concurrent creators wins)
    delete_skill(resolution, name) -> Skill

Errors derive from SkillError (one readable line in ``str()``).
"""
from .builtins import ensure_builtins
from .manage import create_skill, delete_skill, skill_template
from .model import (
    BadSkillName, Skill, SkillError, SkillExists, SkillInvalid, SkillNotFound,
)
from .parse import (
    ALLOWED_FIELDS, MAX_SKILL_MD_BYTES, SKILL_FILE, LenientWarning, SkillParseError,
    check_name, parse_skill_md, validate_strict,
)
from .resolve import (
    AGENTS, NATIVE, PROJECT, USER, Diagnostics, Resolution, ScopePath, ShadowWarning,
    SkipEntry, find_project, resolve_skills, skill_roots, write_scope,
)
from .tool_names import DEVICE_TOOLS, KNOWN_TOOLS, normalize_tools, union_tools
from .trust import TRUST_MARKER, TrustWarning, is_trusted

__all__ = [
    "ALLOWED_FIELDS", "AGENTS", "BadSkillName", "DEVICE_TOOLS", "Diagnostics", "KNOWN_TOOLS",
    "LenientWarning", "MAX_SKILL_MD_BYTES", "NATIVE", "PROJECT", "Resolution", "SKILL_FILE",
    "ScopePath", "ShadowWarning", "SkipEntry", "Skill", "SkillError", "SkillExists",
    "SkillInvalid", "SkillNotFound", "SkillParseError", "TRUST_MARKER", "TrustWarning", "USER",
    "check_name", "create_skill", "delete_skill", "ensure_builtins", "find_project",
    "is_trusted", "normalize_tools", "parse_skill_md", "resolve_skills", "skill_roots",
    "skill_template", "union_tools", "validate_strict", "write_scope",
]
