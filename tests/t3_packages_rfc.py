"""Interoperability with a registry written from the RFC v0.2.0 text alone
(tests/rfc_registry.py) and a GitHub API double that redirects to a
codeload-style ``git archive`` tarball: installs by name (package tar.gz,
package zip, individual files), ``github:…@ref``, a direct zip URL; tampered,
zip-slip and name-mismatch packages refused with nothing left behind; the
scope flags, ``--force``, ``skill list --json``, ``skill update`` into the
origin scope, and the audit log's digests. See docs/packages.md.
"""
from __future__ import annotations

import os

import pytest
import yaml

from tests.mountutil import needs_fuse, wait_for
from tests.pkgutil import Sandbox, snapshot
from tests.rfc_registry import RfcRegistry, file_digest, rfc_skill_digest, tar_gz_of, zip_of

# hostile or untrusted project content: the daemon warns, as it should
pytestmark = pytest.mark.expect_log('untrusted project')


def md(name: str, declared: str | None = None, body: str = "") -> bytes:
    return (f"---\nname: {declared or name}\ndescription: The {name} skill, for tests.\n---\n"
            f"# {name}\n{body or 'Steps.'}\n").encode()


@pytest.fixture
def rfc():
    reg = RfcRegistry().start()
    yield reg
    reg.stop()


@pytest.fixture
def sb(tmp_path, rfc):
    s = Sandbox(tmp_path, None)
    s.env.update(RNIXFS_REGISTRY=rfc.url, RNIXFS_GITHUB_API=rfc.url)
    return s


def _all_roots(sb):
    return snapshot(*sb.roots.values())


def test_rfc_worked_example_digest():
    # The RFC's own worked example, so this server's digests are the RFC's.
    from rnixfs.skills.packages.verify import skill_digest
    files = {"SKILL.md": b"# Hello\n", "scripts/run.sh": b"#!/bin/sh\n"}
    want = "sha256:34f7a8c484e9991f3e71a309f31332d6335efc01f544105c4185a7c4ab12eb1e"
    assert rfc_skill_digest(files) == want
    assert skill_digest({p: file_digest(d) for p, d in files.items()}) == want


@pytest.mark.parametrize("package", ["tar.gz", "zip", None])
def test_install_by_name_from_an_rfc_registry(sb, rfc, package):
    files = {"SKILL.md": md("rfc-tool"), "references/guide.md": b"guide\n", "assets/a/b.json": b"{}\n"}
    entry = rfc.publish("rfc-tool", files, package=package, version="1.2.3")
    r = sb.run("skill", "install", "rfc-tool")
    assert r.returncode == 0, r.stdout + r.stderr
    dest = sb.roots["pn"] / "rfc-tool"
    for rel, data in files.items():
        assert (dest / rel).read_bytes() == data
    rec = yaml.safe_load((dest / ".registry.yaml").read_text())
    assert rec["digest"] == entry["digest"] and rec["verified"] is True and rec["version"] == "1.2.3"
    if package:
        assert rec["package_digest"] == entry["package"]["digest"]
        assert any(p.endswith(f"rfc-tool.{package}") for p in rfc.requests)
    else:
        assert "/.well-known/agent-skills/rfc-tool/references/guide.md" in rfc.requests
    [line] = sb.audit()
    assert line["action"] == "install" and line["outcome"] == "ok" and line["digest"] == entry["digest"]
    code, out = sb.json("skill", "list")
    [s] = [s for s in out["data"]["skills"] if s["name"] == "rfc-tool"]
    assert (s["version"], s["source"]) == ("1.2.3", "community")


def test_rfc_path_characters_in_individual_files(sb, rfc):
    # Printable ASCII other than \\ ? # [ ] is allowed in a path; served URL-encoded.
    files = {"SKILL.md": md("odd-paths"), "references/my notes.md": b"a\n", "assets/a+b (1)%;'.txt": b"b\n"}
    rfc.publish("odd-paths", files)
    r = sb.run("skill", "install", "odd-paths")
    assert r.returncode == 0, r.stdout + r.stderr
    for rel, data in files.items():
        assert (sb.roots["pn"] / "odd-paths" / rel).read_bytes() == data


