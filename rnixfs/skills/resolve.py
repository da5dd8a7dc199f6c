"""The four-path model: where skills live, which copy wins, what went wrong.

Skill roots in priority order (Rnix's ``ResolveSkillScopes``)::

    1. <project>/.rnix/skills      project / native   (highest)
    2. <project>/.agents/skills    project / agents
    3. <config_dir>/skills         user    / native   (~/.config/rnix/skills)
    4. $HOME/.agents/skills        user    / agents   (lowest)

project > user across scopes, native > agents within a scope. For each
directory name the copy in the highest-priority root wins and replaces the
others whole (no field merging); every shadowed copy is one warning. The
winner is the winner even when its SKILL.md is invalid: then the name is not
loadable and the reason is in the diagnostics (a broken project copy never
silently falls back to a user copy).

With ``ancestors=True`` the project's parents are searched too (monorepos):
at most 6 levels, at most 2000 stats, stopping at a directory holding
``.git`` (after searching it), at ``$HOME`` and at ``/``; levels named
``.git`` or ``node_modules`` are skipped; truncation is warned about.
"""
from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from .model import Skill, SkillInvalid, SkillNotFound, is_within
from .parse import LenientWarning, goquote, name_key
from .trust import TrustWarning, check_trust, trust_line

PROJECT, USER = "project", "user"
NATIVE, AGENTS = "native", "agents"
MAX_ANCESTOR_DEPTH = 6
MAX_DIRS = 2000
SKIP_DIRS = (".git", "node_modules")
MAX_SKILLS_PER_ROOT = 4096


@dataclass(frozen=True)
class ScopePath:
    """One skill root: its path, scope, namespace and what a stat found."""

    path: Path
    scope: str
    namespace: str
    status: str = "not-found"    # not-found | existed-but-empty | existed-non-empty | unreadable (...)
    ancestor: bool = False

    @property
    def exists(self) -> bool:
        return self.status in ("existed-but-empty", "existed-non-empty")

    def to_json(self) -> dict:
        return {"path": str(self.path), "scope": self.scope, "namespace": self.namespace,
                "status": self.status, "ancestor": self.ancestor}


def path_status(path: Path) -> str:
    """Rnix's pathStatus, except that errors other than ENOENT/ENOTDIR say so."""
    try:
        st = os.stat(path)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return "not-found"
        return f"unreadable ({exc.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return "not-found"
    try:
        with os.scandir(path) as it:
            for entry in it:
                if not entry.name.startswith(".") and _is_dir(entry):
                    return "existed-non-empty"
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    return "existed-but-empty"


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()   # follows symlinks
    except OSError:
        return False


def home_dir(home: Path | None = None) -> Path:
    if home is not None:
        return Path(home)
    return Path(os.environ.get("HOME") or os.path.expanduser("~"))


def skill_roots(project: Path | None, config_dir: Path, *, home: Path | None = None) -> list[ScopePath]:
    """The canonical roots (four with a project, two without), with status."""
    roots = []
    if project is not None:
        p = Path(os.path.abspath(project))
        roots += [(p / ".rnix" / "skills", PROJECT, NATIVE), (p / ".agents" / "skills", PROJECT, AGENTS)]
    roots += [(Path(os.path.abspath(config_dir)) / "skills", USER, NATIVE),
              (home_dir(home) / ".agents" / "skills", USER, AGENTS)]
    return [ScopePath(path, scope, ns, path_status(path)) for path, scope, ns in roots]


def find_project(start: Path, *, home: Path | None = None) -> Path | None:
    """Nearest directory at or above ``start`` holding ``.rnix/`` (not above $HOME)."""
    d = Path(os.path.abspath(start))
    h = home_dir(home)
    while True:
        if (d / ".rnix").is_dir():
            return d
        if d == h or d.parent == d:
            return None
        d = d.parent


def write_scope(project: Path | None, config_dir: Path, kind: str = "skills", *,
                shared: bool = False, home: Path | None = None) -> ScopePath:
    """Where a new skill/agent goes: project native if a project is given, else user native.

    ``shared`` (skills only) picks the scope's ``.agents/skills`` namespace
    instead, the one other agent tools read too.
    """
    if kind not in ("skills", "agents"):
        raise ValueError("kind must be 'skills' or 'agents'")
    if shared:
        if kind != "skills":
            raise ValueError("only skills have a shared (.agents) namespace")
        base = Path(os.path.abspath(project)) if project is not None else home_dir(home)
        path = base / ".agents" / "skills"
        return ScopePath(path, PROJECT if project is not None else USER, AGENTS, path_status(path))
    if project is not None:
        path = Path(os.path.abspath(project)) / ".rnix" / kind
        return ScopePath(path, PROJECT, NATIVE, path_status(path))
    path = Path(os.path.abspath(config_dir)) / kind
    return ScopePath(path, USER, NATIVE, path_status(path))


