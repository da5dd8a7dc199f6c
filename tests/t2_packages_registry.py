"""Skill packages from a real HTTP registry on 127.0.0.1, through the real CLI."""
from __future__ import annotations

import os

import pytest

from tests.pkg_registry import make_tar_gz, make_zip, sha, skill_digest, skill_md
from tests.pkgutil import Sandbox, pkg_registry, snapshot  # noqa: F401

SCRIPT = b"#!/bin/sh\necho hello\n"


@pytest.fixture
def sb(tmp_path, pkg_registry):
    return Sandbox(tmp_path, pkg_registry)


def files_v(name: str, v: str) -> dict[str, bytes]:
    return {"SKILL.md": skill_md(name, extra=f"metadata:\n  version: \"{v}\"\n"),
            "references/notes.md": f"notes {v}\n".encode()}


def test_install_by_name_verified_listed_audited(sb, pkg_registry):
    pkg_registry.add_skill("code-analysis", files_v("code-analysis", "1.0.0"), version="1.0.0")
    code, out = sb.json("skill", "install", "code-analysis")
    assert code == 0, out
    r = out["data"]["installed"][0]
    target = sb.roots["pn"] / "code-analysis"
    assert r["path"] == str(target) and r["verified"] is True and r["scope"] == "project"
    assert (target / "references" / "notes.md").read_text() == "notes 1.0.0\n"
    rec = (target / ".registry.yaml").read_text()
    assert "origin:" in rec and "digest: sha256:" in rec and "installed_at:" in rec
    # skill list shows VERSION and SOURCE, text and JSON
    lst = sb.run("skill", "list")
    row = next(line for line in lst.stdout.splitlines() if "code-analysis" in line)
    assert "1.0.0" in row and "community" in row
    code, out = sb.json("skill", "list")
    e = next(s for s in out["data"]["skills"] if s["name"] == "code-analysis")
    assert e["version"] == "1.0.0" and e["source"] == "community"
    # the audit line carries the digest
    a = sb.audit()[-1]
    assert a["action"] == "install" and a["outcome"] == "ok" and a["skill"] == "code-analysis"
    assert a["digest"] == skill_digest(files_v("code-analysis", "1.0.0")) and a["scope"] == "project"
    assert a["url"].endswith("/pkg/code-analysis.tar.gz") and a["scripts_allowed"] is False
    assert a["user"] and a["time"].endswith("Z")
    # a second install is refused with its own exit code; --force overwrites
    r2 = sb.run("skill", "install", "code-analysis")
    assert r2.returncode == 6 and "--force" in r2.stderr
    assert sb.run("skill", "install", "code-analysis", "--force").returncode == 0


@pytest.mark.parametrize("package", ["zip", None])
def test_install_zip_package_and_individual_files(sb, pkg_registry, package):
    pkg_registry.add_skill("pdf-tools", files_v("pdf-tools", "2.1.0"), version="2.1.0", package=package)
    r = sb.run("skill", "install", "pdf-tools", cwd=sb.outside)
    assert r.returncode == 0, r.stderr
    target = sb.roots["un"] / "pdf-tools"
    assert (target / "SKILL.md").read_bytes() == files_v("pdf-tools", "2.1.0")["SKILL.md"]
    assert "Installed pdf-tools 2.1.0" in r.stdout and "(verified)" in r.stdout


def test_archive_with_a_top_directory_is_the_skill(sb, pkg_registry):
    pkg_registry.add_skill("wrapped", top="wrapped")
    assert sb.run("skill", "install", "wrapped").returncode == 0
    assert (sb.roots["pn"] / "wrapped" / "SKILL.md").is_file()


def refused(sb, args, code, text, before):
    r = sb.run("skill", "install", *args)
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and text in r.stderr, r.stderr
    assert snapshot(*sb.roots.values()) == before, "an install that failed left something behind"
    a = sb.audit()[-1]
    assert a["outcome"] == "error" and a["error"]
    return r


