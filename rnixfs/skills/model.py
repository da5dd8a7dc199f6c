"""A skill as found on disk: metadata now, body and resources on demand."""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ..fileio import NotRegularFile, ScopeEscape, confined_dir, read_below, read_in_scope
from .parse import (
    MAX_SKILL_MD_BYTES, SKILL_FILE, LenientSkip, LenientWarning, SkillParseError, check_synergy,
    decode_skill_md, lenient_check, name_key, parse_skill_md,
)
from .tool_names import normalize_tools, split_tools

MAX_RESOURCE_BYTES = 8 << 20
MAX_SCANNED = 20000
MAX_RESOURCES = 2000
MAX_RESOURCE_DEPTH = 8


class SkillError(Exception):
    """A skill operation failed; ``str()`` is one readable line."""


class SkillNotFound(SkillError):
    pass


class SkillInvalid(SkillError):
    """The winning copy exists but is not loadable (its SKILL.md is invalid)."""


class SkillExists(SkillError):
    pass


class BadSkillName(SkillError):
    pass


def _text(value) -> str | None:
    return value if isinstance(value, str) and value else None


def is_within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def scope_root_of(root: Path, scope: str) -> Path:
    """The directory nothing of a skill root may leave (docs/skills.md):
    the project for ``<project>/.rnix/skills`` and ``<project>/.agents/skills``,
    the parent for a user root (``<config_dir>/skills`` -> ``<config_dir>``,
    ``~/.agents/skills`` -> ``~/.agents``)."""
    root = Path(os.path.abspath(root))
    return root.parent.parent if scope == "project" else root.parent


def read_skill_md_in(scope_root: Path, skill_md: Path, cap: int = MAX_SKILL_MD_BYTES) -> str:
    """SKILL.md text, walked fd-relative from the scope root (race-free: a
    directory swapped for a symlink cannot make it read a file outside).
    Raises SkillParseError with a readable reason."""
    try:
        data, size = read_in_scope(scope_root, skill_md, cap)
    except ScopeEscape:
        leaves = "the project" if skill_md.parent.parent.parent.parent == scope_root else "its scope"
        try:  # say which part leads out: the directory or the file
            read_in_scope(scope_root, skill_md.parent, 0)
        except ScopeEscape:
            raise SkillParseError(f"skill directory is a symlink that leaves {leaves}") from None
        except OSError:
            pass
        raise SkillParseError(f"SKILL.md is a symlink that leaves {leaves}") from None
    except FileNotFoundError:
        raise SkillParseError("missing SKILL.md") from None
    except NotRegularFile:
        raise SkillParseError("SKILL.md is not a regular file") from None
    except OSError as exc:
        raise SkillParseError(f"cannot read SKILL.md: {exc.strerror or exc}") from None
    if size > cap:
        raise SkillParseError(f"SKILL.md is {size} bytes; the cap is {cap}")
    if len(data) > cap:
        raise SkillParseError(f"SKILL.md is more than {cap} bytes")
    return decode_skill_md(data)


