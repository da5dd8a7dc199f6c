"""Where skills come from: one resolver, each kind of source a small class.

``parse_ref`` turns what the user typed into a Source; ``source_from_origin``
rebuilds one from the origin recorded in ``.registry.yaml`` (for update and
check). ``Source.fetch`` downloads into a private work directory and returns
one Fetched per skill, each a directory named by the skill, verified as far
as the source allows (an RFC index: archive, file and skill digests; other
sources: digests computed and recorded for later checks).
"""
from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from ..parse import check_name
from .archive import DEFAULT_LIMITS, Limits, archive_kind, extract
from .discover import find_in_tree
from .package_errors import NetworkError, NotFound, SeveralSkills, UnsafeArchive, UsageError, VerificationFailed
from .fetch import Fetcher, check_url
from .index import Index, IndexEntry, load_index
from .registries import Registries
from .verify import check, digest_bytes, digest_file, is_digest, skill_digest, tree_digests, verify_tree

ARCHIVE_SUFFIXES = (".zip", ".tar.gz", ".tgz", ".tar")
GIT_PREFIXES = ("git://", "ssh://", "git@", "file://", "git+https://", "git+http://", "git+file://",
                "git+ssh://")
GH_PART = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}"
GITHUB_RE = re.compile(rf"({GH_PART})/({GH_PART})((?:/[^@\s]+)?)(?:@([^\s]+))?")
GIT_TIMEOUT = 300


@dataclass
class Context:
    fetcher: Fetcher
    registries: Registries = field(default_factory=Registries)
    registry: str | None = None                 # --registry / $RNIXFS_REGISTRY
    github_api: str = "https://api.github.com"
    limits: Limits = DEFAULT_LIMITS
    warn: Callable[[str], None] = lambda line: None

    def default_registry(self) -> tuple[str, str]:
        """(label recorded as the origin, URL) of the registry a bare NAME uses."""
        if self.registry:
            return self.registry, self.registry
        d = self.registries.default
        if d and d in self.registries.named:
            return d, self.registries.named[d].url
        if d:
            return d, d
        raise UsageError("no registry configured: pass --registry URL, set $RNIXFS_REGISTRY, "
                         "or set 'default' in registries.yaml")


@dataclass
class Fetched:
    name: str
    dir: Path
    origin: dict                 # how to fetch it again (never holds headers)
    kind: str                    # registry | github | git | url | local
    url: str                     # where the bytes came from (for humans and the audit log)
    digest: str                  # the skill digest (verified or computed)
    files: dict[str, str]
    version: str = ""
    ref: str = ""
    package_digest: str | None = None
    verified: bool = False       # checked against digests a publisher signed off in an index
    remote: bool = True


class Source:
    kind = "?"
    remote = True

    def describe(self) -> str:
        raise NotImplementedError

    def fetch(self, ctx: Context, work: Path, all_: bool = False, want: str | None = None) -> list[Fetched]:
        """Download into ``work``; ``want`` picks a skill by name (update)."""
        raise NotImplementedError


# --- registries (RFC index) -----------------------------------------------------------


def _write_file(root: Path, rel: str, data: bytes) -> None:
    target = root.joinpath(*rel.split("/"))
    target.parent.mkdir(parents=True, exist_ok=True)
    if not os.path.realpath(target.parent).startswith(os.path.realpath(root)):
        raise UnsafeArchive(f"{rel!r} leaves the skill")
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                 0o755 if rel.startswith("scripts/") else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def fetch_entry(ctx: Context, idx: Index, entry: IndexEntry, work: Path, origin: dict) -> Fetched:
    """Download one index entry and verify it in the RFC's order."""
    src = f"{idx.url} ({entry.name})"
    if entry.error:
        raise VerificationFailed(f"{src}: the index entry is unusable: {entry.error}")
    out = Path(_mkwork(work)) / entry.name
    out.mkdir()
    pkg_digest = None
    if entry.package_url:
        arch = Path(_mkwork(work)) / "package"
        ctx.fetcher.download(entry.package_url, arch, what="package")
        pkg_digest = digest_file(arch)
        check("package", entry.package_digest, pkg_digest, entry.package_url)        # steps 1-2
        extract(arch, out, source=entry.package_url, limits=ctx.limits)               # step 3
        _hoist(out, entry.name)
    else:
        for rel, dig in entry.files.items():
            url = entry.base_url + quote(rel)
            data = ctx.fetcher.get_bytes(url, what=f"file {rel}")
            if dig is not None:
                check(f"file {rel!r}", dig, digest_bytes(data), url)
            _write_file(out, rel, data)
    if entry.verifiable:
        files = verify_tree(out, entry.files, entry.digest, src)                      # steps 4-5
    else:
        files = tree_digests(out)
    return Fetched(entry.name, out, origin, "registry", entry.package_url or entry.base_url,
                   skill_digest(files), files, version=entry.version, package_digest=pkg_digest,
                   verified=entry.verifiable)