def test_verification_failures_leave_nothing(sb, pkg_registry):
    files = files_v("tampered", "1.0.0")
    before = snapshot(*sb.roots.values())
    # wrong archive digest (step 2)
    pkg_registry.add_skill("tampered", files, package_digest="sha256:" + "0" * 64)
    refused(sb, ["tampered"], 4, "package digest mismatch", before)
    # archive matches its digest but a file does not (step 4)
    evil = dict(files, **{"references/notes.md": b"evil\n"})
    pkg_registry.add_skill("tampered", evil, index_files=files)
    refused(sb, ["tampered"], 4, "digest mismatch", before)
    # individual files: a served file differs from the index
    pkg_registry.add_skill("tampered", evil, index_files=files, package=None)
    refused(sb, ["tampered"], 4, "digest mismatch", before)
    # an unindexed extra file in the package
    pkg_registry.add_skill("tampered", dict(files, **{"scripts/x.sh": SCRIPT}), index_files=files)
    refused(sb, ["tampered"], 4, "does not list", before)
    # the skill digest does not match the files (step 5)
    entry = pkg_registry.add_skill("tampered", files)
    entry["digest"] = "sha256:" + "1" * 64
    refused(sb, ["tampered"], 4, "skill digest mismatch", before)


def test_name_mismatch_rolls_back_even_in_force(sb, pkg_registry):
    good = files_v("mine", "1.0.0")
    pkg_registry.add_skill("mine", good)
    assert sb.run("skill", "install", "mine").returncode == 0
    before = snapshot(*sb.roots.values())
    pkg_registry.add_skill("mine", {"SKILL.md": skill_md("mine", declared="other-name")})
    r = refused(sb, ["mine", "--force"], 4, "strict validation", before)
    assert "other-name" in r.stderr or "name" in r.stderr


@pytest.mark.parametrize("fault,code,text", [
    ("404", 3, "not found"), ("500", 5, "HTTP 500"), ("truncate", 5, "cut short"),
    ("loop", 5, "redirect"), ("slow", 5, "timed out"),
])
def test_network_faults(sb, pkg_registry, fault, code, text):
    pkg_registry.add_skill("flaky", files_v("flaky", "1.0.0"))
    pkg_registry.faults["/pkg/flaky"] = fault
    pkg_registry.slow_seconds = 4
    before = snapshot(*sb.roots.values())
    r = sb.run("skill", "install", "flaky", env={"RNIXFS_HTTP_TIMEOUT": "1"})
    assert r.returncode == code, (r.returncode, r.stderr)
    assert text in r.stderr and "/pkg/flaky" in r.stderr and "Traceback" not in r.stderr
    assert snapshot(*sb.roots.values()) == before


def test_unknown_skill_and_registry_errors(sb, pkg_registry):
    r = sb.run("skill", "install", "no-such-skill")
    assert r.returncode == 3 and "skill search" in r.stderr
    pkg_registry.faults["/.well-known"] = "404"
    r = sb.run("skill", "install", "anything")
    assert r.returncode == 3 and "no skills index" in r.stderr
    env = {"RNIXFS_REGISTRY": ""}
    r = sb.run("skill", "install", "anything", env=env)
    assert r.returncode == 2 and "--registry" in r.stderr
    code, out = sb.json("skill", "install", "anything", env=env)
    assert code == 2 and out == {"ok": False, "error": {"code": "USAGE", "exit_code": 2,
                                                        "message": out["error"]["message"]}}


def test_plain_http_is_refused_off_loopback(sb):
    r = sb.run("skill", "install", "x", "--registry", "http://example.invalid")
    assert r.returncode == 2 and "plain http" in r.stderr


def test_legacy_index_warns_unverifiable(sb, pkg_registry):
    pkg_registry.skills.clear()
    pkg_registry.add_skill("old-style", package=None)
    pkg_registry.index_override = {"skills": [{"name": "old-style", "description": "v0.1",
                                               "files": ["SKILL.md"]}]}
    r = sb.run("skill", "install", "old-style")
    assert r.returncode == 0, r.stderr
    assert "nothing from it can be verified" in r.stderr and "(verified)" not in r.stdout
    # the old well-known path works too
    pkg_registry.well_known = "/.well-known/skills"
    pkg_registry.index_override = None
    pkg_registry.add_skill("older", package=None)
    r = sb.run("skill", "install", "older")
    assert r.returncode == 0, r.stderr
    assert "nothing from it can be verified" in r.stderr


def test_unknown_index_major_version_refused(sb, pkg_registry):
    pkg_registry.index_override = {"version": "1.0.0", "skills": []}
    r = sb.run("skill", "install", "x")
    assert r.returncode == 4 and "not supported" in r.stderr


