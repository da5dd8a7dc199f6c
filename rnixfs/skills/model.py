"""A skill as found on disk: metadata now, body and resources on demand."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..fileio import NotRegularFile, read_regular
from .parse import (
    SKILL_FILE, LenientSkip, LenientWarning, SkillParseError, lenient_check,
    parse_skill_md, read_skill_md,
)
from .tools import normalize_tools, split_tools

RESOURCE_DIRS = ("scripts", "references", "assets")
MAX_RESOURCE_BYTES = 8 << 20
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


def is_within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


@dataclass(eq=False)
class Skill:
    """One copy of a skill: the directory ``path`` found under scope ``root``.

    ``name`` is the directory name (the key everything resolves by); the
    frontmatter's own ``name`` is ``declared_name``. ``error`` is set when the
    copy is not loadable (the seeds' skip tier); ``lenient`` holds the
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
    metadata: dict[str, str] = field(default_factory=dict)
    allowed_tools_declared: list[str] = field(default_factory=list)
    allowed_tools: list[str] = field(default_factory=list)
    synergy: list[dict] = field(default_factory=list)
    source: str = ""                # "builtin" when extracted from the package, "community" when installed
    installed_version: str = ""     # the version its .registry.yaml records (installed packages)
    error: str | None = None        # skip reason; None = loadable
    lenient: list[LenientWarning] = field(default_factory=list)
    confine: str | None = None      # realpath the copy must stay inside (project scope)
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

    # --- loading -----------------------------------------------------------------

    def _checked_md(self) -> Path:
        """SKILL.md path after the confinement check (project scope)."""
        if self.confine is not None:
            real_dir = os.path.realpath(self.path)
            if not is_within(real_dir, self.confine):
                raise SkillParseError("skill directory is a symlink that leaves the project")
            real_md = os.path.realpath(self.skill_md)
            if not is_within(real_md, self.confine):
                raise SkillParseError("SKILL.md is a symlink that leaves the project")
        return self.skill_md

    def load_metadata(self) -> Skill:
        """Parse the frontmatter (lenient tiers); sets ``error``/``lenient``."""
        try:
            fm, _ = parse_skill_md(read_skill_md(self._checked_md()))
            self.lenient = lenient_check(fm, self.name, str(self.path))
        except (SkillParseError, LenientSkip) as exc:
            self.error = getattr(exc, "reason", None) or str(exc)
            return self
        self.declared_name = fm["name"]
        self.description = fm["description"].strip()
        self.license = fm.get("license") or None
        self.compatibility = fm.get("compatibility") or None
        meta = fm.get("metadata")
        self.metadata = dict(meta) if isinstance(meta, dict) else {}
        self.allowed_tools_declared = split_tools(fm.get("allowed-tools"))
        self.allowed_tools = normalize_tools(self.allowed_tools_declared)
        syn = fm.get("synergy")
        self.synergy = [{"with": s["with"].strip(), "instruction": s.get("instruction", "")}
                        for s in syn] if isinstance(syn, list) else []
        return self

    def body(self) -> str:
        """The Markdown body (read once, then frozen). Raises SkillInvalid."""
        if self._body is None:
            if self.error is not None:
                raise SkillInvalid(f'skill "{self.name}" is not loaded: {self.error}')
            try:
                _, body = parse_skill_md(read_skill_md(self._checked_md()))
            except SkillParseError as exc:
                raise SkillInvalid(f'skill "{self.name}" is not loaded: {exc}') from None
            self._body = body
        return self._body

    # --- resources -----------------------------------------------------------------

    def resources(self) -> list[str]:
        """Relative paths of the files under scripts/, references/, assets/."""
        base = os.path.realpath(self.path)
        if self.confine is not None and not is_within(base, self.confine):
            return []
        out: list[str] = []
        for top in RESOURCE_DIRS:
            start = os.path.join(base, top)
            for dirpath, dirnames, filenames in os.walk(start, followlinks=False):
                depth = os.path.relpath(dirpath, base).count(os.sep)
                if depth >= MAX_RESOURCE_DEPTH:
                    dirnames.clear()
                dirnames.sort()
                for fn in sorted(filenames):
                    full = os.path.join(dirpath, fn)
                    real = os.path.realpath(full)
                    if is_within(real, base) and os.path.isfile(real):
                        out.append(os.path.relpath(full, base))
                        if len(out) >= MAX_RESOURCES:
                            return out
        return out

    def read_resource(self, rel: str, limit: int = MAX_RESOURCE_BYTES) -> bytes:
        """Bytes of one file inside the skill directory (never outside it)."""
        if not rel or "\x00" in rel or os.path.isabs(rel) or ".." in Path(rel).parts:
            raise SkillError(f"bad resource path {rel!r}")
        base = os.path.realpath(self.path)
        if self.confine is not None and not is_within(base, self.confine):
            raise SkillError(f'skill "{self.name}" leaves its project')
        real = os.path.realpath(os.path.join(base, rel))
        if not is_within(real, base) or real == base:
            raise SkillError(f"resource {rel!r} leaves the skill directory")
        try:
            data, size = read_regular(real, limit)
        except NotRegularFile:
            raise SkillError(f"resource {rel!r} is not a regular file") from None
        except OSError as exc:
            raise SkillError(f"resource {rel!r}: {exc.strerror}") from None
        if size > limit:
            raise SkillError(f"resource {rel!r} is {size} bytes; the cap is {limit}")
        if len(data) > limit:
            raise SkillError(f"resource {rel!r} is more than {limit} bytes")
        return data

    # --- views ---------------------------------------------------------------------

    def to_json(self) -> dict:
        d = {
            "name": self.name,
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