# --- diagnostics ------------------------------------------------------------------


@dataclass(frozen=True)
class ShadowWarning:
    skill_name: str
    winning_path: str
    winning_scope: str
    winning_ns: str
    shadowed_path: str
    shadowed_scope: str
    shadowed_ns: str

    def to_json(self) -> dict:
        return dict(self.__dict__)

    def line(self) -> str:
        return (f"[skill] warning: shadowed skill {goquote(self.skill_name)}: "
                f"winner={self.winning_path} ({self.winning_scope}/{self.winning_ns}); "
                f"shadowed={self.shadowed_path} ({self.shadowed_scope}/{self.shadowed_ns})")


@dataclass(frozen=True)
class SkipEntry:
    path: str
    reason: str

    def to_json(self) -> dict:
        return {"path": self.path, "reason": self.reason}

    def line(self) -> str:
        return f"[skill] warning: skipped skill at {self.path}: {self.reason}"


def lenient_line(w: LenientWarning) -> str:
    return f"[skill] warning: {w.path}: {w.field}: {w.reason} ({w.detail})"


@dataclass
class Diagnostics:
    """Rnix's LoadDiagnostics: four channels, rendered in this order."""

    warnings: list[ShadowWarning] = field(default_factory=list)
    skipped: list[SkipEntry] = field(default_factory=list)
    lenient: list[LenientWarning] = field(default_factory=list)
    trust: list[TrustWarning] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)   # e.g. the truncation warning

    def to_json(self) -> dict:
        """Empty channels are omitted; all empty gives ``{}``."""
        out = {}
        for key in ("warnings", "skipped", "lenient", "trust"):
            items = getattr(self, key)
            if items:
                out[key] = [i.to_json() for i in items]
        return out

    def lines(self) -> list[str]:
        return ([w.line() for w in self.warnings] + [s.line() for s in self.skipped]
                + [lenient_line(w) for w in self.lenient] + [trust_line(t) for t in self.trust])

    def __bool__(self) -> bool:
        return bool(self.warnings or self.skipped or self.lenient or self.trust)


# --- resolution -------------------------------------------------------------------


@dataclass
class Resolution:
    """What ``resolve_skills`` found.

    ``winners`` maps every skill *directory* name to its winning copy (valid
    or not): the mount tree, ``delete`` and the extended attributes go by
    it. ``by_name`` maps every *reference* name (the frontmatter ``name`` in
    its normal form, see ``Skill.ref_name``) to the copy it refers to:
    ``skill list``, ``skill show``, agent manifests and the Skill tool go by
    it. ``skills`` holds the loadable ones of ``by_name``.
    """

    project: Path | None
    config_dir: Path
    paths: list[ScopePath]
    winners: dict[str, Skill]
    shadowed: dict[str, list[Skill]]
    diagnostics: Diagnostics
    truncated: bool = False
    by_name: dict[str, Skill] = field(default_factory=dict)

    @property
    def skills(self) -> dict[str, Skill]:
        """Loadable skills by reference name."""
        return {n: s for n, s in self.by_name.items() if s.valid}

    def names(self) -> list[str]:
        return sorted(self.skills)

    def lookup(self, name: str) -> Skill | None:
        """The copy ``name`` refers to, valid or not: by frontmatter name (in
        its normal form), else by directory name; None if neither."""
        if not isinstance(name, str) or not name.strip():
            return None
        s = self.by_name.get(name_key(name))
        return s if s is not None else self.winners.get(name)

    def get(self, name: str) -> Skill | None:
        s = self.lookup(name)
        return s if s is not None and s.valid else None

    def require(self, name: str) -> Skill:
        s = self.lookup(name)
        if s is None:
            raise SkillNotFound(f'skill "{name}" not found')
        if not s.valid:
            raise SkillInvalid(f'skill "{name}" is not loaded: {s.error}')
        return s

    @property
    def trusted(self) -> bool | None:
        """None without project roots; False if any project root is untrusted."""
        if not any(p.scope == PROJECT and p.exists for p in self.paths):
            return None
        return not self.diagnostics.trust

    def describe(self, name: str) -> dict | None:
        """Everything known about the skill ``name`` refers to (`skill show`)."""
        s = self.lookup(name)
        return None if s is None else self._describe(s)

    def describe_dir(self, directory: str) -> dict | None:
        """Everything known about the skill directory ``directory`` (extended attributes)."""
        s = self.winners.get(directory)
        return None if s is None else self._describe(s)

    def _describe(self, s: Skill) -> dict:
        d = s.to_json()
        d["shadowed"] = [{"path": str(c.path), "scope": c.scope, "namespace": c.namespace}
                         for c in self.shadowed.get(s.name, [])]
        trust = None
        if s.scope == PROJECT:
            from .trust import is_trusted, project_dir_of
            pd = project_dir_of(s.root, s.namespace)
            trust = "trusted" if pd and is_trusted(pd) else "untrusted"
        d["trust"] = trust or "user"
        diag = []
        if s.error:
            diag.append(f"skipped: {s.error}")
        diag += [f"lenient: {w.field}: {w.reason} ({w.detail})" for w in s.lenient]
        d["diagnostics"] = diag
        return d

    def list_entries(self) -> list[dict]:
        """Rnix's ListEntry objects for the loadable skills, sorted by name."""
        return [{"name": n, "directory": s.name, "version": s.version, "path": str(s.path),
                 "description": s.description, "source": s.source, "scope": s.scope,
                 "namespace": s.namespace, "shadowed": False}
                for n, s in sorted(self.skills.items())]

    def to_json(self) -> dict:
        return {"skills": self.list_entries(), "diagnostics": self.diagnostics.to_json()}

    def warning_lines(self) -> list[str]:
        return list(self.diagnostics.notes) + self.diagnostics.lines()


