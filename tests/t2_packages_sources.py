"""The resolver: what each kind of reference becomes (no network)."""
from __future__ import annotations

from pathlib import Path

import pytest

from rnixfs.skills.packages.package_errors import UsageError
from rnixfs.skills.packages.fetch import Fetcher
from rnixfs.skills.packages.registries import Registries, Registry
from rnixfs.skills.packages.sources import (
    ArchiveUrlSource, Context, GithubSource, GitSource, LocalSource, RegistrySource, parse_ref,
    source_from_origin,
)
from rnixfs.skills.packages.verify import skill_digest


def ctx(registry="https://reg.example"):
    regs = Registries({"r9s": Registry("r9s", "https://r9s.example", {"Authorization": "Bearer t"})})
    return Context(Fetcher(), regs, registry)


@pytest.mark.parametrize("ref,expected", [
    ("pdf-tools", RegistrySource("https://reg.example", "https://reg.example", "pdf-tools")),
    ("r9s:pdf-tools", RegistrySource("r9s", "https://r9s.example", "pdf-tools")),
    ("github:acme/skills", GithubSource("acme", "skills", None, None)),
    ("github:acme/skills/skills/beta@v1.2", GithubSource("acme", "skills", "skills/beta", "v1.2")),
    ("acme/skills@main", GithubSource("acme", "skills", None, "main")),
    ("https://github.com/acme/skills/tree/main/skills/x", GithubSource("acme", "skills", "skills/x", "main")),
    ("https://github.com/acme/skills", GithubSource("acme", "skills", None, None)),
    ("https://github.com/acme/skills.git", GitSource("https://github.com/acme/skills.git")),
    ("https://dl.example/a/b.zip", ArchiveUrlSource("https://dl.example/a/b.zip")),
    ("https://dl.example/b.tar.gz#sha256=" + "a" * 64, ArchiveUrlSource("https://dl.example/b.tar.gz",
                                                                       "sha256:" + "a" * 64)),
    ("https://origin.example", RegistrySource("https://origin.example", "https://origin.example", None)),
    ("https://origin.example#one", RegistrySource("https://origin.example", "https://origin.example", "one")),
    ("git@host:team/skills.git", GitSource("git@host:team/skills.git")),
    ("file:///srv/repo#v1:skills/x", GitSource("file:///srv/repo", "v1", "skills/x")),
    ("git+https://host/x#dev", GitSource("git+https://host/x", "dev")),
    ("./local-skill", LocalSource(Path("./local-skill").absolute())),
    ("/abs/skill.zip", LocalSource(Path("/abs/skill.zip"))),
])
def test_parse_ref(ref, expected):
    got = parse_ref(ref, ctx())
    assert type(got) is type(expected)
    assert {k: v for k, v in got.__dict__.items() if k != "headers"} == \
        {k: v for k, v in expected.__dict__.items() if k != "headers"}


@pytest.mark.parametrize("ref,text", [
    ("", "invalid reference"), ("Bad Name", "not a skill name"), ("nope:x", "no registry named"),
    ("r9s:../x", "not a valid skill name"), ("github:only-owner", "github:owner/repo"),
    ("http://remote.example/x.zip", "plain http"), ("ftp://x/y", "unsupported URL scheme"),
    ("https://dl.example/b.zip#md5=abc", "#sha256="),
])
def test_bad_refs(ref, text):
    with pytest.raises(UsageError, match=text):
        parse_ref(ref, ctx())


def test_no_default_registry():
    with pytest.raises(UsageError, match="--registry"):
        parse_ref("pdf-tools", ctx(None))


def test_named_registry_headers_and_origins_round_trip():
    src = parse_ref("r9s:pdf", ctx())
    assert src.headers == {"Authorization": "Bearer t"} and "Bearer" not in repr(ctx().registries.named["r9s"])
    for origin, kind in (({"type": "registry", "registry": "r9s", "name": "pdf"}, RegistrySource),
                         ({"type": "registry", "registry": "https://x.example", "name": "pdf"}, RegistrySource),
                         ({"type": "github", "repo": "a/b", "ref": "v1", "path": "skills/x", "name": "x"}, GithubSource),
                         ({"type": "git", "url": "file:///r", "ref": "", "name": "x"}, GitSource),
                         ({"type": "url", "url": "https://d.example/x.zip"}, ArchiveUrlSource),
                         ({"type": "local", "path": "/x"}, LocalSource)):
        s, _ = source_from_origin(origin, ctx())
        assert type(s) is kind
    with pytest.raises(UsageError):
        source_from_origin({"type": "registry", "registry": "gone", "name": "x"}, ctx())
    with pytest.raises(UsageError):
        source_from_origin({"type": "ftp"}, ctx())


def test_rfc_worked_example_digest():
    files = {"SKILL.md": "sha256:90f8ec5669cd34183b9b0fdf8b94f5efb4c3672876330f4aa76088c2b4ad17be",
             "scripts/run.sh": "sha256:a8076d3d28d21e02012b20eaf7dbf75409a6277134439025f282e368e3305abf"}
    assert skill_digest(files) == "sha256:34f7a8c484e9991f3e71a309f31332d6335efc01f544105c4185a7c4ab12eb1e"
