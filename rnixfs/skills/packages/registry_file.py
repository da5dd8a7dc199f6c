"""``<skill>/.registry.yaml``: where an installed skill came from.

Written by install and update (never by hand), read by ``skill list``
(VERSION, SOURCE), ``skill update``/``check`` (the origin to fetch again)
and ``scripts_allowed``. Fields: name, source (``community``), trust,
origin (type + what is needed to fetch again; never headers), url, ref,
version, digest (the RFC skill digest), package_digest, verified, files
(path -> digest), allow_scripts, scope, namespace, installed_at, updated_at.
"""
from __future__ import annotations

import os
from pathlib import Path

import yaml

REGISTRY_FILE = ".registry.yaml"
MAX_BYTES = 1 << 20


def read_record(skill_dir: Path | str) -> dict | None:
    """The record, or None when the skill was not installed from a package
    (or the record is unreadable: then it is treated as absent)."""
    path = os.path.join(skill_dir, REGISTRY_FILE)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            import stat
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            data = yaml.safe_load(f.read(MAX_BYTES))
    except (OSError, yaml.YAMLError):
        return None
    return data if isinstance(data, dict) else None


def write_record(skill_dir: Path, record: dict) -> None:
    path = Path(skill_dir) / REGISTRY_FILE
    tmp = path.with_name(REGISTRY_FILE + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        yaml.safe_dump(record, f, sort_keys=False, allow_unicode=True)
    os.replace(tmp, path)


def apply_package_info(skill) -> None:
    """Give a Skill the VERSION and SOURCE its record states. A project skill
    directory that leads out of its scope root (a symlink, or one swapped
    in while this runs) is not read: the record is reached by the race-free
    walk from the scope root (docs/skills.md, "Symlinks in skills/ and agents/")."""
    rec = _read_record_in_scope(skill)
    if rec is None:
        return
    skill.source = "community"
    v = rec.get("version")
    if isinstance(v, (str, int, float)) and str(v):
        skill.installed_version = str(v)


def _read_record_in_scope(skill) -> dict | None:
    from ...fileio import read_in_scope

    try:
        data, size = read_in_scope(skill.scope_root, Path(skill.path) / REGISTRY_FILE, MAX_BYTES)
        if size > MAX_BYTES:
            return None
        rec = yaml.safe_load(data)
    except (OSError, ValueError, yaml.YAMLError):  # absent, outside, not a file: no record
        return None
    return rec if isinstance(rec, dict) else None


def scripts_allowed(skill_dir: Path | str) -> bool:
    """May agents run the files of this skill?

    Skills not installed from a package (user-created, built-in) are the
    user's own: True. An installed skill only when it was installed with
    ``--allow-scripts`` (``allow_scripts: true`` in its record). An
    unreadable record counts as not allowed... but only if it exists.
    """
    path = os.path.join(skill_dir, REGISTRY_FILE)
    if not os.path.lexists(path):
        return True
    rec = read_record(skill_dir)
    return bool(rec is not None and rec.get("allow_scripts") is True)