def _hoist(out: Path, name: str) -> None:
    """An archive holding only ``<name>/`` is read as the skill directory itself."""
    kids = list(out.iterdir())
    if len(kids) == 1 and kids[0].is_dir() and not kids[0].is_symlink() and not (out / "SKILL.md").exists():
        tmp = out.parent / (".hoist-" + name)
        os.rename(kids[0], tmp)
        os.rmdir(out)
        os.rename(tmp, out)


_counter = [0]


def _mkwork(work: Path) -> str:
    _counter[0] += 1
    d = Path(work) / f"w{_counter[0]}"
    d.mkdir()
    return str(d)


@dataclass
class RegistrySource(Source):
    """``NAME`` (default registry), ``prefix:NAME`` (named registry), or an https
    origin serving an index (``name`` None: the one skill, or all with --all)."""

    label: str                   # registry name or URL, as recorded
    url: str
    name: str | None
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    archive_fallback: bool = False   # a typed URL with a path: may be an archive without a suffix
    kind = "registry"

    def describe(self) -> str:
        return f"{self.name or '*'} from registry {self.label}"

    def index(self, ctx: Context) -> Index:
        ctx.fetcher.headers.update(self.headers)
        return load_index(ctx.fetcher, self.url, ctx.warn)

    def fetch(self, ctx: Context, work: Path, all_: bool = False, want: str | None = None) -> list[Fetched]:
        try:
            idx = self.index(ctx)
        except NotFound:
            if not self.archive_fallback:
                raise
            # ``https://host/download/tool`` may serve a zip or tarball itself.
            arch = Path(_mkwork(work)) / "archive"
            try:
                ctx.fetcher.download(self.url, arch, what="archive")
            except NotFound:
                arch.unlink(missing_ok=True)
            if not arch.exists() or archive_kind(arch) is None:
                raise
            return ArchiveUrlSource(self.url).from_file(ctx, work, arch, all_, want)
        name = self.name or want
        if name is not None:
            entry = idx.entries.get(name)
            if entry is None:
                raise NotFound(f"skill {name!r} is not in registry {self.label} ({idx.url}); "
                               "try: rnixfs skill search")
            entries = [entry]
        else:
            entries = _choose(list(idx.entries.values()), lambda e: e.name, all_, self.url)
        return [fetch_entry(ctx, idx, e, work, {"type": "registry", "registry": self.label, "name": e.name})
                for e in entries]


def _choose(items: list, name_of, all_: bool, source: str) -> list:
    if not items:
        raise NotFound(f"{source}: holds no skills")
    if len(items) == 1 or all_:
        return items
    names = [name_of(i) for i in items]
    raise SeveralSkills(f"{source} holds {len(items)} skills ({', '.join(names[:20])}); "
                        "name one or pass --all", names)


# --- trees: GitHub tarballs, https archives, git repositories, local paths ---------------