class _Walker:
    def __init__(self, max_dirs: int, warn: Callable[[str], None] | None, notes: list[str]):
        self.count = 0
        self.max_dirs = max_dirs
        self.truncated = False
        self.warn = warn
        self.notes = notes

    def tick(self) -> bool:
        """Count one stat; False (and one warning) once the cap is passed."""
        if self.truncated:
            return False
        self.count += 1
        if self.count > self.max_dirs:
            self.truncated = True
            msg = (f"[skillscope] resolve_skills truncated: scanned {self.count - 1} dirs, "
                   f"returning partial results. Pass max_dirs=... to override.")
            self.notes.append(msg)
            return False
        return True


def _ancestor_roots(project: Path, home: Path, walker: _Walker, depth: int,
                    skip: tuple[str, ...]) -> list[ScopePath]:
    out: list[ScopePath] = []
    d = Path(os.path.abspath(project))
    if (d / ".git").exists():     # the project is itself a repository root
        return out
    for _ in range(depth):
        parent = d.parent
        if parent == d:
            break
        d = parent
        if d == home:
            break
        if d.name in skip:
            continue
        for sub, ns in ((".rnix", NATIVE), (".agents", AGENTS)):
            if not walker.tick():
                return out
            path = d / sub / "skills"
            status = path_status(path)
            if status != "not-found":
                out.append(ScopePath(path, PROJECT, ns, status, ancestor=True))
        if not walker.tick():
            return out
        if (d / ".git").exists():
            break
    return out


