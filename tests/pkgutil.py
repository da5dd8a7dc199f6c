"""Helpers for the package tests: a sandboxed CLI and the registry fixture."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pkg_registry import Registry

RNIXFS = [sys.executable, "-m", "rnixfs.cli"]


@pytest.fixture
def pkg_registry():
    """A real skills registry + GitHub-style tarball API on 127.0.0.1."""
    reg = Registry().start()
    yield reg
    reg.stop()


class Sandbox:
    """HOME, config, state, a .rnix project and an outside directory; runs the real CLI."""

    def __init__(self, tmp: Path, registry: Registry | None = None):
        self.tmp = tmp
        self.home = tmp / "home"
        self.cfg = self.home / ".config" / "rnix"
        self.state = tmp / "state"
        self.project = tmp / "proj"
        self.outside = tmp / "outside"
        for d in (self.home, self.project / ".rnix", self.outside):
            d.mkdir(parents=True)
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("RNIXFS_", "XDG_")) and k != "RNIXFS_ASCII"}
        self.env.update(HOME=str(self.home), XDG_CONFIG_HOME=str(self.home / ".config"),
                        RNIXFS_STATE_DIR=str(self.state), RNIXFS_NO_BUILTINS="1",
                        RNIXFS_HTTP_TIMEOUT="20")
        if registry is not None:
            self.env.update(RNIXFS_REGISTRY=registry.url, RNIXFS_GITHUB_API=registry.url)

    def run(self, *args, cwd=None, timeout=120, env=None) -> subprocess.CompletedProcess:
        return subprocess.run([*RNIXFS, *args], cwd=cwd or self.project, env={**self.env, **(env or {})},
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def json(self, *args, **kw) -> tuple[int, dict]:
        r = self.run(*args, "--json", **kw)
        assert "Traceback" not in r.stderr, r.stderr
        return r.returncode, json.loads(r.stdout)

    @property
    def roots(self) -> dict[str, Path]:
        return {"pn": self.project / ".rnix" / "skills", "pa": self.project / ".agents" / "skills",
                "un": self.cfg / "skills", "ua": self.home / ".agents" / "skills"}

    def audit(self) -> list[dict]:
        p = self.state / "audit.jsonl"
        return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []


def snapshot(*roots: Path) -> dict[str, bytes | str]:
    """Every path under the roots with its bytes (files) or link target: 'byte for byte'."""
    out: dict[str, bytes | str] = {}
    for root in roots:
        if not os.path.lexists(root):
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            for n in dirnames + filenames:
                p = Path(dirpath) / n
                if p.is_symlink():
                    out[str(p)] = "-> " + os.readlink(p)
                elif p.is_file():
                    out[str(p)] = p.read_bytes()
                else:
                    out[str(p)] = "dir"
        out[str(root)] = "root"
    return out