def test_update_check_and_remove(sb, pkg_registry):
    pkg_registry.add_skill("tool", files_v("tool", "1.0.0"), version="1.0.0")
    assert sb.run("skill", "install", "tool", "-g").returncode == 0
    target = sb.roots["un"] / "tool"
    installed_at = [line for line in (target / ".registry.yaml").read_text().splitlines()
                    if line.startswith("installed_at")]
    code, out = sb.json("skill", "check")
    assert code == 0 and out["data"]["skills"][0]["outcome"] == "up-to-date"
    code, out = sb.json("skill", "update")
    assert code == 0 and out["data"]["updated"][0]["outcome"] == "unchanged"
    pkg_registry.add_skill("tool", files_v("tool", "1.1.0"), version="1.1.0")
    code, out = sb.json("skill", "check")
    assert out["data"]["skills"][0]["outcome"] == "update-available"
    # a project exists, but the update goes back to the origin (user) scope
    r = sb.run("skill", "update", "tool")
    assert r.returncode == 0 and "Updated tool 1.1.0" in r.stdout, r.stderr
    assert (target / "references" / "notes.md").read_text() == "notes 1.1.0\n"
    assert not (sb.roots["pn"] / "tool").exists()
    rec = (target / ".registry.yaml").read_text()
    assert installed_at[0] in rec and "version: 1.1.0" in rec
    assert [a["outcome"] for a in sb.audit() if a["action"] == "update"] == ["unchanged", "ok"]
    # a broken update leaves the installed copy byte for byte
    before = snapshot(*sb.roots.values())
    pkg_registry.add_skill("tool", files_v("tool", "1.2.0"), package_digest="sha256:" + "2" * 64)
    r = sb.run("skill", "update", "tool")
    assert r.returncode == 4 and snapshot(*sb.roots.values()) == before
    # remove
    code, out = sb.json("skill", "remove", "tool")
    assert code == 0 and out["data"]["removed"]["path"] == str(target) and not target.exists()
    assert sb.audit()[-1]["action"] == "remove"
    assert sb.run("skill", "remove", "tool").returncode == 3


def test_update_skips_non_packages_and_refuses_named_ones(sb, pkg_registry):
    assert sb.run("skill", "create", "handmade").returncode == 0
    r = sb.run("skill", "update")
    assert r.returncode == 0 and "No installed skills" in r.stdout
    r = sb.run("skill", "update", "handmade")
    assert r.returncode == 2 and "not installed from a package" in r.stderr


def test_search(sb, pkg_registry):
    pkg_registry.add_skill("pdf-tools", description="Extract text from PDF files", version="1.0.0")
    pkg_registry.add_skill("web-scraper", description="Scrape web pages")
    code, out = sb.json("skill", "search", "pdf")
    assert code == 0 and [s["name"] for s in out["data"]["skills"]] == ["pdf-tools"]
    assert out["data"]["skills"][0]["version"] == "1.0.0"
    r = sb.run("skill", "search")
    assert "pdf-tools" in r.stdout and "web-scraper" in r.stdout
    r = sb.run("skill", "search", "nothing-like-it")
    assert r.returncode == 0 and "No skills match" in r.stdout


def test_named_registry_headers_never_stored(sb, pkg_registry):
    pkg_registry.add_skill("private-skill")
    sb.cfg.mkdir(parents=True, exist_ok=True)
    regs = sb.cfg / "registries.yaml"
    regs.write_text(f"registries:\n  r9s:\n    url: {pkg_registry.url}\n    headers:\n"
                    "      Authorization: \"Bearer ${R9S_TOKEN}\"\n")
    os.chmod(regs, 0o644)
    env = {"R9S_TOKEN": "sekrit-token", "RNIXFS_REGISTRY": ""}
    r = sb.run("skill", "install", "r9s:private-skill", env=env)
    assert r.returncode == 2 and "chmod 600" in r.stderr
    os.chmod(regs, 0o600)
    r = sb.run("skill", "install", "r9s:private-skill", "--header", "X-Extra: two", env=env)
    assert r.returncode == 0, r.stderr
    hdrs = [h for p, h in pkg_registry.requests if p.endswith("index.json")][-1]
    assert hdrs.get("Authorization") == "Bearer sekrit-token" and hdrs.get("X-Extra") == "two"
    everything = (sb.state / "audit.jsonl").read_text() + \
        (sb.roots["pn"] / "private-skill" / ".registry.yaml").read_text()
    assert "sekrit" not in everything and "two" not in everything
    assert "registry: r9s" in (sb.roots["pn"] / "private-skill" / ".registry.yaml").read_text()
    r = sb.run("skill", "install", "nope:x", env=env)
    assert r.returncode == 2 and "no registry named" in r.stderr