def _copy_safe(src: Path, dest: Path, limits: Limits, source: str) -> None:
    """Copy a skill directory, refusing devices, FIFOs and links out of it."""
    real_src = os.path.realpath(src)
    count = total = 0
    for dirpath, dirnames, filenames in os.walk(src, followlinks=False):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        rel_dir = os.path.relpath(dirpath, src)
        out_dir = dest if rel_dir == "." else dest / rel_dir
        out_dir.mkdir(parents=True, exist_ok=True)
        for n in list(dirnames) + filenames:
            p = Path(dirpath) / n
            st = os.lstat(p)
            rel = os.path.normpath(os.path.join(rel_dir, n))
            if stat.S_ISLNK(st.st_mode):
                real = os.path.realpath(p)
                if real != real_src and not real.startswith(real_src + os.sep):
                    raise UnsafeArchive(f"{source}: symlink {rel!r} leads out of the skill")
                if n in dirnames:
                    dirnames.remove(n)
                os.symlink(os.readlink(p), out_dir / n)
                count += 1
            elif stat.S_ISDIR(st.st_mode):
                continue
            elif stat.S_ISREG(st.st_mode):
                count += 1
                total += st.st_size
                if count > limits.max_files or st.st_size > limits.max_file_bytes or total > limits.max_total_bytes:
                    raise UnsafeArchive(f"{source}: the skill is over the file-count or size cap")
                shutil.copyfile(p, out_dir / n, follow_symlinks=False)
                os.chmod(out_dir / n, 0o755 if st.st_mode & 0o111 else 0o644)
            else:
                raise UnsafeArchive(f"{source}: {rel!r} is a device file or FIFO")


def tree_fetched(ctx: Context, tree: Path, path: str | None, all_: bool, work: Path, *, kind: str,
                 url: str, origin: dict, ref: str = "", move: bool = True, remote: bool = True,
                 want: str | None = None) -> list[Fetched]:
    found = find_in_tree(tree, path, url)
    if want is not None:
        found = [f for f in found if f.name == want] or found[:1]
    unique: dict[str, object] = {}
    for f in found:                       # the same name twice: the first place searched wins
        unique.setdefault(f.name, f)
    found = _choose(list(unique.values()), lambda f: f.name, all_, url)
    out = []
    for f in found:
        # A skill in its own directory is installed under that directory's name,
        # so a frontmatter name that disagrees fails strict validation (rolled
        # back); only a SKILL.md at the root of the tree takes its own name.
        if not f.rel and (check_name(f.name) or (f.name == f.path.name and f.path.parent == Path(work))):
            # A root SKILL.md of a download has no directory to be named after:
            # without a valid frontmatter name it would get a work directory's name.
            raise VerificationFailed(
                f"{url}: the SKILL.md at its root has no valid frontmatter name "
                f"({'; '.join(check_name(f.name)) or 'name missing'}) - nothing was installed; fix its 'name'")
        name = f.path.name if f.rel or check_name(f.name) else f.name
        dest = Path(_mkwork(work)) / name
        if move:
            os.rename(f.path, dest)
        else:
            _copy_safe(f.path, dest, ctx.limits, url)
        files = tree_digests(dest)
        out.append(Fetched(name, dest, {**origin, "path": f.rel, "name": name}, kind, url,
                           skill_digest(files), files, ref=ref, remote=remote))
    return out


@dataclass
class GithubSource(Source):
    owner: str
    repo: str
    path: str | None = None
    ref: str | None = None
    kind = "github"

    def describe(self) -> str:
        return f"github:{self.owner}/{self.repo}{'/' + self.path if self.path else ''}{'@' + self.ref if self.ref else ''}"

    def fetch(self, ctx: Context, work: Path, all_: bool = False, want: str | None = None) -> list[Fetched]:
        api = ctx.github_api.rstrip("/")
        url = f"{api}/repos/{quote(self.owner)}/{quote(self.repo)}/tarball" + (f"/{quote(self.ref)}" if self.ref else "")
        arch = Path(_mkwork(work)) / "tarball"
        try:
            ctx.fetcher.download(url, arch, what="repository tarball")
        except NotFound:
            raise NotFound(f"{self.describe()}: repository or ref not found ({url}); "
                           "check owner/repo and @ref, or pass --header for a private repository") from None
        tree = Path(_mkwork(work))
        extract(arch, tree, source=url, strip=1, limits=ctx.limits)
        origin = {"type": "github", "repo": f"{self.owner}/{self.repo}", "ref": self.ref or ""}
        return tree_fetched(ctx, tree, self.path, all_, work, kind="github", url=url, origin=origin,
                            ref=self.ref or "", want=want)


