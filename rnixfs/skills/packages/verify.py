"""Digests as the Agent Skills Discovery RFC (v0.2.0) defines them.

A file digest is ``sha256:<64 lowercase hex>`` of its raw bytes. The skill
digest is the SHA-256 of the manifest ``{path}\\0{hex}\\n`` over all files
sorted by path (byte order). Package validation order: archive digest, then
every file's digest, then the skill digest.
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from .package_errors import VerificationFailed

DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
# Files that belong to the installation, not to the skill's content.
LOCAL_FILES = (".registry.yaml",)


def is_digest(value) -> bool:
    return isinstance(value, str) and DIGEST_RE.fullmatch(value) is not None


def digest_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def digest_file(path: Path | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 16), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def skill_digest(files: dict[str, str]) -> str:
    """The RFC's skill-level digest from ``{path: "sha256:hex"}``."""
    manifest = b"".join(p.encode("utf-8") + b"\0" + d.split(":", 1)[1].encode("ascii") + b"\n"
                        for p, d in sorted(files.items(), key=lambda kv: kv[0].encode("utf-8")))
    return digest_bytes(manifest)


def tree_digests(root: Path) -> dict[str, str]:
    """``{relative posix path: digest}`` of every regular file under ``root``
    (the installation's own files excluded; symlinks are never followed)."""
    out: dict[str, str] = {}
    root = Path(root)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        for fn in filenames:
            full = Path(dirpath) / fn
            rel = full.relative_to(root).as_posix()
            if rel in LOCAL_FILES or not full.is_file() or full.is_symlink():
                continue
            out[rel] = digest_file(full)
    return out


def check(what: str, expected: str, actual: str, source: str) -> None:
    if expected != actual:
        raise VerificationFailed(
            f"{source}: {what} digest mismatch (expected {expected}, got {actual}); "
            "the content is corrupted or was tampered with - nothing was installed")


def verify_tree(root: Path, files: dict[str, str], skill: str | None, source: str) -> dict[str, str]:
    """Steps 4-5 of the RFC's validation order for an unpacked skill.

    Every indexed file must exist with its digest, no unindexed file may be
    present, and the skill digest must match. Returns the computed digests.
    """
    actual = tree_digests(root)
    for path, expected in sorted(files.items()):
        if path not in actual:
            raise VerificationFailed(f"{source}: file {path!r} listed in the index is missing from the package")
        check(f"file {path!r}", expected, actual[path], source)
    extra = sorted(set(actual) - set(files))
    if extra:
        raise VerificationFailed(f"{source}: package holds files the index does not list: {', '.join(extra[:5])}")
    if skill is not None:
        check("skill", skill, skill_digest(actual), source)
    return actual
