"""The audit log: one JSON line per package action in ``<state dir>/audit.jsonl``.

Fields: time (UTC ISO 8601), action (install | update | remove | create |
delete), skill, scope, namespace, source (origin type), url, digest,
scripts_allowed, user, outcome (ok | error | unchanged), and error when it
failed. Lines are appended with O_APPEND in one write, so concurrent
writers never interleave. Headers and tokens are never written.
"""
from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import pwd
from pathlib import Path

log = logging.getLogger(__name__)

AUDIT_FILE = "audit.jsonl"


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def audit(state_dir: Path, action: str, skill: str, *, outcome: str = "ok", scope: str = "",
          namespace: str = "", source: str = "", url: str = "", digest: str = "",
          scripts_allowed: bool | None = None, error: str = "", **extra) -> dict:
    rec = {"time": now_iso(), "action": action, "skill": skill, "scope": scope, "namespace": namespace,
           "source": source, "url": url, "digest": digest, "scripts_allowed": scripts_allowed,
           "user": _user(), "outcome": outcome}
    if error:
        rec["error"] = error
    rec.update(extra)
    line = (json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
    try:
        Path(state_dir).mkdir(parents=True, exist_ok=True)
        fd = os.open(Path(state_dir) / AUDIT_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
    except OSError as exc:
        log.warning("cannot append to the audit log in %s: %s", state_dir, exc.strerror)
    return rec