def _signature(path: Path) -> tuple:
    """What stat says of a skill directory and its SKILL.md: when none of it
    changed, the parse of last time still holds (docs/skills.md, caching)."""
    out = []
    for p, follow in ((path, False), (path, True), (path / "SKILL.md", False), (path / "SKILL.md", True)):
        try:
            st = os.stat(p, follow_symlinks=follow)
            out.append((st.st_dev, st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
        except OSError as exc:
            out.append(exc.errno)
    return tuple(out)


class SkillCache:
    """Parsed copies of skills, kept while their files do not change, so a
    re-resolution parses only the SKILL.md files that did. ``parses`` counts
    the SKILL.md parses done (tests and the bench read it)."""

    def __init__(self) -> None:
        self._entries: dict[tuple, tuple[tuple, Skill]] = {}
        self.parses = 0

    def load(self, skill: Skill) -> Skill:
        key = (str(skill.path), skill.scope, skill.namespace, str(skill.root), skill.source)
        sig = _signature(skill.path)
        hit = self._entries.get(key)
        if hit is not None and hit[0] == sig:
            return hit[1]
        self.parses += 1
        skill.load_metadata()
        self._entries[key] = (sig, skill)
        if len(self._entries) > 4 * MAX_SKILLS_PER_ROOT:   # stale copies of renamed skills
            self._entries.pop(next(iter(self._entries)))
        return skill


def _project_root_ok(root: ScopePath) -> str | None:
    """The realpath a project root must stay inside, or None if it leaves it
    (or is being swapped: realpath racing a swap raises EINVAL)."""
    try:
        confine = os.path.realpath(root.path.parent.parent)
        return confine if is_within(os.path.realpath(root.path), confine) else None
    except OSError:
        return None


def resolve_skills(
    project: Path | None,
    config_dir: Path,
    *,
    ancestors: bool = False,
    warn: Callable[[str], None] | None = None,
    home: Path | None = None,
    scope: str | None = None,
    max_depth: int = MAX_ANCESTOR_DEPTH,
    max_dirs: int = MAX_DIRS,
    skip_dirs: tuple[str, ...] = SKIP_DIRS,
    cache: SkillCache | None = None,
) -> Resolution:
    """Scan the skill roots and resolve every skill name to its winning copy.

    ``warn`` receives each diagnostic line (shadow, skipped, lenient, trust,
    truncation) in Rnix's format; diagnostics are recorded either way.
    ``scope`` ("project" or "user") restricts the roots before shadowing
    (``skill list -p/-g``). Only metadata is read; bodies load on demand.
    ``cache`` keeps parses between calls (only changed SKILL.md files are
    parsed again).
    """
    if scope not in (None, PROJECT, USER):
        raise ValueError("scope must be None, 'project' or 'user'")
    from .builtins import builtin_skill_dirs

    notes: list[str] = []
    walker = _Walker(max(1, max_dirs), warn, notes)
    h = home_dir(home)
    canonical = skill_roots(project, config_dir, home=h)
    for _ in canonical:
        walker.tick()
    roots = canonical[:2] if project is not None else []
    if project is not None and ancestors:
        roots += _ancestor_roots(Path(project), h, walker, max(1, max_depth), tuple(skip_dirs))
    roots += canonical[2:] if project is not None else canonical
    if scope is not None:
        roots = [r for r in roots if r.scope == scope]

    builtin_dirs = builtin_skill_dirs(config_dir)
    diag = Diagnostics(notes=notes)
    winners: dict[str, Skill] = {}
    shadowed: dict[str, list[Skill]] = {}
    for root in roots:
        if not root.exists:
            continue
        confine = None
        if root.scope == PROJECT:
            confine = _project_root_ok(root)
            if confine is None:
                diag.skipped.append(SkipEntry(str(root.path), "skill root is a symlink that leaves the project"))
                continue
        for name in _skill_dir_names(root.path, diag):
            skill = Skill(name=name, path=root.path / name, scope=root.scope, namespace=root.namespace,
                          root=root.path, confine=confine)
            win = winners.get(name)
            if win is None:
                if root.scope == USER and root.namespace == NATIVE and name in builtin_dirs:
                    skill.source = "builtin"
                winners[name] = cache.load(skill) if cache is not None else skill.load_metadata()
            else:
                shadowed.setdefault(name, []).append(skill)
                diag.warnings.append(ShadowWarning(name, str(win.path), win.scope, win.namespace,
                                                   str(skill.path), skill.scope, skill.namespace))
    all_paths = (canonical[:2] + [r for r in roots if r.ancestor] + canonical[2:]
                 if project is not None else canonical)
    if scope is not None:
        all_paths = [p for p in all_paths if p.scope == scope]
    return _finish(Path(os.path.abspath(project)) if project is not None else None,
                   Path(os.path.abspath(config_dir)), all_paths, roots, winners, shadowed, diag,
                   walker.truncated, warn)


def _finish(project: Path | None, config_dir: Path, paths: list[ScopePath], roots: list[ScopePath],
            winners: dict[str, Skill], shadowed: dict[str, list[Skill]], diag: Diagnostics,
            truncated: bool, warn: Callable[[str], None] | None) -> Resolution:
    """Diagnostics and indexes from the winners, then the Resolution: the
    one ending of a full resolution and of a one-name update (update_names)."""
    by_name = _index_by_name(winners, roots, diag)
    for name in sorted(winners):
        s = winners[name]
        if s.error is not None:
            diag.skipped.append(SkipEntry(str(s.path), s.error))
        diag.lenient.extend(s.lenient)
    diag.trust = check_trust([r for r in roots if r.exists])
    if warn:
        for line in list(diag.notes) + diag.lines():
            warn(line)
    return Resolution(project=project, config_dir=config_dir, paths=paths,
                      winners=dict(sorted(winners.items())), shadowed=shadowed,
                      diagnostics=diag, truncated=truncated, by_name=by_name)


def _index_by_name(winners: dict[str, Skill], roots: list[ScopePath],
                   diag: Diagnostics) -> dict[str, Skill]:
    """Reference name -> copy. Two winning directories that declare one name:
    the one in the higher-priority root wins, then the one whose directory
    is that name, then the first directory in sort order; the other is
    reported as shadowed (a warning, like a shadowed directory)."""
    order = {str(r.path): i for i, r in enumerate(roots)}
    ranked = sorted(winners.values(), key=lambda s: (
        order.get(str(s.root), len(order)), name_key(s.name) != s.ref_name, s.name))
    out: dict[str, Skill] = {}
    for s in ranked:
        key = s.ref_name
        win = out.get(key)
        if win is None:
            out[key] = s
            continue
        diag.warnings.append(ShadowWarning(key, str(win.path), win.scope, win.namespace,
                                           str(s.path), s.scope, s.namespace))
    return dict(sorted(out.items()))


def update_names(res: Resolution, names: Iterable[str], *, cache: SkillCache | None = None,
                 warn: Callable[[str], None] | None = None) -> Resolution:
    """``res`` with only ``names`` resolved again (a new Resolution; ``res``
    is left as it was for whoever still reads it).

    For a change made through the mount: a skill created, removed or
    renamed, or its SKILL.md written. Looks at ``<root>/<name>`` in each
    root and parses the winner's SKILL.md (through ``cache``); every other
    skill keeps its earlier parse. Shadowing, skip, lenient and trust
    diagnostics are rebuilt from the result.
    """
    from .builtins import builtin_skill_dirs

    roots = [replace(p, status=path_status(p.path)) for p in res.paths]
    winners = dict(res.winners)
    shadowed = {n: list(v) for n, v in res.shadowed.items()}
    builtin_dirs = None
    for name in set(names):
        winners.pop(name, None)
        shadowed.pop(name, None)
        if not name or name.startswith(".") or "/" in name:
            continue
        found: list[Skill] = []
        for root in roots:
            if not root.exists:
                continue
            confine = None
            if root.scope == PROJECT:
                confine = _project_root_ok(root)
                if confine is None:
                    continue
            if not os.path.isdir(root.path / name):
                continue
            found.append(Skill(name=name, path=root.path / name, scope=root.scope,
                               namespace=root.namespace, root=root.path, confine=confine))
        if not found:
            continue
        win = found[0]
        if win.scope == USER and win.namespace == NATIVE:
            if builtin_dirs is None:
                builtin_dirs = builtin_skill_dirs(res.config_dir)
            if name in builtin_dirs:
                win.source = "builtin"
        winners[name] = cache.load(win) if cache is not None else win.load_metadata()
        if found[1:]:
            shadowed[name] = found[1:]
    root_paths = {str(r.path) for r in roots}
    diag = Diagnostics(notes=list(res.diagnostics.notes))
    diag.skipped = [e for e in res.diagnostics.skipped if e.path in root_paths]
    for name in sorted(winners):
        s = winners[name]
        for other in shadowed.get(name, []):
            diag.warnings.append(ShadowWarning(name, str(s.path), s.scope, s.namespace,
                                               str(other.path), other.scope, other.namespace))
    return _finish(res.project, res.config_dir, roots, [r for r in roots if r.exists], winners,
                   shadowed, diag, res.truncated, warn)


def _skill_dir_names(root: Path, diag: Diagnostics) -> list[str]:
    names = []
    try:
        with os.scandir(root) as it:
            for entry in it:
                if entry.name.startswith(".") or not _is_dir(entry):
                    continue
                names.append(entry.name)
    except OSError as exc:
        diag.skipped.append(SkipEntry(str(root), f"cannot list skill root: {exc.strerror}"))
        return []
    names.sort()
    if len(names) > MAX_SKILLS_PER_ROOT:
        diag.notes.append(f"[skill] warning: {root}: {len(names)} skill directories; "
                          f"only the first {MAX_SKILLS_PER_ROOT} are read")
        names = names[:MAX_SKILLS_PER_ROOT]
    return names


def dumps(obj) -> str:
    """Compact JSON, one line (what Rnix's CLI prints); characters a
    terminal would act on are \\u-escaped (rnixfs.textsafe.json_text)."""
    from ..textsafe import json_text

    return json_text(json.dumps(obj, ensure_ascii=False, separators=(",", ":")))