def test_scripts_need_yes_off_a_tty_and_allow_scripts_is_recorded(sb, pkg_registry):
    from rnixfs.skills.packages.registry_file import scripts_allowed

    files = {"SKILL.md": skill_md("runner"), "scripts/run.sh": SCRIPT}
    pkg_registry.add_skill("runner", files)
    before = snapshot(*sb.roots.values())
    r = sb.run("skill", "install", "runner")
    assert r.returncode == 8 and "scripts/run.sh" in r.stderr and "--yes" in r.stderr
    assert snapshot(*sb.roots.values()) == before
    r = sb.run("skill", "install", "runner", "--yes")
    assert r.returncode == 0 and "not runnable by agents" in r.stdout
    target = sb.roots["pn"] / "runner"
    assert os.access(target / "scripts" / "run.sh", os.X_OK)
    assert scripts_allowed(target) is False
    r = sb.run("skill", "install", "runner", "--yes", "--force", "--allow-scripts")
    assert r.returncode == 0 and scripts_allowed(target) is True
    assert sb.audit()[-1]["scripts_allowed"] is True
    # skills that are not packages are the user's own
    assert sb.run("skill", "create", "own").returncode == 0
    assert scripts_allowed(sb.roots["pn"] / "own") is True


def test_origin_with_index_and_direct_archives(sb, pkg_registry):
    pkg_registry.add_skill("one")
    pkg_registry.add_skill("two")
    r = sb.run("skill", "install", pkg_registry.url)
    assert r.returncode == 2 and "one" in r.stderr and "--all" in r.stderr
    r = sb.run("skill", "install", pkg_registry.url + "#two")
    assert r.returncode == 0 and (sb.roots["pn"] / "two").is_dir()
    zipped = make_zip({"SKILL.md": skill_md("zipped")}, top="zipped")
    url = pkg_registry.add_blob("/dl/zipped.zip", zipped)
    r = sb.run("skill", "install", url, "-g")
    assert r.returncode == 0, r.stderr
    assert (sb.roots["un"] / "zipped" / "SKILL.md").is_file()
    code, out = sb.json("skill", "list")
    assert next(s for s in out["data"]["skills"] if s["name"] == "zipped")["source"] == "community"
    tgz = make_tar_gz({"SKILL.md": skill_md("pinned")})
    url = pkg_registry.add_blob("/dl/pinned.tar.gz", tgz)
    r = sb.run("skill", "install", url + "#sha256=" + "3" * 64)
    assert r.returncode == 4 and not (sb.roots["pn"] / "pinned").exists()
    r = sb.run("skill", "install", url + "#sha256=" + sha(tgz).split(":")[1])
    assert r.returncode == 0, r.stderr


def test_github_tarball(sb, pkg_registry):
    repo = {"README.md": b"# repo\n",
            "skills/alpha/SKILL.md": skill_md("alpha"),
            "skills/beta/SKILL.md": skill_md("beta"),
            "skills/beta/references/r.md": b"ref\n"}
    pkg_registry.add_repo("acme", "skills", repo, ref="v1")
    pkg_registry.add_repo("acme", "skills", repo, ref="main")
    pkg_registry.add_repo("acme", "solo", {"SKILL.md": skill_md("solo")}, ref="main")
    r = sb.run("skill", "install", "github:acme/skills@v1")
    assert r.returncode == 2 and "alpha, beta" in r.stderr
    assert "[skill]   alpha" in r.stdout and "[skill]   beta" in r.stdout
    code, out = sb.json("skill", "install", "github:acme/skills@v1")
    assert code == 2 and out["data"]["available"] == ["alpha", "beta"]
    r = sb.run("skill", "install", "github:acme/skills/skills/beta@v1")
    assert r.returncode == 0, r.stderr
    rec = (sb.roots["pn"] / "beta" / ".registry.yaml").read_text()
    assert "type: github" in rec and "ref: v1" in rec
    assert (sb.roots["pn"] / "beta" / "references" / "r.md").read_text() == "ref\n"
    r = sb.run("skill", "install", "acme/skills", "--all", "--force")
    assert r.returncode == 0 and (sb.roots["pn"] / "alpha").is_dir(), r.stderr
    r = sb.run("skill", "install", "acme/solo", "--shared")
    assert r.returncode == 0 and (sb.roots["pa"] / "solo" / "SKILL.md").is_file(), r.stderr
    r = sb.run("skill", "install", "github:acme/nothing@v9")
    assert r.returncode == 3 and "github:acme/nothing@v9" in r.stderr
    pkg_registry.faults["/codeload/acme/solo"] = "loop"
    r = sb.run("skill", "update", "solo")
    assert r.returncode == 5 and "redirect" in r.stderr
    # a GitHub update: new content on main
    del pkg_registry.faults["/codeload/acme/solo"]
    pkg_registry.add_repo("acme", "solo", {"SKILL.md": skill_md("solo", "New and improved")}, ref="main")
    r = sb.run("skill", "update", "solo")
    assert r.returncode == 0 and "Updated solo" in r.stdout, r.stderr
    assert b"New and improved" in (sb.roots["pa"] / "solo" / "SKILL.md").read_bytes()


