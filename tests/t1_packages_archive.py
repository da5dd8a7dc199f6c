"""Hostile archives: each refused with a clear error, nothing written outside."""
from __future__ import annotations

import gzip
import io
import os
import stat
import tarfile
import zipfile

import pytest

from rnixfs.skills.packages.archive import Limits, extract
from rnixfs.skills.packages.package_errors import UnsafeArchive
from tests.pkg_registry import make_tar_gz, skill_md
from tests.pkgutil import Sandbox, pkg_registry, snapshot  # noqa: F401


def tar(members: list[tuple], gz: bool = True) -> bytes:
    """members: (name, kind, payload) with kind file|dir|sym|hard|chr|fifo."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gz else "w") as tf:
        for name, kind, payload in members:
            info = tarfile.TarInfo(name)
            data = None
            if kind == "file":
                data = payload
                info.size = len(payload)
            elif kind == "dir":
                info.type = tarfile.DIRTYPE
            elif kind == "sym":
                info.type, info.linkname = tarfile.SYMTYPE, payload
            elif kind == "hard":
                info.type, info.linkname = tarfile.LNKTYPE, payload
            elif kind == "chr":
                info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def zipped(members: list[tuple]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, kind, payload in members:
            info = zipfile.ZipInfo(name)
            mode = {"file": stat.S_IFREG | 0o644, "sym": stat.S_IFLNK | 0o777,
                    "chr": stat.S_IFCHR | 0o644, "fifo": stat.S_IFIFO | 0o644}[kind]
            info.external_attr = mode << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, payload if isinstance(payload, bytes) else payload.encode())
    return buf.getvalue()


OK = ("SKILL.md", "file", skill_md("x"))
HOSTILE = {
    "dotdot": (tar([OK, ("../evil", "file", b"x")]), "path traversal"),
    "dotdot-deep": (tar([OK, ("a/../../evil", "file", b"x")]), "path traversal"),
    "absolute": (tar([OK, ("/tmp/evil-abs", "file", b"x")]), "absolute path"),
    "symlink-abs": (tar([OK, ("link", "sym", "/etc/passwd")]), "leaves the skill"),
    "symlink-up": (tar([OK, ("link", "sym", "../../evil")]), "leaves the skill"),
    "symlink-chain": (tar([OK, ("sub/d", "sym", ".."), ("sub/a", "sym", "d/..")]), "leads out"),
    "through-symlink": (tar([OK, ("d", "sym", "."), ("d/x", "file", b"x")]), "passes through"),
    "hardlink-out": (tar([OK, ("h", "hard", "/etc/passwd")]), "absolute path"),
    "hardlink-missing": (tar([OK, ("h", "hard", "nowhere")]), "hard link"),
    "device": (tar([OK, ("dev", "chr", None)]), "device file"),
    "fifo": (tar([OK, ("pipe", "fifo", None)]), "FIFO"),
    "duplicate": (tar([OK, ("SKILL.md", "file", b"again")]), "duplicate"),
    "nul-backslash": (tar([OK, ("a\\..\\evil", "file", b"x")]), "backslash"),
    "zip-dotdot": (zipped([OK, ("../evil", "file", b"x")]), "path traversal"),
    "zip-symlink": (zipped([OK, ("link", "sym", "/etc")]), "leaves the skill"),
    "zip-device": (zipped([OK, ("dev", "chr", b"")]), "device file"),
    "zip-fifo": (zipped([OK, ("p", "fifo", b"")]), "FIFO"),
    "not-an-archive": (b"hello, I am text\n" * 40, "not a .tar.gz"),
    "truncated-gzip": (tar([OK, ("big", "file", os.urandom(50000))])[:3000], "corrupt or truncated"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_archive_refused(tmp_path, case):
    data, text = HOSTILE[case]
    arch = tmp_path / "a.bin"
    arch.write_bytes(data)
    dest = tmp_path / "deep" / "dest"
    dest.mkdir(parents=True)
    with pytest.raises(UnsafeArchive) as ei:
        extract(arch, dest, source="test-archive")
    assert text in str(ei.value) and "test-archive" in str(ei.value)
    assert not (tmp_path / "evil").exists() and not (tmp_path / "deep" / "evil").exists()
    assert not os.path.exists("/tmp/evil-abs")


def test_caps(tmp_path):
    arch = tmp_path / "a.tgz"
    dest = tmp_path / "d"
    cases = [
        (tar([OK] + [(f"f{i}", "file", b"x") for i in range(12)]), Limits(max_files=10), "more than 10 files"),
        (tar([OK, ("big", "file", os.urandom(5000))]), Limits(max_file_bytes=4096), "larger than 4096"),
        (tar([OK] + [(f"f{i}", "file", os.urandom(3000)) for i in range(4)]),
         Limits(max_total_bytes=8000), "expands past"),
    ]
    for data, limits, text in cases:
        arch.write_bytes(data)
        dest.mkdir()
        with pytest.raises(UnsafeArchive, match=text):
            extract(arch, dest, source="s", limits=limits)
        import shutil
        shutil.rmtree(dest)


def test_gzip_and_zip_bombs(tmp_path):
    # 80 MiB of zeros inside a tar inside gzip: a few dozen KiB on the wire.
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tf:
        info = tarfile.TarInfo("SKILL.md")
        info.size = 80 << 20
        tf.addfile(info, io.BytesIO(bytes(80 << 20)))
    bomb = gzip.compress(raw.getvalue(), 9)
    assert len(bomb) < 200_000
    (tmp_path / "b.tgz").write_bytes(bomb)
    (tmp_path / "d").mkdir()
    with pytest.raises(UnsafeArchive, match="decompression bomb"):
        extract(tmp_path / "b.tgz", tmp_path / "d", source="bomb")
    zb = io.BytesIO()
    with zipfile.ZipFile(zb, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("SKILL.md", bytes(30 << 20))
    (tmp_path / "b.zip").write_bytes(zb.getvalue())
    (tmp_path / "e").mkdir()
    with pytest.raises(UnsafeArchive, match="decompression bomb"):
        extract(tmp_path / "b.zip", tmp_path / "e", source="bomb")
    assert sum(f.stat().st_size for f in (tmp_path / "e").rglob("*")) <= 30 << 20


def test_safe_archive_with_inner_symlink_and_hardlink(tmp_path):
    data = tar([OK, ("references/a.md", "file", b"A\n"), ("references/b.md", "sym", "a.md"),
                ("references/c.md", "hard", "references/a.md"), ("scripts/run.sh", "file", b"#!/bin/sh\n")])
    (tmp_path / "ok.tgz").write_bytes(data)
    dest = tmp_path / "d"
    dest.mkdir()
    extract(tmp_path / "ok.tgz", dest, source="ok")
    assert os.readlink(dest / "references" / "b.md") == "a.md"
    assert (dest / "references" / "c.md").read_bytes() == b"A\n"
    assert not (dest / "references" / "c.md").is_symlink()


@pytest.mark.parametrize("case", ["dotdot", "symlink-abs", "device", "zip-dotdot", "symlink-chain"])
def test_hostile_package_through_the_cli_leaves_nothing(tmp_path, pkg_registry, case):
    sb = Sandbox(tmp_path, pkg_registry)
    data, text = HOSTILE[case]
    pkg_registry.add_skill("x", package="zip" if case.startswith("zip") else "tar.gz", package_bytes=data)
    before = snapshot(*sb.roots.values(), tmp_path)
    r = sb.run("skill", "install", "x")
    assert r.returncode == 7, (r.returncode, r.stderr)
    assert text in r.stderr and "/pkg/x." in r.stderr and "Traceback" not in r.stderr
    after = snapshot(*sb.roots.values(), tmp_path)
    after = {k: v for k, v in after.items() if not k.startswith(str(sb.state))}
    before = {k: v for k, v in before.items() if not k.startswith(str(sb.state))}
    assert after == before


def test_hostile_github_tarball(tmp_path, pkg_registry):
    sb = Sandbox(tmp_path, pkg_registry)
    evil = tar([("top/SKILL.md", "file", skill_md("x")), ("top/../../evil", "file", b"x")])
    pkg_registry.add_repo("bad", "repo", {}, ref="main", raw=evil)
    before = snapshot(*sb.roots.values())
    r = sb.run("skill", "install", "github:bad/repo")
    assert r.returncode == 7 and "path traversal" in r.stderr
    assert snapshot(*sb.roots.values()) == before and not (tmp_path / "evil").exists()
    ok = make_tar_gz({"SKILL.md": skill_md("fine")}, top="bad-repo-123")
    pkg_registry.add_repo("bad", "repo", {}, ref="main", raw=ok)
    assert sb.run("skill", "install", "github:bad/repo").returncode == 0
