"""Installing, updating and removing skill packages, atomically.

Everything is fetched and verified in a private work directory inside the
target scope root (``.rnix-pkg-<pid>-*``, hidden from resolution), so the
final step is a rename on one filesystem: ``renameat2(RENAME_NOREPLACE)``
for a new skill, ``RENAME_EXCHANGE`` to replace one. A failed or
interrupted install or update leaves the previous state byte for byte; one
lock per scope root (``flock`` on the directory) serializes the final
swaps, so concurrent installs of one skill never mix their files.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..model import is_within
from ..parse import validate_strict
from ..resolve import AGENTS, NATIVE, PROJECT, USER, ScopePath, home_dir, path_status
from .audit import audit, now_iso
from .package_errors import AlreadyInstalled, ConfirmationRequired, NotFound, PackageError, UsageError, VerificationFailed
from .registry_file import read_record, write_record
from .sources import Context, Fetched, RegistrySource, parse_ref, source_from_origin
from .verify import skill_digest, tree_digests

WORK_PREFIX = ".rnix-pkg-"
_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2
_AT_FDCWD = -100


def target_scope(project: Path | None, config_dir: Path, *, global_: bool = False, shared: bool = False,
                 home: Path | None = None) -> ScopePath:
    """Rnix's writeScope table.

    ============  ======================  ===========================
    flags         inside a .rnix project   outside
    ============  ======================  ===========================
    (none)        <project>/.rnix/skills   <config>/skills
    -g            <config>/skills          <config>/skills
    --shared      <project>/.agents/skills ~/.agents/skills
    -g --shared   ~/.agents/skills         ~/.agents/skills
    ============  ======================  ===========================
    """
    if shared:
        if project is not None and not global_:
            path, scope = Path(os.path.abspath(project)) / ".agents" / "skills", PROJECT
        else:
            path, scope = home_dir(home) / ".agents" / "skills", USER
        return ScopePath(path, scope, AGENTS, path_status(path))
    if project is not None and not global_:
        path, scope = Path(os.path.abspath(project)) / ".rnix" / "skills", PROJECT
    else:
        path, scope = Path(os.path.abspath(config_dir)) / "skills", USER
    return ScopePath(path, scope, NATIVE, path_status(path))


def list_scripts(skill_dir: Path) -> list[str]:
    """Files an agent could run: everything under scripts/, and executables."""
    out = []
    for dirpath, dirnames, filenames in os.walk(skill_dir):
        dirnames.sort()
        for fn in sorted(filenames):
            p = Path(dirpath) / fn
            rel = p.relative_to(skill_dir).as_posix()
            if rel == ".registry.yaml" or p.is_symlink():
                continue
            if rel.startswith("scripts/") or os.stat(p).st_mode & 0o111:
                out.append(rel)
    return out


def _renameat2(src: Path, dst: Path, flags: int) -> bool:
    """True if done; False when the kernel/libc lacks renameat2."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL):
        return False
    raise OSError(err, os.strerror(err), str(dst))


def swap_into_place(staged: Path, target: Path) -> None:
    """Put ``staged`` at ``target`` atomically; the old copy (if any) is removed."""
    if not os.path.lexists(target):
        if not _renameat2(staged, target, _RENAME_NOREPLACE):
            os.rename(staged, target)
        return
    if _renameat2(staged, target, _RENAME_EXCHANGE):
        old = staged
    else:
        old = staged.with_name(staged.name + ".old")
        os.rename(target, old)
        os.rename(staged, target)
    if old.is_symlink() or not old.is_dir():
        old.unlink()
    else:
        shutil.rmtree(old, ignore_errors=True)


def remove_dir(path: Path, root: Path) -> None:
    """Remove an installed skill directory atomically (rename, then delete at
    leisure); a symlinked skill loses only its link. One of several concurrent
    removers wins, the others get NotFound."""
    if path.parent != root:
        raise PackageError(f"refusing to remove {path}: not directly inside {root}")
    with root_lock(root):
        try:
            if path.is_symlink() or not path.is_dir():
                path.unlink()
                return
            grave = Path(tempfile.mkdtemp(prefix=f"{WORK_PREFIX}{os.getpid()}-", dir=root)) / path.name
            os.rename(path, grave)
        except FileNotFoundError:
            raise NotFound(f'skill "{path.name}" is not installed at {path}') from None
    shutil.rmtree(grave.parent, ignore_errors=True)