def test_concurrent_installs_of_one_skill(sb, pkg_registry):
    from concurrent.futures import ThreadPoolExecutor

    big = {f"references/f{i}.md": (f"{i}\n" * 2000).encode() for i in range(40)}
    pkg_registry.add_skill("busy", {"SKILL.md": skill_md("busy"), **big})
    with ThreadPoolExecutor(4) as ex:
        results = list(ex.map(lambda _: sb.run("skill", "install", "busy", "--force"), range(4)))
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    target = sb.roots["pn"] / "busy"
    assert sorted(p.name for p in (target / "references").iterdir()) == sorted(p.split("/")[1] for p in big)
    assert not [p for p in sb.roots["pn"].iterdir() if p.name.startswith(".")]
    with ThreadPoolExecutor(4) as ex:
        results = list(ex.map(lambda _: sb.run("skill", "install", "busy", "-g"), range(4)))
    assert sorted(r.returncode for r in results) == [0, 6, 6, 6]


def _pty_run(sb, args, answer: bytes | None, prompt: bytes = b"[y/N]"):
    import pty
    import select
    import subprocess
    import sys
    import time

    import fcntl
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))   # a real width
    p = subprocess.Popen([sys.executable, "-m", "rnixfs.cli", *args], stdin=slave, stdout=slave,
                         stderr=slave, env=sb.env, cwd=sb.project, close_fds=True)
    os.close(slave)
    out = b""
    answered = False
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        r, _, _ = select.select([master], [], [], 0.1)
        if r:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        if answer is not None and not answered and prompt in out:
            os.write(master, answer)
            answered = True
        if p.poll() is not None and not r:
            break
    p.wait(timeout=30)
    os.close(master)
    return p.returncode, out.decode("utf-8", "replace")


def test_tty_prompt_lists_scripts_and_progress_bar(sb, pkg_registry):
    files = {"SKILL.md": skill_md("ttyskill"), "scripts/run.sh": SCRIPT,
             "assets/blob.bin": os.urandom(400_000)}
    pkg_registry.add_skill("ttyskill", files)
    code, out = _pty_run(sb, ["skill", "install", "ttyskill"], b"n\n")
    assert code == 8 and "scripts/run.sh" in out and "declined" in out, out
    assert not (sb.roots["pn"] / "ttyskill").exists()
    code, out = _pty_run(sb, ["skill", "install", "ttyskill"], b"y\n")
    assert code == 0 and "Installed ttyskill" in out, out
    assert "B/s" in out or "%|" in out, out          # tqdm drew a bar on the terminal
    r = sb.run("skill", "install", "ttyskill", "--force", "--yes")
    assert r.returncode == 0 and "B/s" not in r.stderr + r.stdout    # quiet off a TTY


def test_interrupted_update_leaves_the_previous_state(sb, pkg_registry):
    import signal
    import subprocess
    import sys
    import time

    pkg_registry.add_skill("steady", files_v("steady", "1.0.0"), version="1.0.0")
    assert sb.run("skill", "install", "steady").returncode == 0
    before = snapshot(*sb.roots.values())
    pkg_registry.add_skill("steady", files_v("steady", "2.0.0"), version="2.0.0")
    pkg_registry.faults["/pkg/steady"] = "slow"
    pkg_registry.slow_seconds = 30
    pkg_registry.requests.clear()
    p = subprocess.Popen([sys.executable, "-m", "rnixfs.cli", "skill", "update", "steady"], cwd=sb.project,
                         env=sb.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    root = sb.roots["pn"]
    deadline = time.monotonic() + 60
    while not (any(n.startswith(".rnix-pkg-") for n in os.listdir(root)) and
               any(path.startswith("/pkg/steady") for path, _ in pkg_registry.requests)):
        assert time.monotonic() < deadline and p.poll() is None, p.communicate()
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=30)
    assert p.returncode == 128 + signal.SIGTERM
    assert snapshot(*sb.roots.values()) == before