def test_redirects_are_followed(sb, rfc):
    files = {"SKILL.md": md("moved"), "references/r.md": b"r\n"}
    entry = rfc.publish("moved", files, package="tar.gz")
    body, ctype = rfc.blobs.pop("/.well-known/agent-skills/moved.tar.gz")
    rfc.blobs["/cdn/moved-1.tar.gz"] = (body, ctype)
    rfc.redirects["/.well-known/agent-skills/moved.tar.gz"] = "/cdn/moved-1.tar.gz"
    rfc.index_path = "/skills-index-v2.json"
    rfc.redirects["/.well-known/agent-skills/index.json"] = rfc.url + "/skills-index-v2.json"
    r = sb.run("skill", "install", "moved")
    assert r.returncode == 0, r.stdout + r.stderr
    rec = yaml.safe_load((sb.roots["pn"] / "moved" / ".registry.yaml").read_text())
    assert rec["digest"] == entry["digest"] and rec["verified"] is True


def test_install_with_registry_flag_forms(sb, rfc):
    rfc.publish("flagged", {"SKILL.md": md("flagged")}, package="tar.gz")
    env = {"RNIXFS_REGISTRY": ""}
    for i, form in enumerate([rfc.url, rfc.url + "/", rfc.url + "/.well-known/agent-skills/index.json",
                              rfc.url + "/.well-known/agent-skills/", rfc.url + "/.well-known/agent-skills"]):
        r = sb.run("skill", "install", "flagged", "--registry", form, "--force", env=env)
        assert r.returncode == 0, (form, r.stdout + r.stderr)


def test_github_tarball_redirected_to_codeload(sb, rfc):
    repo = {"README.md": b"readme\n", "skills/alpha/SKILL.md": md("alpha"),
            "skills/beta/SKILL.md": md("beta"), "skills/beta/references/x.md": b"x\n"}
    rfc.github_repo("acme", "kit", repo, tag="v1.0")
    r = sb.run("skill", "install", "github:acme/kit/skills/beta@v1.0")
    assert r.returncode == 0, r.stdout + r.stderr
    dest = sb.roots["pn"] / "beta"
    assert (dest / "references" / "x.md").read_bytes() == b"x\n"
    assert not (sb.roots["pn"] / "alpha").exists()
    assert "/repos/acme/kit/tarball/v1.0" in rfc.requests and "/codeload/acme/kit/legacy.tar.gz/v1.0" in rfc.requests
    rec = yaml.safe_load((dest / ".registry.yaml").read_text())
    assert rec["origin"]["type"] == "github" and rec["ref"] == "v1.0"
    # Several skills and no path: listed, nothing installed; --all installs both.
    before = _all_roots(sb)
    r = sb.run("skill", "install", "github:acme/kit@main", "-g")
    assert r.returncode == 2 and "alpha" in r.stdout + r.stderr
    assert _all_roots(sb) == before
    r = sb.run("skill", "install", "acme/kit", "--all", "-g")
    assert r.returncode == 0, r.stdout + r.stderr
    assert {p.name for p in sb.roots["un"].iterdir()} == {"alpha", "beta"}
    r = sb.run("skill", "install", "github:acme/nope@main")
    assert r.returncode == 3, r.stdout + r.stderr


def test_direct_zip_url(sb, rfc):
    files = {"SKILL.md": md("zipped"), "references/r.md": b"r\n"}
    url = rfc.serve_blob("/downloads/zipped.zip", zip_of(files), "application/zip")
    r = sb.run("skill", "install", url, "--shared")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (sb.roots["pa"] / "zipped" / "references" / "r.md").read_bytes() == b"r\n"
    [line] = sb.audit()
    assert line["digest"] == rfc_skill_digest(files) and line["url"] == url


