"""Named registries: ``$XDG_CONFIG_HOME/rnix/registries.yaml``.

::

    default: r9s                 # optional: the registry a bare NAME uses
    registries:
      r9s:
        url: https://skills.example.com
        headers:                 # optional; values may use ${ENV}
          Authorization: "Bearer ${R9S_TOKEN}"

(``registries`` may also be a list of ``{name, url, headers}``.)

The file may hold tokens, so it must be mode 0600 (no group/other bits) or
it is refused. ``r9s:NAME`` installs NAME from the registry called r9s.
"""
from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .package_errors import UsageError

REGISTRIES_FILE = "registries.yaml"
_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
NAME_RE = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")


@dataclass
class Registry:
    name: str
    url: str
    headers: dict[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:      # headers may hold secrets
        return f"Registry({self.name!r}, {self.url!r})"


@dataclass
class Registries:
    named: dict[str, Registry] = field(default_factory=dict)
    default: str | None = None


def _expand(value: str, where: str) -> str:
    def sub(m: re.Match) -> str:
        v = os.environ.get(m.group(1))
        if v is None:
            raise UsageError(f"{where}: environment variable {m.group(1)} is not set")
        return v
    return _ENV_RE.sub(sub, value)


def load_registries(config_dir: Path) -> Registries:
    path = Path(config_dir) / REGISTRIES_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return Registries()
    except OSError as exc:
        raise UsageError(f"{path}: cannot read ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{path}: not a regular file")
        if st.st_mode & 0o077:
            raise UsageError(f"{path}: mode {stat.S_IMODE(st.st_mode):04o} is too open; "
                             f"it may hold tokens - run: chmod 600 {path}")
        raw = f.read(1 << 20)
    try:
        data = yaml.safe_load(raw) or {}
    except yaml.YAMLError as exc:
        raise UsageError(f"{path}: invalid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: must be a mapping with 'registries'")
    regs = data.get("registries") or {}
    if isinstance(regs, list):             # also accepted: a list of {name, url, headers}
        if not all(isinstance(r, dict) and isinstance(r.get("name"), str) for r in regs):
            raise UsageError(f"{path}: each entry of 'registries' needs a name")
        regs = {r["name"]: {k: v for k, v in r.items() if k != "name"} for r in regs}
    if not isinstance(regs, dict):
        raise UsageError(f"{path}: 'registries' must be a mapping of name -> {{url, headers}}")
    out = Registries(default=data.get("default"))
    for name, body in regs.items():
        where = f"{path}: registry {name!r}"
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise UsageError(f"{where}: invalid name")
        if isinstance(body, str):
            body = {"url": body}
        if not isinstance(body, dict) or not isinstance(body.get("url"), str):
            raise UsageError(f"{where}: needs a url")
        headers = body.get("headers") or {}
        if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                    for k, v in headers.items()):
            raise UsageError(f"{where}: headers must map strings to strings")
        out.named[name] = Registry(name, body["url"].rstrip("/"),
                                   {k: _expand(v, where) for k, v in headers.items()})
    if out.default is not None and (not isinstance(out.default, str) or
                                    (out.default not in out.named and "://" not in out.default)):
        raise UsageError(f"{path}: default {out.default!r} is not a registry name or URL")
    return out


def parse_header(text: str) -> tuple[str, str]:
    """``"K: V"`` from ``--header``."""
    if ":" not in text:
        raise UsageError(f"--header {text.split(':')[0][:40]!r}: expected \"Name: value\"")
    k, v = text.split(":", 1)
    k, v = k.strip(), v.strip()
    if not k or any(c in k for c in " \r\n") or "\n" in v or "\r" in v:
        raise UsageError("--header: expected \"Name: value\" on one line")
    return k, v
