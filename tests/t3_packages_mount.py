"""install -> list -> update -> remove through the CLI, seen in a real mount's skills/."""
from __future__ import annotations

import json
import os

import pytest

from tests.mountutil import needs_fuse, wait_for
from tests.pkg_registry import skill_md
from tests.pkgutil import Sandbox, pkg_registry  # noqa: F401

# hostile or untrusted project content: the daemon warns, as it should
pytestmark = [needs_fuse, pytest.mark.mount, pytest.mark.expect_log('untrusted project')]


def _read(p) -> bytes | None:
    """The file's bytes; None while the kernel still holds the replaced directory."""
    try:
        return p.read_bytes()
    except FileNotFoundError:
        return None


@pytest.mark.expect_log('untrusted project')
def test_installed_skills_live_in_the_mount(tmp_path, pkg_registry, mount_factory):
    m = mount_factory(None)
    sb = Sandbox(tmp_path / "sb", pkg_registry)
    sb.env["RNIXFS_CONFIG_DIR"] = str(m.config_dir)
    (m.project / ".rnix").mkdir(exist_ok=True)
    v1 = {"SKILL.md": skill_md("mounted", extra="metadata:\n  version: \"1.0.0\"\n"),
          "references/guide.md": b"guide v1\n"}
    pkg_registry.add_skill("mounted", v1, version="1.0.0")
    pkg_registry.add_skill("userwide", version="0.3.0")
    r = sb.run("skill", "install", "mounted", cwd=m.project)
    assert r.returncode == 0, r.stderr
    r = sb.run("skill", "install", "userwide", "-g", cwd=m.project)
    assert r.returncode == 0, r.stderr
    assert (m.project / ".rnix" / "skills" / "mounted" / "SKILL.md").is_file()
    assert (m.config_dir / "skills" / "userwide" / "SKILL.md").is_file()

    skills = m.path / "skills"
    wait_for(lambda: {"mounted", "userwide"} <= set(os.listdir(skills)), 15, what="installed skills in the mount")
    assert (skills / "mounted" / "SKILL.md").read_bytes() == v1["SKILL.md"]
    assert (skills / "mounted" / "references" / "guide.md").read_bytes() == b"guide v1\n"
    x = {k: os.getxattr(skills / "mounted", k).decode() for k in os.listxattr(skills / "mounted")}
    assert x.get("user.rnix.source") == "community" and x.get("user.rnix.version") == "1.0.0", x
    assert x.get("user.rnix.scope") == "project"

    code, out = sb.json("skill", "list", cwd=m.project)
    got = {s["name"]: (s["version"], s["source"], s["scope"]) for s in out["data"]["skills"]}
    assert got["mounted"] == ("1.0.0", "community", "project")
    assert got["userwide"] == ("0.3.0", "community", "user")

    v2 = {"SKILL.md": skill_md("mounted", extra="metadata:\n  version: \"2.0.0\"\n"),
          "references/guide.md": b"guide v2\n"}
    pkg_registry.add_skill("mounted", v2, version="2.0.0")
    r = sb.run("skill", "update", cwd=m.project)
    assert r.returncode == 0 and "Updated mounted 2.0.0" in r.stdout, r.stderr
    wait_for(lambda: _read(skills / "mounted" / "references" / "guide.md") == b"guide v2\n", 15,
             what="the update in the mount")

    r = sb.run("skill", "remove", "mounted", cwd=m.project)
    assert r.returncode == 0, r.stderr
    wait_for(lambda: "mounted" not in os.listdir(skills), 15, what="the removal in the mount")
    assert "userwide" in os.listdir(skills)
    actions = [(a["action"], a["skill"], a["outcome"]) for a in sb.audit()]
    assert actions == [("install", "mounted", "ok"), ("install", "userwide", "ok"),
                       ("update", "mounted", "ok"), ("update", "userwide", "unchanged"),
                       ("remove", "mounted", "ok")]
    assert all(json.dumps(a) for a in sb.audit())