def test_archive_url_without_a_suffix(sb, rfc):
    files = {"tool-z/SKILL.md": md("tool-z")}
    url = rfc.serve_blob("/download/tool-z", zip_of(files), "application/zip")
    r = sb.run("skill", "install", url)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (sb.roots["pn"] / "tool-z" / "SKILL.md").read_bytes() == md("tool-z")
    rec = yaml.safe_load((sb.roots["pn"] / "tool-z" / ".registry.yaml").read_text())
    assert rec["origin"]["type"] == "url"
    assert sb.run("skill", "update", "tool-z").returncode == 0
    # A page that is neither an index nor an archive is still "not found".
    rfc.serve_blob("/download/page", b"<html>hello</html>", "text/html")
    r = sb.run("skill", "install", rfc.url + "/download/page")
    assert r.returncode == 3, r.stdout + r.stderr
    r = sb.run("skill", "install", rfc.url + "/download/missing")
    assert r.returncode == 3, r.stdout + r.stderr


def _refused(sb, args, code):
    before = _all_roots(sb)
    audit_before = len(sb.audit())
    r = sb.run("skill", "install", *args)
    assert r.returncode == code, r.stdout + r.stderr
    assert _all_roots(sb) == before
    assert not any(p.name.startswith(".rnix-pkg") for root in sb.roots.values() if root.exists()
                   for p in root.iterdir())
    new = sb.audit()[audit_before:]
    assert [x["outcome"] for x in new] == ["error"], new
    return r


def test_tampered_packages_are_refused(sb, rfc, tmp_path):
    good = {"SKILL.md": md("tamper"), "references/r.md": b"real\n"}
    # An installed previous version must stay byte for byte.
    rfc.publish("tamper", good, package="tar.gz")
    assert sb.run("skill", "install", "tamper").returncode == 0
    # 1. archive bytes changed after the digest was published
    arch = tar_gz_of({**good, "references/r.md": b"evil\n"})
    rfc.publish("tamper", good, package="tar.gz", archive=arch, package_digest=file_digest(tar_gz_of(good)))
    _refused(sb, ["tamper", "--force"], 4)
    # 2. package digest right, a file's content differs from its indexed digest
    rfc.publish("tamper", good, package="tar.gz", archive=arch)
    _refused(sb, ["tamper", "--force"], 4)
    # 3. files right, skill digest wrong (index/content desynchronized)
    rfc.publish("tamper", good, package="zip", skill_digest="sha256:" + "0" * 64)
    _refused(sb, ["tamper", "--force"], 4)
    # 4. individually served file altered
    rfc.publish("tamper", good, digests={"references/r.md": file_digest(b"other\n")})
    _refused(sb, ["tamper", "--force"], 4)
    assert (sb.roots["pn"] / "tamper" / "references" / "r.md").read_bytes() == b"real\n"


def test_zip_slip_and_name_mismatch_leave_nothing(sb, rfc, tmp_path):
    files = {"SKILL.md": md("slip")}
    evil = zip_of(files, members={"../../../escaped.txt": b"pwned\n"})
    rfc.publish("slip", files, package="zip", archive=evil, package_digest=file_digest(evil))
    _refused(sb, ["slip"], 7)
    assert not list(tmp_path.rglob("escaped.txt"))
    url = rfc.serve_blob("/dl/slip.zip", evil)
    _refused(sb, [url], 7)
    assert not list(tmp_path.rglob("escaped.txt"))
    # The index says "mismatch", the frontmatter says otherwise: strict validation rolls back.
    rfc.publish("mismatch", {"SKILL.md": md("mismatch", declared="other-name")}, package="tar.gz")
    r = _refused(sb, ["mismatch"], 4)
    assert "name" in (r.stdout + r.stderr).lower()


