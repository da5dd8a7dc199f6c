"""Built-in skills and agents: package data copied to the user scope once.

rnixfs ships ``code-analysis`` (skill) and ``code-analyst`` (agent) under
``rnixfs/builtin/``. :func:`ensure_builtins` copies each one into
``<config_dir>/skills/<name>`` or ``<config_dir>/agents/<name>`` on first
use and records what it wrote (file hashes) in
``<config_dir>/.rnixfs-builtins.json``. The user owns the copies:

* a directory the user already had is never touched ("foreign");
* a copy the user edited is never overwritten;
* a copy the user deleted is not brought back;
* an unedited copy is upgraded when a newer rnixfs ships different files.

``RNIXFS_NO_BUILTINS=1`` disables extraction (tests, locked-down setups).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
from importlib import resources
from pathlib import Path

log = logging.getLogger(__name__)

MARKER = ".rnixfs-builtins.json"
LOCK = ".rnixfs-builtins.lock"
KINDS = ("skills", "agents")


def _package_root():
    return resources.files("rnixfs.builtin")


def packaged() -> dict[str, dict[str, bytes]]:
    """``{"skills/code-analysis": {"SKILL.md": b"..."}, ...}`` from package data."""
    out: dict[str, dict[str, bytes]] = {}
    root = _package_root()
    for kind in KINDS:
        kdir = root / kind
        if not kdir.is_dir():
            continue
        for item in sorted(kdir.iterdir(), key=lambda p: p.name):
            if not item.is_dir() or item.name.startswith((".", "_")):
                continue
            files: dict[str, bytes] = {}
            _collect(item, "", files)
            out[f"{kind}/{item.name}"] = files
    return out


def _collect(node, prefix: str, files: dict[str, bytes]) -> None:
    for child in sorted(node.iterdir(), key=lambda p: p.name):
        if child.name.startswith(".") or child.name == "__pycache__":
            continue
        rel = f"{prefix}{child.name}"
        if child.is_dir():
            _collect(child, rel + "/", files)
        else:
            files[rel] = child.read_bytes()


def template(name: str) -> str:
    """A file from ``rnixfs/builtin/templates/``."""
    return (_package_root() / "templates" / name).read_text(encoding="utf-8")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _load_marker(config_dir: Path) -> dict:
    try:
        data = json.loads((config_dir / MARKER).read_text(encoding="utf-8"))
        if isinstance(data, dict) and isinstance(data.get("items"), dict):
            return data
    except (OSError, ValueError):
        pass
    return {"version": 1, "items": {}}


def builtin_skill_dirs(config_dir: Path) -> set[str]:
    """Names under ``<config_dir>/skills`` that rnixfs extracted (source "builtin")."""
    items = _load_marker(Path(config_dir))["items"]
    return {k.split("/", 1)[1] for k, v in items.items()
            if k.startswith("skills/") and isinstance(v, dict) and v.get("state") == "extracted"}


def builtin_agent_dirs(config_dir: Path) -> set[str]:
    items = _load_marker(Path(config_dir))["items"]
    return {k.split("/", 1)[1] for k, v in items.items()
            if k.startswith("agents/") and isinstance(v, dict) and v.get("state") == "extracted"}


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _file_hash(path: Path) -> str | None:
    try:
        if path.is_symlink() or not path.is_file():
            return None
        return _sha(path.read_bytes())
    except OSError:
        return None


@contextlib.contextmanager
def _locked(config_dir: Path):
    fd = os.open(config_dir / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def ensure_builtins(config_dir: Path) -> list[str]:
    """Extract (or upgrade unedited) built-ins into the user scope.

    Returns the items written, e.g. ``["skills/code-analysis"]``. Never
    raises for an unwritable config directory (returns ``[]``).
    """
    if os.environ.get("RNIXFS_NO_BUILTINS") == "1":
        return []
    config_dir = Path(os.path.abspath(config_dir))
    try:
        config_dir.mkdir(parents=True, exist_ok=True)
        with _locked(config_dir):
            return _ensure(config_dir)
    except OSError as exc:
        log.debug("built-ins not extracted into %s: %s", config_dir, exc)
        return []


def _ensure(config_dir: Path) -> list[str]:
    marker = _load_marker(config_dir)
    items = marker["items"]
    written: list[str] = []
    changed = False
    for key, files in packaged().items():
        kind, name = key.split("/", 1)
        target = config_dir / kind / name
        rec = items.get(key)
        if not isinstance(rec, dict):
            if os.path.lexists(target):
                items[key] = {"state": "foreign"}
            else:
                _extract(target, files)
                items[key] = {"state": "extracted", "files": {r: _sha(b) for r, b in files.items()}}
                written.append(key)
            changed = True
            continue
        if rec.get("state") != "extracted" or not target.is_dir() or target.is_symlink():
            continue   # foreign, or deleted by the user: leave it alone
        recorded = rec.get("files") or {}
        wanted = {r: _sha(b) for r, b in files.items()}
        if recorded == wanted:
            continue
        if any(_file_hash(target / r) != h for r, h in recorded.items()):
            continue   # the user edited it: theirs now
        if any(os.path.lexists(target / r) for r in wanted if r not in recorded):
            continue   # the user added a file we would overwrite
        for rel, data in files.items():
            dest = target / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            _write_atomic(dest, data)
        for rel in recorded:
            if rel not in wanted:
                with contextlib.suppress(OSError):
                    (target / rel).unlink()
        rec["files"] = wanted
        written.append(key)
        changed = True
    if changed:
        _write_atomic(config_dir / MARKER, (json.dumps(marker, indent=2, sort_keys=True) + "\n").encode())
    return written


def _extract(target: Path, files: dict[str, bytes]) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for rel, data in files.items():
            dest = tmp / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