@dataclass
class ArchiveUrlSource(Source):
    url: str
    digest: str | None = None          # from a ``#sha256=<hex>`` fragment
    kind = "url"

    def describe(self) -> str:
        return self.url

    def fetch(self, ctx: Context, work: Path, all_: bool = False, want: str | None = None) -> list[Fetched]:
        arch = Path(_mkwork(work)) / "archive"
        ctx.fetcher.download(self.url, arch, what="archive")
        return self.from_file(ctx, work, arch, all_, want)

    def from_file(self, ctx: Context, work: Path, arch: Path, all_: bool, want: str | None) -> list[Fetched]:
        got = digest_file(arch)
        if self.digest:
            check("archive", self.digest, got, self.url)
        tree = Path(_mkwork(work))
        extract(arch, tree, source=self.url, limits=ctx.limits)
        origin = {"type": "url", "url": self.url, **({"digest": self.digest} if self.digest else {})}
        out = tree_fetched(ctx, tree, None, all_, work, kind="url", url=self.url, origin=origin, want=want)
        for f in out:
            f.package_digest = got
        return out


@dataclass
class GitSource(Source):
    url: str
    ref: str | None = None
    path: str | None = None
    kind = "git"

    def describe(self) -> str:
        return self.url + (f"#{self.ref}" if self.ref else "")

    def fetch(self, ctx: Context, work: Path, all_: bool = False, want: str | None = None) -> list[Fetched]:
        url = self.url[4:] if self.url.startswith("git+") else self.url
        if url.startswith("-"):
            raise UsageError(f"{self.url}: not a git URL")
        tree = Path(_mkwork(work)) / "repo"
        cmd = ["git", "-c", "protocol.file.allow=always", "clone", "--quiet", "--depth", "1",
               "--no-recurse-submodules"]
        if self.ref:
            cmd += ["--branch", self.ref]
        cmd += ["--", url, str(tree)]
        env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true", "GIT_LFS_SKIP_SMUDGE": "1"}
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=GIT_TIMEOUT, env=env,
                               stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise UsageError("git is not installed; install git to use git URLs") from None
        except subprocess.TimeoutExpired:
            raise NetworkError(f"{self.describe()}: git clone timed out after {GIT_TIMEOUT}s") from None
        if r.returncode != 0:
            msg = (r.stderr.strip().splitlines() or ["git clone failed"])[-1]
            cls = NotFound if re.search(r"not found|does not exist|not appear to be a git|Remote branch", r.stderr) else NetworkError
            raise cls(f"{self.describe()}: git clone failed: {msg}")
        commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True,
                                text=True, stdin=subprocess.DEVNULL).stdout.strip()
        origin = {"type": "git", "url": self.url, "ref": self.ref or ""}
        out = tree_fetched(ctx, tree, self.path, all_, work, kind="git", url=self.url, origin=origin,
                           ref=self.ref or "", move=False, want=want)
        for f in out:
            f.origin["commit"] = commit
        return out


@dataclass
class LocalSource(Source):
    path: Path
    kind = "local"
    remote = False

    def describe(self) -> str:
        return str(self.path)

    def fetch(self, ctx: Context, work: Path, all_: bool = False, want: str | None = None) -> list[Fetched]:
        p = self.path
        if not os.path.lexists(p):
            raise NotFound(f"{p}: no such file or directory")
        origin = {"type": "local", "path": str(p)}
        if p.is_dir():
            return tree_fetched(ctx, p, None, all_, work, kind="local", url=str(p), origin=origin,
                                move=False, remote=False, want=want)
        if not p.is_file():
            raise UsageError(f"{p}: not a directory or an archive")
        tree = Path(_mkwork(work))
        extract(p, tree, source=str(p), limits=ctx.limits)
        out = tree_fetched(ctx, tree, None, all_, work, kind="local", url=str(p), origin=origin,
                           remote=False, want=want)
        for f in out:
            f.package_digest = digest_file(p)
        return out


# --- the resolver -----------------------------------------------------------------------


def _is_git_url(ref: str) -> bool:
    return ref.startswith(GIT_PREFIXES) or (ref.startswith(("https://", "http://")) and
                                             urlsplit(ref).path.endswith(".git"))


def _split_fragment(ref: str) -> tuple[str, str]:
    parts = urlsplit(ref)
    return urlunsplit(parts._replace(fragment="")), parts.fragment