def test_scopes_force_list_update_origin_scope(sb, rfc):
    rfc.publish("scoped", {"SKILL.md": md("scoped")}, package="tar.gz", version="1.0.0")
    assert sb.run("skill", "install", "scoped", "-g").returncode == 0
    assert (sb.roots["un"] / "scoped").is_dir()
    assert sb.run("skill", "install", "scoped", "--shared").returncode == 0
    assert (sb.roots["pa"] / "scoped").is_dir()
    assert sb.run("skill", "install", "scoped", "-g", "--shared", cwd=sb.outside).returncode == 0
    assert (sb.roots["ua"] / "scoped").is_dir()
    r = sb.run("skill", "install", "scoped", "-g")
    assert r.returncode == 6, r.stdout + r.stderr
    r = sb.run("skill", "install", "scoped", "-g", "--force")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (sb.roots["pn"] / "scoped").exists()

    rfc.publish("scoped", {"SKILL.md": md("scoped", body="v2")}, package="zip", version="2.0.0")
    r = sb.run("skill", "update", "scoped")
    assert r.returncode == 0, r.stdout + r.stderr
    # Only the winning copy's origin scope is written; nothing appears in the write scope.
    assert not (sb.roots["pn"] / "scoped").exists()
    versions = {k: yaml.safe_load((sb.roots[k] / "scoped" / ".registry.yaml").read_text())["version"]
                for k in ("un", "pa", "ua")}
    assert list(versions.values()).count("2.0.0") == 1, versions
    code, out = sb.json("skill", "list")
    [s] = [s for s in out["data"]["skills"] if s["name"] == "scoped"]
    assert s["version"] == "2.0.0" and s["source"] == "community"
    upd = [x for x in sb.audit() if x["action"] == "update"]
    assert upd and upd[-1]["digest"] == rfc.entries["scoped"]["digest"]


@pytest.mark.parametrize("frontmatter", ["name: Bad_Name\n", ""])
def test_root_skill_without_a_valid_name_is_refused_clearly(sb, rfc, frontmatter):
    body = f"---\n{frontmatter}description: d\n---\nbody\n".encode()
    url = rfc.serve_blob("/dl/root.zip", zip_of({"SKILL.md": body}))
    r = _refused(sb, [url], 4)
    assert "root has no valid frontmatter name" in r.stderr and "'w" not in r.stderr, r.stderr


def test_v01_and_legacy_indexes_install_with_a_warning(sb, rfc):
    files = {"SKILL.md": md("old-style"), "references/r.md": b"r\n"}
    rfc.publish("old-style", files)
    rfc.raw_index = {"skills": [{"name": "old-style", "description": "d", "files": list(files)}]}
    r = sb.run("skill", "install", "old-style")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "nothing from it can be verified" in r.stderr
    rec = yaml.safe_load((sb.roots["pn"] / "old-style" / ".registry.yaml").read_text())
    assert rec["verified"] is False and rec["digest"] == rfc_skill_digest(files)
    rfc.index_path = "/.well-known/skills/index.json"      # only the older well-known path
    rfc.blobs = {k.replace("/agent-skills/", "/skills/"): v for k, v in rfc.blobs.items()}
    r = sb.run("skill", "install", "old-style", "-g")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (sb.roots["un"] / "old-style" / "references" / "r.md").read_bytes() == b"r\n"


def test_unknown_major_version_and_unknown_fields(sb, rfc):
    entry = rfc.publish("future", {"SKILL.md": md("future")}, package="tar.gz")
    rfc.raw_index = {"version": "0.3.1", "x-publisher": {"a": 1},
                     "skills": [{**entry, "x-extra": [1, 2], "license": "MIT"}]}
    r = sb.run("skill", "install", "future")
    assert r.returncode == 0, r.stdout + r.stderr          # unknown fields are ignored
    rfc.raw_index = {"version": "1.0.0", "skills": [entry]}
    _refused(sb, ["future", "-g"], 4)


