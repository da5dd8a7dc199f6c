"""Project trust: warn (never block) when a project's skills load untrusted.

A project's skills come with its source tree, so a hostile repository could
inject agent instructions through SKILL.md. The marker
``<project>/.rnix/state/trusted`` says the user trusts the project; it must
be a *regular file* (``lstat``): a symlink never counts, or a repository
could commit ``trusted -> /etc/hostname`` and be trusted everywhere. Its
content is never read. User-scope skills are always trusted.
"""
from __future__ import annotations

import os
import shlex
import stat
from dataclasses import dataclass, field
from pathlib import Path

TRUST_MARKER = ".rnix/state/trusted"
TRUST_REASON = "untrusted repo can inject agent instructions"
TRUST_POLICY = "warn-only (not blocking)"
# `rnixfs trust DIR` writes the marker (docs/packages.md, "Scripts and trust").
TRUST_RECOMMENDATION = "To dismiss this warning, run: rnixfs trust {project}"


@dataclass
class TrustWarning:
    project_dir: str
    skills_root_paths: list[str] = field(default_factory=list)
    reason: str = TRUST_REASON
    policy: str = TRUST_POLICY
    recommendation: str = ""

    def to_json(self) -> dict:
        return {"project_dir": self.project_dir, "skills_root_paths": list(self.skills_root_paths),
                "reason": self.reason, "policy": self.policy, "recommendation": self.recommendation}


def is_trusted(project_dir: Path | str) -> bool:
    """True iff ``<project_dir>/.rnix/state/trusted`` is a regular file."""
    try:
        st = os.lstat(os.path.join(project_dir, TRUST_MARKER))
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode)


def project_dir_of(root: Path | str, namespace: str) -> str | None:
    """``/p/.rnix/skills`` (native) or ``/p/.agents/skills`` (agents) -> ``/p``."""
    cleaned = os.path.normpath(str(root))
    suffix = os.path.join(".rnix" if namespace == "native" else ".agents", "skills")
    if not cleaned.endswith(os.sep + suffix):
        return None
    project = cleaned[: -len(os.sep + suffix)]
    return project if project not in ("", ".", os.sep) else None


def check_trust(roots) -> list[TrustWarning]:
    """One warning per untrusted project directory among existing project roots.

    ``roots`` are ScopePath-like objects (``path``, ``scope``, ``namespace``,
    ``exists``) in priority order; a project's warning lists its existing
    roots in that order.
    """
    order: list[str] = []
    by_dir: dict[str, TrustWarning | None] = {}
    for root in roots:
        if root.scope != "project" or not getattr(root, "exists", True):
            continue
        project = project_dir_of(root.path, root.namespace)
        if project is None:
            continue
        if project not in by_dir:
            by_dir[project] = None if is_trusted(project) else TrustWarning(
                project, [], recommendation=TRUST_RECOMMENDATION.format(project=shlex.quote(project)))
            order.append(project)
        w = by_dir[project]
        if w is not None and str(root.path) not in w.skills_root_paths:
            w.skills_root_paths.append(str(root.path))
    return [by_dir[p] for p in order if by_dir[p] is not None]


def trust_line(w: TrustWarning) -> str:
    """Rnix's stderr line (em dash; ``RNIXFS_ASCII=1`` gives ``-``)."""
    from .parse import goquote

    dash = "-" if os.environ.get("RNIXFS_ASCII") == "1" else "\u2014"
    return (f"[skill] warning: untrusted project {goquote(w.project_dir)}: "
            f"{len(w.skills_root_paths)} skill root(s) will load {dash} {w.reason}. "
            f"Policy: {w.policy}. {w.recommendation}")