@dataclass(eq=False)
class Skill:
    """One copy of a skill: the directory ``path`` found under scope ``root``.

    ``name`` is the directory name (the mount tree and ``delete`` go by it);
    the frontmatter's own ``name`` is ``declared_name`` and its normal form,
    ``ref_name``, is what ``skill list``, agent manifests and lookups use. ``error`` is set when the
    copy is not loadable (Rnix's skip tier); ``lenient`` holds the
    warn-but-load warnings. ``body()`` reads the Markdown body on first call
    and keeps it, so a process sees one frozen body.
    """

    name: str
    path: Path
    scope: str                      # "project" | "user"
    namespace: str                  # "native" | "agents"
    root: Path
    declared_name: str | None = None
    description: str = ""
    license: str | None = None
    compatibility: str | None = None
    metadata: dict[str, object] = field(default_factory=dict)   # as written (Rnix-style lists kept)
    allowed_tools_declared: list[str] = field(default_factory=list)
    allowed_tools: list[str] = field(default_factory=list)
    synergy: list[dict] = field(default_factory=list)
    source: str = ""                # "builtin" when extracted from the package, "community" when installed
    installed_version: str = ""     # the version its .registry.yaml records (installed packages)
    error: str | None = None        # skip reason; None = loadable
    lenient: list[LenientWarning] = field(default_factory=list)
    confine: str | None = None      # realpath the copy must stay inside (project scope)
    disable_model_invocation: bool = False  # only a user/agent.yaml loads it, never the model
    _body: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        """An installed package's VERSION and SOURCE come from its .registry.yaml."""
        from .packages.registry_file import apply_package_info
        apply_package_info(self)

    # --- identity ----------------------------------------------------------------

    @property
    def skill_md(self) -> Path:
        return self.path / SKILL_FILE

    @property
    def version(self) -> str:
        if self.installed_version:
            return self.installed_version
        v = self.metadata.get("version", "")
        return v if isinstance(v, str) else ""

    @property
    def valid(self) -> bool:
        return self.error is None

    @property
    def ref_name(self) -> str:
        """The name a skill is referred to by: its frontmatter ``name`` in the
        normal form (:func:`name_key`), or the directory name when the copy is
        not loadable and has none."""
        return name_key(self.declared_name) if self.declared_name else self.name

    # --- loading -----------------------------------------------------------------

    @property
    def scope_root(self) -> Path:
        return scope_root_of(self.root, self.scope)

    def _read_md(self) -> str:
        """SKILL.md, read confined to the scope root (docs/skills.md)."""
        return read_skill_md_in(self.scope_root, self.skill_md)

    def load_metadata(self) -> Skill:
        """Parse the frontmatter (lenient tiers); sets ``error``/``lenient``."""
        try:
            fm, _ = parse_skill_md(self._read_md())
            self.lenient = lenient_check(fm, self.name, str(self.path))
        except (SkillParseError, LenientSkip) as exc:
            self.error = getattr(exc, "reason", None) or str(exc)
            return self
        self.declared_name = fm["name"]
        self.description = fm["description"].strip()
        self.license = _text(fm.get("license"))
        self.compatibility = _text(fm.get("compatibility"))
        meta = fm.get("metadata")
        self.metadata = dict(meta) if isinstance(meta, dict) else {}
        self.allowed_tools_declared = split_tools(fm.get("allowed-tools"))
        self.allowed_tools = normalize_tools(self.allowed_tools_declared)
        dmi = fm.get("disable-model-invocation")
        self.disable_model_invocation = dmi is True or (isinstance(dmi, str) and dmi.strip().lower() == "true")
        syn = fm.get("synergy")
        self.synergy = [{"with": s["with"].strip(), "instruction": s.get("instruction", "")}
                        for s in syn] if isinstance(syn, list) and not check_synergy(syn) else []
        return self

    def body(self) -> str:
        """The Markdown body (read once, then frozen). Raises SkillInvalid."""
        if self._body is None:
            if self.error is not None:
                raise SkillInvalid(f'skill "{self.name}" is not loaded: {self.error}')
            try:
                _, body = parse_skill_md(self._read_md())
            except SkillParseError as exc:
                raise SkillInvalid(f'skill "{self.name}" is not loaded: {exc}') from None
            self._body = body
        return self._body

    # --- resources -----------------------------------------------------------------

    def resources(self) -> list[str]:
        """Relative paths of every file of the skill except its SKILL.md, sorted.

        Bounded (``MAX_RESOURCES`` files, ``MAX_RESOURCE_DEPTH`` levels,
        ``MAX_SCANNED`` directory entries). Dot-files and dot-directories
        (``.git``, ``.DS_Store``) are not listed. A symlink is listed (by its
        own path) or descended into only when its target stays inside the
        skill directory; each real directory is walked once (no loops). The
        skill is reached by the race-free walk from its scope root and walked
        confined to itself: a swap never lists an outside directory.
        """
        from ..devices.fs import FsError

        try:
            ws = confined_dir(self.scope_root, self.path)
        except OSError:        # leaves its scope, or gone
            return []
        out: list[str] = []
        seen: set[tuple[int, int]] = set()
        scanned = 0
        stack = [("", 0)]
        with ws:
            while stack:
                rel_dir, depth = stack.pop()
                try:
                    st = ws.stat(rel_dir)
                    if (st.st_dev, st.st_ino) in seen:
                        continue
                    seen.add((st.st_dev, st.st_ino))
                    entries = ws.entries(rel_dir)
                except (FsError, OSError):
                    continue
                subdirs = []
                for name, lst in entries:
                    scanned += 1
                    if scanned > MAX_SCANNED:
                        return sorted(out)
                    if name.startswith("."):
                        continue
                    rel = os.path.join(rel_dir, name) if rel_dir else name
                    if stat.S_ISLNK(lst.st_mode):
                        try:   # followed only while inside the skill
                            lst = ws.stat(rel)
                        except (FsError, OSError):
                            continue
                    if stat.S_ISDIR(lst.st_mode):
                        if depth + 1 < MAX_RESOURCE_DEPTH:
                            subdirs.append((rel, depth + 1))
                    elif stat.S_ISREG(lst.st_mode) and rel != SKILL_FILE:
                        out.append(rel)
                        if len(out) >= MAX_RESOURCES:
                            return sorted(out)
                stack.extend(reversed(subdirs))
        return sorted(out)

    def read_resource(self, rel: str, limit: int = MAX_RESOURCE_BYTES) -> bytes:
        """Bytes of one file inside the skill directory (never outside it)."""
        if not rel or "\x00" in rel or os.path.isabs(rel) or ".." in Path(rel).parts:
            raise SkillError(f"bad resource path {rel!r}")
        try:  # walked fd-relative: the skill from its scope root, the file from the skill
            data, size = read_below(self.scope_root, self.path, rel, limit)
        except ScopeEscape:
            raise SkillError(f"resource {rel!r} leaves the skill directory") from None
        except NotRegularFile:
            raise SkillError(f"resource {rel!r} is not a regular file") from None
        except OSError as exc:
            raise SkillError(f"resource {rel!r}: {exc.strerror or exc}") from None
        if size > limit:
            raise SkillError(f"resource {rel!r} is {size} bytes; the cap is {limit}")
        if len(data) > limit:
            raise SkillError(f"resource {rel!r} is more than {limit} bytes")
        return data

    # --- views ---------------------------------------------------------------------

    def to_json(self) -> dict:
        d = {
            "name": self.ref_name,
            "directory": self.name,
            "declared_name": self.declared_name,
            "description": self.description,
            "version": self.version,
            "path": str(self.path),
            "scope": self.scope,
            "namespace": self.namespace,
            "source": self.source,
            "license": self.license,
            "compatibility": self.compatibility,
            "metadata": self.metadata,
            "allowed_tools": self.allowed_tools,
            "synergy": self.synergy,
            "valid": self.valid,
        }
        if self.error is not None:
            d["error"] = self.error
        if self.lenient:
            d["lenient"] = [w.to_json() for w in self.lenient]
        return d
