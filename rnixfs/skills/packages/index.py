"""The Agent Skills Discovery index (RFC v0.2.0, and v0.1 read-only).

``/.well-known/agent-skills/index.json`` is tried first; an origin that only
serves the older ``/.well-known/skills/index.json`` (or a v0.1 index with
string ``files``) is accepted with a warning: nothing in it can be verified.
Unknown fields are ignored, as the RFC says; an optional ``version`` on an
entry is the skill's version.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urljoin

from ..parse import check_name
from .package_errors import NotFound, VerificationFailed
from .fetch import Fetcher
from .verify import is_digest

WELL_KNOWN = "/.well-known/agent-skills/index.json"
LEGACY_WELL_KNOWN = "/.well-known/skills/index.json"
VERSION_RE = re.compile(r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)")
_BAD_PATH_CHARS = set('\\?#[]')


@dataclass
class IndexEntry:
    name: str
    description: str
    digest: str | None
    files: dict[str, str | None]           # path -> digest (None in v0.1)
    base_url: str                          # <index dir>/<name>/
    package_url: str | None = None
    package_digest: str | None = None
    version: str = ""
    error: str | None = None               # why this entry cannot be installed

    @property
    def verifiable(self) -> bool:
        return self.digest is not None and all(d is not None for d in self.files.values())


@dataclass
class Index:
    url: str
    version: str
    entries: dict[str, IndexEntry] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def check_index_path(path) -> str | None:
    """The RFC's path requirements; returns the reason a path is refused."""
    if not isinstance(path, str) or not path:
        return "path must be a non-empty string"
    if path.startswith("/") or ".." in path.split("/") or "" in path.split("/"):
        return f"path {path!r} is absolute or has '..' or empty segments"
    if any(ord(c) < 0x20 or ord(c) > 0x7E or c in _BAD_PATH_CHARS for c in path):
        return f"path {path!r} has characters the RFC forbids"
    return None


def _entry(raw, index_url: str, legacy: bool) -> IndexEntry | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        return None
    name = raw["name"]
    desc = raw.get("description") if isinstance(raw.get("description"), str) else ""
    version = raw.get("version") if isinstance(raw.get("version"), str) else ""
    e = IndexEntry(name, desc, None, {}, urljoin(index_url, name + "/"), version=version)
    if check_name(name):
        e.error = f"invalid skill name {name[:64]!r}"
        return e
    files = raw.get("files")
    if not isinstance(files, list) or not files:
        e.error = "entry has no files"
        return e
    for f in files:
        if isinstance(f, str):              # v0.1: a path, no digest
            path, dig = f, None
        elif isinstance(f, dict):
            path, dig = f.get("path"), f.get("digest")
            if not legacy and not is_digest(dig):
                e.error = f"file {str(path)[:80]!r} has no valid sha256 digest"
                return e
        else:
            e.error = "files entries must be objects with path and digest"
            return e
        if (why := check_index_path(path)) is not None:
            e.error = why
            return e
        if path in e.files:
            e.error = f"file {path!r} is listed twice"
            return e
        e.files[path] = dig if is_digest(dig) else None
    if "SKILL.md" not in e.files:
        e.error = "entry does not list SKILL.md"
        return e
    dig = raw.get("digest")
    if is_digest(dig):
        e.digest = dig
    elif not legacy:
        e.error = "entry has no valid sha256 skill digest"
        return e
    pkg = raw.get("package")
    if isinstance(pkg, dict) and isinstance(pkg.get("url"), str):
        if not is_digest(pkg.get("digest")):
            e.error = "package has no valid sha256 digest"
            return e
        e.package_url = urljoin(index_url, pkg["url"])
        e.package_digest = pkg["digest"]
    return e


def parse_index(data, url: str, *, legacy_path: bool = False) -> Index:
    if not isinstance(data, dict) or not isinstance(data.get("skills"), list):
        raise VerificationFailed(f"{url}: not a skills index (needs a 'skills' array)")
    version = data.get("version")
    warnings = []
    if version is None:
        version, legacy = "0.1.0", True
    else:
        m = VERSION_RE.fullmatch(version) if isinstance(version, str) else None
        if m is None:
            raise VerificationFailed(f"{url}: index version {str(version)[:20]!r} is not M.m.p")
        if m.group(1) != "0":
            raise VerificationFailed(f"{url}: index version {version} is not supported (major {m.group(1)}); "
                                     "upgrade rnixfs")
        legacy = m.group(2) in ("0", "1")       # 0.0.x / 0.1.x: string files, no digests
    legacy = legacy or legacy_path
    idx = Index(url, version, warnings=warnings)
    for raw in data["skills"]:
        e = _entry(raw, url, legacy)
        if e is not None and e.name not in idx.entries:
            idx.entries[e.name] = e
    if legacy or any(not e.verifiable for e in idx.entries.values() if e.error is None):
        warnings.append(f"{url}: v{version} index without digests - nothing from it can be verified")
    return idx


def index_urls(registry: str) -> list[tuple[str, bool]]:
    base = registry.rstrip("/")
    if base.endswith(".json"):
        return [(base, False)]
    # The well-known directory itself, as people copy it from a browser.
    for prefix, legacy in ((WELL_KNOWN, False), (LEGACY_WELL_KNOWN, True)):
        well_known_dir = prefix[: -len("/index.json")]
        if base.endswith(well_known_dir):
            return [(base + "/index.json", legacy)]
    return [(base + WELL_KNOWN, False), (base + LEGACY_WELL_KNOWN, True)]


def load_index(fetcher: Fetcher, registry: str, warn: Callable[[str], None] | None = None) -> Index:
    """Fetch and parse a registry's index (the RFC path, then the legacy one)."""
    last: NotFound | None = None
    for url, legacy in index_urls(registry):
        try:
            data = fetcher.get_json(url, what="skills index")
        except NotFound as exc:
            last = exc
            continue
        idx = parse_index(data, url, legacy_path=legacy)
        if warn:
            for w in idx.warnings:
                warn(w)
        return idx
    raise NotFound(f"{registry}: no skills index at {WELL_KNOWN} (or {LEGACY_WELL_KNOWN}); "
                   "is this an Agent Skills registry?") from last