def _github_web_url(ref: str) -> GithubSource | None:
    """``https://github.com/o/r[/tree/REF[/path]]`` as users copy it from a browser."""
    parts = urlsplit(ref)
    if parts.scheme != "https" or parts.hostname not in ("github.com", "www.github.com"):
        return None
    segs = [s for s in parts.path.split("/") if s]
    if len(segs) < 2 or segs[1].endswith(".git"):
        return None
    owner, repo = segs[0], segs[1]
    ref_, path = None, None
    if len(segs) >= 4 and segs[2] == "tree":
        ref_, path = segs[3], "/".join(segs[4:]) or None
    elif len(segs) > 2:
        return None
    if not GITHUB_RE.fullmatch(f"{owner}/{repo}"):
        return None
    return GithubSource(owner, repo, path, ref_)


def parse_ref(ref: str, ctx: Context) -> Source:
    """What the user typed -> a Source (no network)."""
    if not ref or "\x00" in ref or "\n" in ref:
        raise UsageError(f"invalid reference {ref[:80]!r}")
    if ref.startswith("github:"):
        m = GITHUB_RE.fullmatch(ref[len("github:"):])
        if not m:
            raise UsageError(f"{ref}: expected github:owner/repo[/path][@ref]")
        return GithubSource(m.group(1), m.group(2), m.group(3).strip("/") or None, m.group(4) or None)
    if _is_git_url(ref):
        url, frag = _split_fragment(ref) if "#" in ref else (ref, "")
        gref, _, path = frag.partition(":")
        return GitSource(url, gref or None, path or None)
    gh = _github_web_url(ref)
    if gh is not None:
        return gh
    if ref.startswith(("https://", "http://")):
        url, frag = _split_fragment(ref)
        check_url(url)
        if urlsplit(url).path.lower().endswith(ARCHIVE_SUFFIXES):
            digest = None
            if frag:
                digest = frag.replace("sha256=", "sha256:", 1)
                if not is_digest(digest):
                    raise UsageError(f"{ref}: the fragment must be #sha256=<64 hex digits>")
            return ArchiveUrlSource(url, digest)
        return RegistrySource(url, url, frag or None,
                              archive_fallback=not frag and urlsplit(url).path not in ("", "/"))
    if ref.startswith(("./", "../", "/", "~")) or os.path.lexists(ref):
        return LocalSource(Path(os.path.abspath(os.path.expanduser(ref))))
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", ref):
        raise UsageError(f"{ref}: unsupported URL scheme (use https://, a git URL, github:, or a path)")
    if ":" in ref:
        prefix, _, name = ref.partition(":")
        reg = ctx.registries.named.get(prefix)
        if reg is None:
            raise UsageError(f"{ref}: no registry named {prefix!r} in registries.yaml")
        if check_name(name):
            raise UsageError(f"{ref}: {name!r} is not a valid skill name")
        return RegistrySource(prefix, reg.url, name, dict(reg.headers))
    if "/" in ref:
        m = GITHUB_RE.fullmatch(ref)
        if not m:
            raise UsageError(f"{ref}: expected owner/repo[/path][@ref]")
        return GithubSource(m.group(1), m.group(2), m.group(3).strip("/") or None, m.group(4) or None)
    if check_name(ref):
        raise UsageError(f"{ref!r} is not a skill name, a path, a URL or owner/repo")
    label, url = ctx.default_registry()
    headers = {}
    if label in ctx.registries.named:
        headers = dict(ctx.registries.named[label].headers)
    return RegistrySource(label, url, ref, headers)


def source_from_origin(origin: dict, ctx: Context) -> tuple[Source, str | None]:
    """Rebuild the Source recorded in ``.registry.yaml``; returns (source, skill name)."""
    t = origin.get("type")
    name = origin.get("name")
    if t == "registry":
        label = str(origin.get("registry") or "")
        reg = ctx.registries.named.get(label)
        if reg is not None:
            return RegistrySource(label, reg.url, name, dict(reg.headers)), name
        if "://" not in label:
            raise UsageError(f"registry {label!r} is no longer in registries.yaml")
        check_url(label)
        return RegistrySource(label, label, name), name
    if t == "github":
        owner, _, repo = str(origin.get("repo", "")).partition("/")
        return GithubSource(owner, repo, origin.get("path") or None, origin.get("ref") or None), name
    if t == "git":
        return GitSource(str(origin["url"]), origin.get("ref") or None, origin.get("path") or None), name
    if t == "url":
        return ArchiveUrlSource(str(origin["url"]), origin.get("digest")), name
    if t == "local":
        return LocalSource(Path(str(origin["path"]))), name
    raise UsageError(f"unknown origin type {t!r} in .registry.yaml")