def test_hostile_index_entries(sb, pkg_registry):
    before = snapshot(*sb.roots.values())
    for files in ([{"path": "../evil", "digest": sha(b"x")}, {"path": "SKILL.md", "digest": sha(b"y")}],
                  [{"path": "/etc/passwd", "digest": sha(b"x")}],
                  [{"path": "README.md", "digest": sha(b"x")}],
                  [{"path": "SKILL.md", "digest": "md5:abc"}], []):
        pkg_registry.index_override = {"version": "0.2.0", "skills": [
            {"name": "bad", "description": "d", "digest": sha(b"z"), "files": files}]}
        r = sb.run("skill", "install", "bad")
        assert r.returncode == 4 and "unusable" in r.stderr, r.stderr
    pkg_registry.index_override = {"version": "0.2.0", "skills": [
        {"name": "../../evil", "description": "d", "digest": sha(b"z"),
         "files": [{"path": "SKILL.md", "digest": sha(b"y")}]}]}
    assert sb.run("skill", "install", pkg_registry.url, "--all").returncode == 4
    pkg_registry.index_override = ["not", "an", "index"]
    r = sb.run("skill", "install", "bad")
    assert r.returncode == 4 and "not a skills index" in r.stderr
    assert snapshot(*sb.roots.values()) == before
    assert not (sb.tmp / "evil").exists()


def test_name_mismatch_in_archives_and_repos_rolls_back(sb, pkg_registry):
    before = snapshot(*sb.roots.values())
    url = pkg_registry.add_blob("/dl/liar.zip", make_zip({"SKILL.md": skill_md("liar", declared="honest")},
                                                         top="liar"))
    r = sb.run("skill", "install", url)
    assert r.returncode == 4 and "strict validation" in r.stderr and "honest" in r.stderr, r.stderr
    pkg_registry.add_repo("acme", "liar", {"skills/liar/SKILL.md": skill_md("liar", declared="honest")})
    r = sb.run("skill", "install", "github:acme/liar")
    assert r.returncode == 4 and "strict validation" in r.stderr
    assert snapshot(*sb.roots.values()) == before
    # a SKILL.md at the root of a repository takes its own name
    pkg_registry.add_repo("acme", "rooted", {"SKILL.md": skill_md("rooted-skill")})
    assert sb.run("skill", "install", "acme/rooted").returncode == 0
    assert (sb.roots["pn"] / "rooted-skill" / "SKILL.md").is_file()


def test_registries_yaml_list_form_and_default(sb, pkg_registry):
    pkg_registry.add_skill("listed")
    sb.cfg.mkdir(parents=True, exist_ok=True)
    regs = sb.cfg / "registries.yaml"
    regs.write_text(f"default: corp\nregistries:\n  - name: corp\n    url: {pkg_registry.url}/\n")
    os.chmod(regs, 0o600)
    r = sb.run("skill", "install", "listed", env={"RNIXFS_REGISTRY": ""})
    assert r.returncode == 0, r.stderr
    assert "registry: corp" in (sb.roots["pn"] / "listed" / ".registry.yaml").read_text()
    code, out = sb.json("skill", "search", env={"RNIXFS_REGISTRY": ""})
    assert code == 0 and [s["name"] for s in out["data"]["skills"]] == ["listed"]
    regs.write_text("registries: [{url: x}]\n")
    r = sb.run("skill", "install", "listed", "--force", env={"RNIXFS_REGISTRY": ""})
    assert r.returncode == 2 and "needs a name" in r.stderr


def test_check_reports_local_edits_and_partial_json(sb, pkg_registry):
    pkg_registry.add_skill("edited")
    assert sb.run("skill", "install", "edited").returncode == 0
    (sb.roots["pn"] / "edited" / "NOTES.md").write_text("mine\n")
    code, out = sb.json("skill", "check", "edited")
    assert code == 0 and out["data"]["skills"][0]["modified"] is True
    assert out["data"]["skills"][0]["outcome"] == "up-to-date"
    assert "(modified)" in sb.run("skill", "check").stdout
    # several REFs: what was installed before a failure is reported
    pkg_registry.add_skill("first")
    code, out = sb.json("skill", "install", "first", "missing-one")
    assert code == 3 and [r["name"] for r in out["data"]["installed"]] == ["first"]