def test_github_update_and_remove_are_audited_with_digests(sb, rfc):
    sha1 = rfc.github_repo("acme", "one", {"SKILL.md": md("solo")})
    r = sb.run("skill", "install", "github:acme/one", "-g", cwd=sb.outside)
    assert r.returncode == 0, r.stdout + r.stderr
    dest = sb.roots["un"] / "solo"
    v1 = rfc_skill_digest({"SKILL.md": md("solo")})
    assert yaml.safe_load((dest / ".registry.yaml").read_text())["digest"] == v1
    sha2 = rfc.github_repo("acme", "one", {"SKILL.md": md("solo", body="v2")})
    assert sha1 != sha2
    code, out = sb.json("skill", "check")
    assert [s["outcome"] for s in out["data"]["skills"] if s["name"] == "solo"] == ["update-available"], out
    # Updated from inside a project: written back to the user scope it came from.
    r = sb.run("skill", "update")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (dest / "SKILL.md").read_bytes() == md("solo", body="v2")
    assert not (sb.roots["pn"] / "solo").exists()
    r = sb.run("skill", "remove", "solo")
    assert r.returncode == 0 and not dest.exists(), r.stdout + r.stderr
    lines = [(x["action"], x["outcome"], x["scope"], x["digest"]) for x in sb.audit()]
    v2 = rfc_skill_digest({"SKILL.md": md("solo", body="v2")})
    assert lines == [("install", "ok", "user", v1), ("update", "ok", "user", v2),
                     ("remove", "ok", "user", v2)], lines


@needs_fuse
@pytest.mark.mount
def test_installs_from_every_source_are_seen_in_the_mount(tmp_path, rfc, mount_factory):
    m = mount_factory(None)
    sb = Sandbox(tmp_path / "sb", None)
    sb.env.update(RNIXFS_REGISTRY=rfc.url, RNIXFS_GITHUB_API=rfc.url, RNIXFS_CONFIG_DIR=str(m.config_dir))
    (m.project / ".rnix").mkdir(exist_ok=True)
    rfc.publish("by-name", {"SKILL.md": md("by-name"), "references/g.md": b"g1\n"}, package="tar.gz")
    rfc.github_repo("acme", "mnt", {"skills/from-gh/SKILL.md": md("from-gh")}, tag="v2")
    url = rfc.serve_blob("/dl/shared-one.zip", zip_of({"shared-one/SKILL.md": md("shared-one")}))
    for args in (["by-name"], ["github:acme/mnt@v2", "-g"], [url, "--shared"]):
        r = sb.run("skill", "install", *args, cwd=m.project)
        assert r.returncode == 0, (args, r.stdout + r.stderr)
    skills = m.path / "skills"
    wait_for(lambda: {"by-name", "from-gh", "shared-one"} <= set(os.listdir(skills)), 15,
             what="installed skills in the mount")
    assert (skills / "from-gh" / "SKILL.md").read_bytes() == md("from-gh")
    assert (skills / "shared-one" / "SKILL.md").read_bytes() == md("shared-one")

    def guide():
        try:
            return (skills / "by-name" / "references" / "g.md").read_bytes()
        except FileNotFoundError:
            return None
    assert guide() == b"g1\n"
    rfc.publish("by-name", {"SKILL.md": md("by-name"), "references/g.md": b"g2\n"}, package="zip")
    r = sb.run("skill", "install", "by-name", "--force", cwd=m.project)
    assert r.returncode == 0, r.stdout + r.stderr
    wait_for(lambda: guide() == b"g2\n", 15, what="the forced reinstall in the mount")
    r = sb.run("skill", "remove", "by-name", cwd=m.project)
    assert r.returncode == 0, r.stdout + r.stderr
    wait_for(lambda: "by-name" not in os.listdir(skills), 15, what="the removal in the mount")