@contextmanager
def root_lock(root: Path):
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale_work(root: Path) -> None:
    """Remove work directories left by installs that were killed."""
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    for e in entries:
        if e.name.startswith(WORK_PREFIX):
            try:
                pid = int(e.name[len(WORK_PREFIX):].split("-", 1)[0])
            except ValueError:
                continue
            if pid != os.getpid() and not _pid_alive(pid):
                shutil.rmtree(e.path, ignore_errors=True)


@dataclass
class Result:
    name: str
    action: str                 # install | update | remove | check
    outcome: str                # installed | updated | unchanged | removed | up-to-date | update-available
    path: str = ""
    scope: str = ""
    namespace: str = ""
    version: str = ""
    digest: str = ""
    latest: str = ""
    modified: bool = False      # check: the installed files differ from what was installed
    source: str = ""
    url: str = ""
    verified: bool = False
    scripts: list[str] = field(default_factory=list)
    allow_scripts: bool = False

    def to_json(self) -> dict:
        return dict(self.__dict__)


Confirm = Callable[[Fetched, list[str]], bool]


class Packages:
    """The package operations for one command invocation."""

    def __init__(self, ctx: Context, state_dir: Path, *, yes: bool = False, confirm: Confirm | None = None):
        self.ctx, self.state_dir, self.yes, self.confirm = ctx, Path(state_dir), yes, confirm

    # --- helpers -------------------------------------------------------------------

    @contextmanager
    def _workdir(self, root: Path, confine: Path | None):
        created = []
        d = root
        while not d.exists():
            created.append(d)
            d = d.parent
        root.mkdir(parents=True, exist_ok=True)
        try:
            if confine is not None and not is_within(os.path.realpath(root), os.path.realpath(confine)):
                raise PackageError(f"{root} is a symlink that leaves the project; refusing to install there")
            clean_stale_work(root)
            work = Path(tempfile.mkdtemp(prefix=f"{WORK_PREFIX}{os.getpid()}-", dir=root))
            try:
                yield work
            finally:
                shutil.rmtree(work, ignore_errors=True)
        finally:
            for c in created:              # nothing left behind by a failed first install
                try:
                    os.rmdir(c)
                except OSError:
                    break

    def _validate(self, f: Fetched) -> None:
        errors = validate_strict(f.dir)
        if errors:
            raise VerificationFailed(f"{f.url}: skill {f.name!r} fails strict validation: {errors[0]}"
                                     + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else "")
                                     + " - nothing was installed")

    def _approve(self, f: Fetched, scripts: list[str]) -> None:
        if not f.remote or not scripts or self.yes:
            return
        if self.confirm is None:
            raise ConfirmationRequired(
                f"{f.url}: skill {f.name!r} ships {len(scripts)} script(s) ({', '.join(scripts[:5])}); "
                "review them, then re-run with --yes to install")
        if not self.confirm(f, scripts):
            raise ConfirmationRequired(f"{f.name}: installation declined")

    def _commit(self, f: Fetched, root: Path, scope: ScopePath, *, force: bool, allow_scripts: bool,
                prev: dict | None = None, action: str = "install") -> Result:
        target = root / f.name
        with root_lock(root):
            exists = os.path.lexists(target)
            if exists and not force:
                raise AlreadyInstalled(f"skill {f.name!r} is already installed at {target}; "
                                       f"pass --force to overwrite, or run: rnixfs skill update {f.name}")
            if prev is None and exists:
                prev = read_record(target)
            now = now_iso()
            rec = {"name": f.name, "source": "community", "trust": "community" if f.remote else "local",
                   "origin": f.origin, "url": f.url, "ref": f.ref, "version": f.version,
                   "digest": f.digest, "package_digest": f.package_digest, "verified": f.verified,
                   "allow_scripts": bool(allow_scripts), "scope": scope.scope, "namespace": scope.namespace,
                   "installed_at": (prev or {}).get("installed_at") or now, "updated_at": now,
                   "files": dict(sorted(f.files.items()))}
            write_record(f.dir, rec)
            swap_into_place(f.dir, target)
        return Result(f.name, action, "updated" if action == "update" else "installed", str(target),
                      scope.scope, scope.namespace, f.version, f.digest, source=f.kind, url=f.url,
                      verified=f.verified, scripts=list_scripts(target), allow_scripts=bool(allow_scripts))

    def _audit(self, action: str, name: str, scope: ScopePath | None, outcome: str, *, f: Fetched | None = None,
               source: str = "", url: str = "", digest: str = "", scripts_allowed=None, error: str = "") -> None:
        audit(self.state_dir, action, name, outcome=outcome, scope=scope.scope if scope else "",
              namespace=scope.namespace if scope else "", source=f.kind if f else source,
              url=f.url if f else url, digest=f.digest if f else digest,
              scripts_allowed=scripts_allowed, error=error)

    # --- operations ------------------------------------------------------------------

    def install(self, ref: str, scope: ScopePath, *, force: bool = False, all_: bool = False,
                allow_scripts: bool = False, confine: Path | None = None) -> list[Result]:
        results: list[Result] = []
        src = None
        try:
            src = parse_ref(ref, self.ctx)
            with self._workdir(scope.path, confine) as work:
                fetched = src.fetch(self.ctx, work, all_)
                for f in fetched:
                    self._validate(f)
                    if os.path.lexists(scope.path / f.name) and not force:
                        raise AlreadyInstalled(f"skill {f.name!r} is already installed at {scope.path / f.name}; "
                                               f"pass --force to overwrite, or run: rnixfs skill update {f.name}")
                for f in fetched:
                    self._approve(f, list_scripts(f.dir))
                for f in fetched:
                    r = self._commit(f, scope.path, scope, force=force, allow_scripts=allow_scripts)
                    self._audit("install", f.name, scope, "ok", f=f, scripts_allowed=bool(allow_scripts))
                    results.append(r)
        except PackageError as exc:
            self._audit("install", ref, scope, "error", source=src.kind if src is not None else "",
                        url=ref, scripts_allowed=bool(allow_scripts), error=str(exc))
            raise
        except OSError as exc:
            msg = f"{ref}: cannot install into {scope.path}: {exc.strerror or exc}"
            self._audit("install", ref, scope, "error", url=ref, error=msg)
            raise PackageError(msg) from None
        return results

    def installed(self, resolution, names: list[str] | None) -> list[tuple]:
        """(skill, record) for the named skills (each must be installed) or all installed ones."""
        out = []
        if names:
            for n in names:
                s = resolution.winners.get(n)
                if s is None:
                    raise NotFound(f'skill "{n}" is not installed; try: rnixfs skill install {n}')
                rec = read_record(s.path)
                if rec is None or not isinstance(rec.get("origin"), dict):
                    raise UsageError(f'skill "{n}" ({s.path}) was not installed from a package; nothing to update it from')
                out.append((s, rec))
            return out
        for n, s in resolution.winners.items():
            if s.source == "builtin":
                continue                    # built-ins are skipped in bulk
            rec = read_record(s.path)
            if rec is not None and isinstance(rec.get("origin"), dict):
                out.append((s, rec))
        return out

    def _scope_of(self, s) -> ScopePath:
        return ScopePath(Path(s.root), s.scope, s.namespace, "existed-non-empty")

    def update_one(self, s, rec: dict, *, allow_scripts: bool | None = None) -> Result:
        scope = self._scope_of(s)
        f = None
        try:
            src, want = source_from_origin(rec["origin"], self.ctx)
            confine = Path(s.confine) if s.confine else None
            with self._workdir(scope.path, confine) as work:
                fetched = src.fetch(self.ctx, work, False, want=want or s.name)
                f = next((x for x in fetched if x.name == s.name), None)
                if f is None:
                    raise NotFound(f"{src.describe()}: no longer provides skill {s.name!r}")
                allowed = rec.get("allow_scripts") is True if allow_scripts is None else allow_scripts
                if f.digest == rec.get("digest"):
                    self._audit("update", s.name, scope, "unchanged", f=f, scripts_allowed=allowed)
                    return Result(s.name, "update", "unchanged", str(s.path), scope.scope, scope.namespace,
                                  str(rec.get("version") or ""), f.digest, source=f.kind, url=f.url,
                                  verified=f.verified, allow_scripts=allowed)
                self._validate(f)
                self._approve(f, list_scripts(f.dir))
                r = self._commit(f, scope.path, scope, force=True, allow_scripts=allowed, prev=rec, action="update")
                self._audit("update", s.name, scope, "ok", f=f, scripts_allowed=allowed)
                return r
        except PackageError as exc:
            self._audit("update", s.name, scope, "error", f=f, source=str(rec.get("origin", {}).get("type", "")),
                        url=str(rec.get("url", "")), error=str(exc))
            raise
        except OSError as exc:
            msg = f"{s.name}: cannot update {s.path}: {exc.strerror or exc}"
            self._audit("update", s.name, scope, "error", error=msg)
            raise PackageError(msg) from None

    def check_one(self, s, rec: dict) -> Result:
        """Compare the installed digest with the origin's, writing nothing."""
        src, want = source_from_origin(rec["origin"], self.ctx)
        base = Result(s.name, "check", "", str(s.path), s.scope, s.namespace, str(rec.get("version") or ""),
                      str(rec.get("digest") or ""), source=str(rec["origin"].get("type", "")),
                      url=str(rec.get("url") or ""))
        if isinstance(src, RegistrySource):
            idx = src.index(self.ctx)
            entry = idx.entries.get(want or s.name)
            if entry is None:
                raise NotFound(f"skill {s.name!r} is no longer in registry {src.label}")
            latest, base.version = entry.digest or "", base.version
            if not latest:
                with tempfile.TemporaryDirectory() as tmp:
                    latest = src.fetch(self.ctx, Path(tmp), want=s.name)[0].digest
        else:
            with tempfile.TemporaryDirectory() as tmp:
                fetched = src.fetch(self.ctx, Path(tmp), False, want=want or s.name)
                latest = next((x.digest for x in fetched if x.name == s.name), "")
        base.latest = latest
        base.outcome = "up-to-date" if latest == base.digest else "update-available"
        base.modified = skill_digest(tree_digests(Path(s.path))) != base.digest
        return base

    def remove(self, resolution, name: str, scope: ScopePath | None = None) -> Result:
        s = resolution.winners.get(name)
        if scope is not None:
            s = next((c for c in [resolution.winners.get(name), *resolution.shadowed.get(name, [])]
                      if c is not None and Path(c.root) == scope.path), None)
        if s is None:
            where = f" in {scope.path}" if scope is not None else ""
            self._audit("remove", name, scope, "error", error="not installed")
            raise NotFound(f'skill "{name}" is not installed{where}; see: rnixfs skill list')
        if s.source == "builtin":
            raise UsageError(f'skill "{name}" is built in; it cannot be removed (shadow it or use skill delete)')
        rec = read_record(s.path) or {}
        sp = self._scope_of(s)
        remove_dir(Path(s.path), Path(s.root))
        self._audit("remove", name, sp, "ok", source=str((rec.get("origin") or {}).get("type", "")),
                    url=str(rec.get("url") or ""), digest=str(rec.get("digest") or ""),
                    scripts_allowed=rec.get("allow_scripts") if rec else None)
        return Result(name, "remove", "removed", str(s.path), s.scope, s.namespace,
                      s.version, str(rec.get("digest") or ""), source=str((rec.get("origin") or {}).get("type", "")))

    def search(self, keyword: str | None) -> tuple[str, list[dict]]:
        label, url = self.ctx.default_registry()
        headers = self.ctx.registries.named[label].headers if label in self.ctx.registries.named else {}
        src = RegistrySource(label, url, None, dict(headers))
        idx = src.index(self.ctx)
        kw = (keyword or "").lower()
        out = []
        for e in idx.entries.values():
            if e.error:
                continue
            if kw and kw not in e.name.lower() and kw not in e.description.lower():
                continue
            out.append({"name": e.name, "version": e.version, "description": e.description,
                        "digest": e.digest, "verifiable": e.verifiable,
                        "package": e.package_url is not None})
        return idx.url, sorted(out, key=lambda d: d["name"])
