"""Real files in the mount: skills/, agents/ and dev/fs, by one adapter.

``RealFiles`` maps inode numbers to paths below one top directory of the
mount and forwards every file operation to the confined fd-relative walker
of ``rnixfs.devices.fs`` (docs/architecture.md, "Confinement"), so nothing
read, written or removed can be outside its root, whatever symlinks the
tree holds or swaps in. What differs between the trees is a policy:

- ``PlainDir`` (dev/fs, docs/devices.md "dev/fs in the mount: POSIX"): the
  workspace as it is — symlinks shown with their text, new entries owned by
  their creator, hard links, FIFOs, exchange renames;
- ``CatalogTree`` (skills/, agents/, docs/skills.md "Symlinks"): the
  winning copy of each entry, found by a ``Tree``; symlinks shown as what
  they reach inside the entry's scope root or sealed, nothing removed
  through a symlinked directory, extended attributes from the tree.

Walker errors (``FsError``) and ``OSError`` propagate: fuse/errnos.py
maps them.
"""
from __future__ import annotations

import errno
import logging
import os
import posixpath
import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Protocol

import pyfuse3

from ..devices.fs import FsError, Workspace
from ..fileio import ScopeEscape, scope_rel
from ..kernel.errors import Code
from .inodemap import InodeMap

log = logging.getLogger(__name__)

TIMEOUT = 1.0  # seconds: changes made on disk show within a second
NAME_MAX = 255
MAX_ROOT_DEPTH = 2  # a skill root is at most this deep in its scope root (.rnix/skills)
RAW_LINK = "\0link"  # inode key suffix: see RealFiles.symlink
# Only a root daemon can give files away; otherwise every file is the
# daemon's user's (a single-owner filesystem) and chown is not applied.
CAN_CHOWN = os.geteuid() == 0


class Tree(Protocol):
    """What the adapter needs from the skills or agents view."""

    def names(self) -> list[str]: ...

    def locate(self, name: str) -> tuple[Path, str] | None:
        """(scope root, path of the entry relative to it)."""

    def create(self, name: str) -> tuple[Path, str]: ...

    def xattrs(self, name: str) -> dict[str, bytes]: ...

    def changed(self, name: str | None = None, rest: str = "") -> None:
        """Something at ``<name>/<rest>`` changed through the mount."""


def split(rel: str) -> tuple[str, str]:
    """("entry", "path/inside") of a catalog path."""
    name, _, rest = rel.partition("/")
    return name, rest


# -- policies ---------------------------------------------------------------------------


class PlainDir:
    """dev/fs: one confined directory shown as it is."""

    catalog = False  # the top level is the directory's own listing
    links_as_targets = False
    hard_links = True

    def __init__(self, ws: Workspace, label: str = "dev/fs"):
        self.ws, self.label = ws, label

    def walker(self, rel: str) -> tuple[Workspace, str]:
        return self.ws, rel

    def listing(self, rel: str) -> list[tuple[str, os.stat_result | None]]:
        return sorted(self.ws.entries(rel))

    @staticmethod
    def timeout(st) -> float:
        # A hard-linked file has one number per name here: never cache its
        # attributes, or a write through one name leaves the other's size stale.
        return 0.0 if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode) else TIMEOUT

    def check_name(self, name: bytes) -> None:
        pass  # the host says ENAMETOOLONG

    def adopt(self, ws: Workspace, rel: str, ctx, mode: int | None) -> None:
        """A new entry gets the caller's uid and gid (the parent's gid in a
        setgid directory) when the daemon can give it away, and exactly the
        permission bits asked (the client's umask is already applied; the
        daemon's own must not be applied twice)."""
        st = ws.lstat(rel)
        if mode is not None and not stat.S_ISLNK(st.st_mode) and (st.st_mode & 0o777) != (mode & 0o777):
            ws.chmod(rel, (stat.S_IMODE(st.st_mode) & ~0o777) | (mode & 0o777))
        if ctx is not None and CAN_CHOWN and (ctx.uid, ctx.gid) != (st.st_uid, st.st_gid):
            setgid = ws.stat(posixpath.dirname(rel)).st_mode & stat.S_ISGID
            ws.chown(rel, ctx.uid, -1 if setgid else ctx.gid)

    def link_text(self, ws: Workspace, wrel: str, rel: str) -> str | None:
        return ws.readlink(wrel)

    def check_symlink(self, ws: Workspace, wrel: str, rel: str, text: str) -> None:
        pass  # any text: the walker refuses to follow one that leads out

    def check_remove(self, ws: Workspace, rel: str) -> None:
        pass

    def rename(self, files: "RealFiles", src: str, dst: str, flags: int) -> None:
        self.ws.rename(src, dst, noreplace=bool(flags & pyfuse3.RENAME_NOREPLACE),
                       exchange=bool(flags & pyfuse3.RENAME_EXCHANGE))

    def changed(self, rel: str) -> None:
        pass

    def xattrs(self, rel: str) -> dict[str, bytes]:
        return {}


class CatalogTree:
    """skills/ or agents/: entries are the winning copies a ``Tree`` locates,
    each walked from a directory fd of its *scope root* (the project, the
    config directory, ``~/.agents``).

    * a symlink whose text stays inside its own skill (``latest -> v2``) is
      shown as a symlink with that text; one that resolves into another
      entry the tree shows (``alias -> real``) is shown as a symlink whose
      text reaches it through the mount (``link_text``);
    * any other symlink that resolves inside the scope root is shown as what
      it points to (a SKILL.md linked to a shared file reads as that file);
    * a symlink that leads out (or dangles, or loops) is shown as a symlink
      whose text cannot be read (EACCES): nothing can be reached through it,
      and ``rm`` removes the link; a skill or agent directory that leads out
      is shown as a sealed directory (mode 000, listing it is EACCES, its
      extended attributes say why), and ``rm -r`` removes the link;
    * removing or renaming *through* a symlinked directory is refused
      (EACCES): ``rm -r`` of a linked skill never deletes what it points to.
    """

    catalog = True
    links_as_targets = True
    hard_links = False

    def __init__(self, label: str, tree: Tree):
        self.label, self.tree = label, tree
        self._ws: dict[Path, tuple[Workspace, tuple[int, int]]] = {}

    def _workspace(self, scope_root: Path) -> Workspace:
        """One open walker per scope root; opened anew if the root was replaced."""
        st = os.stat(scope_root)
        key = (st.st_dev, st.st_ino)
        cached = self._ws.get(scope_root)
        if cached is not None and cached[1] == key:
            return cached[0]
        ws = Workspace(scope_root)
        if cached is not None:
            cached[0].close()
        self._ws[scope_root] = (ws, key)
        return ws

    def walker(self, rel: str) -> tuple[Workspace, str]:
        """The walker and its path for ``rel``; ENOENT when the entry is gone."""
        name, rest = split(rel)
        found = self.tree.locate(name)
        if found is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        scope_root, base = found
        return self._workspace(scope_root), (f"{base}/{rest}" if rest else base)

    def listing(self, rel: str) -> list[tuple[str, os.stat_result | None]]:
        if not rel:
            return [(n, None) for n in sorted(self.tree.names())]
        ws, wrel = self.walker(rel)
        try:
            return [(n, None) for n in sorted(ws.listdir(wrel))]
        except FsError as exc:
            raise self.fail(rel, exc) from None

    @staticmethod
    def timeout(st) -> float:
        return TIMEOUT

    def check_name(self, name: bytes) -> None:
        if len(name) > NAME_MAX:
            raise pyfuse3.FUSEError(errno.EINVAL)

    def adopt(self, ws: Workspace, rel: str, ctx, mode: int | None) -> None:
        pass  # the scope root's owner keeps what is made in it

    def fail(self, rel: str, exc: FsError) -> FsError:
        """A walker error to raise; a refusal is logged with its reason."""
        if exc.code is Code.PERMISSION:
            log.warning("%s/%s: refused: %s", self.label, rel, exc.cause)
        return exc

    def refuse(self, rel: str, why: str) -> pyfuse3.FUSEError:
        log.warning("%s/%s: refused: %s", self.label, rel, why)
        return pyfuse3.FUSEError(errno.EACCES)

    def link_text(self, ws: Workspace, wrel: str, rel: str) -> str | None:
        """The text the mount shows for symlink ``wrel`` (``rel`` in the
        tree), or None when it is shown as its target or refused.

        A text that stays lexically inside its own entry is shown as it is.
        Otherwise, if the link resolves (confined) into an entry the tree
        shows (``alias -> real``, ``SKILL.md -> ../shared/SKILL.md``), the
        text is rewritten to reach the same file through the mount, so the
        kernel follows it there and ``rm`` treats it as the link it is.
        """
        name, rest = split(rel)
        try:
            text = ws.readlink(wrel)
        except FsError:
            return None
        if rest and text and not text.startswith("/"):
            norm = posixpath.normpath(posixpath.join(posixpath.dirname(rest), text))
            if norm != ".." and not norm.startswith("../"):
                return text
        try:
            target = ws.resolve(wrel)
        except FsError:
            return None
        scope_root = self.tree.locate(name)
        parts = target.split("/") if target != "." else []
        for i, w in enumerate(parts[:MAX_ROOT_DEPTH + 1]):
            found = self.tree.locate(w) if not w.startswith(".") else None
            if found is not None and found[0] == scope_root[0] and found[1] == "/".join(parts[:i + 1]):
                shown = "/".join([w] + parts[i + 1:])
                return posixpath.relpath(shown, posixpath.dirname(rel) or ".")
        return None

    def shown(self, ws: Workspace, wrel: str, rel: str):
        """The stat the mount shows for ``wrel`` (see the class docstring)."""
        st = ws.lstat(wrel)
        if not stat.S_ISLNK(st.st_mode) or self.link_text(ws, wrel, rel) is not None:
            return st
        try:
            return ws.stat(wrel)
        except FsError:
            if "/" in rel:
                return st  # leads out, dangles or loops: a link nobody can follow
            # a skill or agent leading out: a sealed directory, so that its
            # extended attributes still say why and `rm -r` removes the link
            return SimpleNamespace(st_mode=stat.S_IFDIR, st_size=0, st_nlink=1, st_uid=st.st_uid,
                                   st_gid=st.st_gid, st_atime_ns=st.st_atime_ns,
                                   st_mtime_ns=st.st_mtime_ns, st_ctime_ns=st.st_ctime_ns)

    def check_symlink(self, ws: Workspace, wrel: str, rel: str, text: str) -> None:
        """A symlink inside a skill or agent, if its target stays in the scope root."""
        if "/" not in rel:
            raise pyfuse3.FUSEError(errno.EACCES)  # the top level holds directories only
        scope_root = self.tree.locate(split(rel)[0])[0]
        if text.startswith("/"):
            try:
                scope_rel(scope_root, text)
                inside = True
            except ScopeEscape:
                inside = False
        else:
            norm = posixpath.normpath(posixpath.join(posixpath.dirname(wrel), text))
            inside = not (norm == ".." or norm.startswith("../"))
        if not inside:
            raise self.refuse(rel, f"symlink to {text!r} would lead outside {scope_root}")

    def check_remove(self, ws: Workspace, rel: str) -> None:
        """Refuse to remove or rename below a symlinked directory: that would
        change what the link points to, not the link."""
        name, rest = split(rel)
        found = self.tree.locate(name)
        if found is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if not rest:
            return  # the entry itself: a link is removed as a link
        path = found[1]
        for part in [None] + rest.split("/")[:-1]:
            if part is not None:
                path = f"{path}/{part}"
            try:
                st = ws.lstat(path)
            except FsError as exc:
                raise self.fail(rel, exc) from None
            if stat.S_ISLNK(st.st_mode):
                raise self.refuse(rel, f"{path} is a symlink; remove the link itself, "
                                  "not what it points to")

    def rename(self, files: "RealFiles", src: str, dst: str, flags: int) -> None:
        if flags & ~pyfuse3.RENAME_NOREPLACE:  # EXCHANGE/WHITEOUT are not done here
            raise pyfuse3.FUSEError(errno.EINVAL)
        if ("/" in src) != ("/" in dst):
            raise pyfuse3.FUSEError(errno.EXDEV)  # a file becoming a skill, or back
        if "/" in dst:  # inside one skill: the confined walker renames
            if split(src)[0] != split(dst)[0]:
                raise pyfuse3.FUSEError(errno.EXDEV)  # another skill: mv copies
            ws, wsrc = self.walker(src)
            _, wdst = self.walker(dst)
            self.check_remove(ws, src)
            self.check_remove(ws, dst)
            ws.rename(wsrc, wdst, noreplace=bool(flags & pyfuse3.RENAME_NOREPLACE))
        else:  # renaming a skill: the new name lives beside the old copy
            if dst in self.tree.names():
                raise pyfuse3.FUSEError(errno.EEXIST)
            ws, wsrc = self.walker(src)
            ws.rename(wsrc, posixpath.join(posixpath.dirname(wsrc), dst), noreplace=True)

    def changed(self, rel: str) -> None:
        """Tell the tree what changed, so it re-resolves only that (if anything)."""
        name, rest = split(rel)
        self.tree.changed(name, rest)

    def xattrs(self, rel: str) -> dict[str, bytes]:
        if not rel:
            top = getattr(self.tree, "root_xattrs", None)
            return top() if top is not None else {}
        if "/" in rel:
            return {}
        return self.tree.xattrs(rel)


# -- the adapter --------------------------------------------------------------------------


class RealFiles:
    """Inode table and file operations for one tree of real files."""

    def __init__(self, root_ino: int, base: int, policy: PlainDir | CatalogTree, attr):
        self.root_ino = root_ino
        self.policy = policy
        self._attr = attr  # Operations._attr, to share uid/gid and layout
        self.inodes = InodeMap(base, {"": root_ino})

    # -- inodes ------------------------------------------------------------------
    def owns(self, inode: int) -> bool:
        return inode in self.inodes

    def rel(self, inode: int) -> str:
        return self.inodes.path(inode).removesuffix(RAW_LINK)

    def _raw_link(self, inode: int) -> bool:
        """A just-created symlink the mount shows as its target: the kernel
        was told "symlink" for this number, so it stays one (see symlink)."""
        return self.inodes.path(inode).endswith(RAW_LINK)

    def _child(self, rel: str, name: bytes) -> str:
        text = os.fsdecode(name)
        if not text or "/" in text or text in (".", ".."):
            raise pyfuse3.FUSEError(errno.EINVAL)
        self.policy.check_name(name)
        return f"{rel}/{text}" if rel else text

    def forget(self, inode: int, count: int) -> None:
        self.inodes.forget(inode, count)

    def _move(self, src: str, dst: str | None) -> None:
        """Rename (None: forget) the numbers of ``src`` and below."""
        self.inodes.move(src, dst)
        self.inodes.move(src + RAW_LINK, None if dst is None else dst + RAW_LINK)

    # -- attributes ----------------------------------------------------------------
    def _from_stat(self, inode: int, st) -> pyfuse3.EntryAttributes:
        a = self._attr(inode, st.st_mode, size=st.st_size, timeout=self.policy.timeout(st),
                       ns=st.st_mtime_ns)
        a.st_nlink, a.st_uid, a.st_gid = st.st_nlink, st.st_uid, st.st_gid
        a.st_atime_ns, a.st_ctime_ns = st.st_atime_ns, st.st_ctime_ns
        return a

    def from_fd(self, inode: int, fd: int) -> pyfuse3.EntryAttributes:
        """fstat of a file removed while still open."""
        return self._from_stat(inode, os.fstat(fd))

    def _stat(self, inode: int, rel: str):
        if not rel and self.policy.catalog:
            return None
        ws, wrel = self.policy.walker(rel)
        policy = self.policy
        try:
            if policy.links_as_targets and not self._raw_link(inode):
                return policy.shown(ws, wrel, rel)
            return ws.lstat(wrel)
        except FsError as exc:
            raise self._fail(rel, exc) from None

    def _fail(self, rel: str, exc: FsError) -> FsError:
        fail = getattr(self.policy, "fail", None)
        return fail(rel, exc) if fail is not None else exc

    def getattr(self, inode: int) -> pyfuse3.EntryAttributes:
        rel = self.rel(inode)
        st = self._stat(inode, rel)
        if st is None:  # a catalog's top: the names the tree resolves
            return self._attr(inode, stat.S_IFDIR | 0o755, timeout=TIMEOUT)
        return self._from_stat(inode, st)

    def entry(self, rel: str) -> pyfuse3.EntryAttributes:
        """Attributes of a name the kernel will hold: numbered only if it exists."""
        fresh = self.inodes.ino(rel)
        try:
            attr = self.getattr(fresh)
        except (pyfuse3.FUSEError, FsError):
            self.inodes.forget(fresh, 0)  # drop the number if nobody holds it
            raise
        self.inodes.ref(fresh)
        return attr

    def lookup(self, parent: int, name: bytes) -> pyfuse3.EntryAttributes:
        rel = self.rel(parent)
        child = self._child(rel, name)
        if not rel and self.policy.catalog and child not in self.policy.tree.names():
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self.entry(child)

    def readdir(self, inode: int, start_id: int, token) -> None:
        rel = self.rel(inode)
        entries = self.policy.listing(rel)
        for i in range(start_id, len(entries)):
            name, st = entries[i]
            child = f"{rel}/{name}" if rel else name
            ino = self.inodes.ino(child)
            try:
                attr = self.getattr(ino) if st is None else self._from_stat(ino, st)
            except (pyfuse3.FUSEError, FsError):
                self.inodes.forget(ino, 0)
                continue  # vanished meanwhile
            if not pyfuse3.readdir_reply(token, os.fsencode(name), attr, i + 1):
                return
            self.inodes.ref(ino)  # readdirplus: the kernel now holds the entry

    def readlink(self, inode: int) -> bytes:
        rel = self.rel(inode)
        ws, wrel = self.policy.walker(rel)
        try:
            if self.policy.links_as_targets and not stat.S_ISLNK(ws.lstat(wrel).st_mode):
                raise pyfuse3.FUSEError(errno.EINVAL)
            text = self.policy.link_text(ws, wrel, rel)
        except FsError as exc:
            raise self._fail(rel, exc) from None
        if text is None:
            raise self.policy.refuse(rel, "symlink leads outside its skill or scope, dangles or loops")
        return os.fsencode(text)

    # -- making and removing -------------------------------------------------------
    def _made(self, ws: Workspace, wrel: str, rel: str, ctx, mode: int | None) -> pyfuse3.EntryAttributes:
        self.policy.adopt(ws, wrel, ctx, mode)
        self.policy.changed(rel)
        return self.entry(rel)

    def _top_level_is_entries(self, rel: str) -> None:
        if not rel and self.policy.catalog:
            raise pyfuse3.FUSEError(errno.EACCES)  # the top level holds directories only

    def create(self, parent: int, name: bytes, mode: int, flags: int, ctx=None):
        rel = self.rel(parent)
        self._top_level_is_entries(rel)
        child = self._child(rel, name)
        ws, wrel = self.policy.walker(child)
        try:
            fd = ws.open(wrel, flags | os.O_CREAT, stat.S_IMODE(mode))
        except FsError as exc:
            raise self._fail(child, exc) from None
        try:
            return fd, self._made(ws, wrel, child, ctx, stat.S_IMODE(mode))
        except BaseException:
            os.close(fd)
            raise

    def mkdir(self, parent: int, name: bytes, mode: int, ctx=None) -> pyfuse3.EntryAttributes:
        rel = self.rel(parent)
        child = self._child(rel, name)
        if not rel and self.policy.catalog:  # a new skill or agent, in the write scope
            if child in self.policy.tree.names():
                raise pyfuse3.FUSEError(errno.EEXIST)
            self.policy.tree.create(child)
            self.policy.changed(child)
            return self.entry(child)
        ws, wrel = self.policy.walker(child)
        try:
            ws.mkdir(wrel, stat.S_IMODE(mode))
        except FsError as exc:
            raise self._fail(child, exc) from None
        return self._made(ws, wrel, child, ctx, stat.S_IMODE(mode))

    def mknod(self, parent: int, name: bytes, mode: int, ctx=None) -> pyfuse3.EntryAttributes:
        if not self.policy.hard_links:
            raise pyfuse3.FUSEError(errno.EACCES)
        child = self._child(self.rel(parent), name)
        ws, wrel = self.policy.walker(child)
        ws.mknod(wrel, mode)
        return self._made(ws, wrel, child, ctx, stat.S_IMODE(mode))

    def symlink(self, parent: int, name: bytes, target: bytes, ctx=None) -> pyfuse3.EntryAttributes:
        child = self._child(self.rel(parent), name)
        text = os.fsdecode(target)
        ws, wrel = self.policy.walker(child) if "/" in child or not self.policy.catalog else (None, "")
        self.policy.check_symlink(ws, wrel, child, text)
        if not text or "\0" in text:
            raise pyfuse3.FUSEError(errno.EINVAL)
        try:
            ws.symlink(text, wrel)
        except FsError as exc:
            raise self._fail(child, exc) from None
        self.policy.adopt(ws, wrel, ctx, None)
        self.policy.changed(child)
        if not self.policy.links_as_targets or self.policy.link_text(ws, wrel, child) is not None:
            return self.entry(child)
        # shown as its target from the next lookup on; the reply to symlink(2)
        # must be a symlink, under a number of its own so no inode changes type
        ino = self.inodes.ino(child + RAW_LINK)
        try:
            attr = self.getattr(ino)
        except (pyfuse3.FUSEError, FsError):
            self.inodes.forget(ino, 0)
            raise
        attr.entry_timeout = 0
        self.inodes.ref(ino)
        return attr

    def link(self, inode: int, new_parent: int, new_name: bytes) -> pyfuse3.EntryAttributes:
        if not self.policy.hard_links:
            raise pyfuse3.FUSEError(errno.EACCES)
        child = self._child(self.rel(new_parent), new_name)
        ws, wrel = self.policy.walker(child)
        ws.link(self.policy.walker(self.rel(inode))[1], wrel)
        return self.entry(child)

    def unlink(self, parent: int, name: bytes, *, directory: bool) -> None:
        """rm/rmdir. In a catalog, a symlink loses the link only, never what
        it points to."""
        rel = self.rel(parent)
        child = self._child(rel, name)
        ws, wrel = self.policy.walker(child)
        self.policy.check_remove(ws, child)
        try:
            if self.policy.links_as_targets and stat.S_ISLNK(ws.lstat(wrel).st_mode):
                ws.unlink(wrel)  # even for rmdir: the mount may show it as a directory
            elif directory:
                ws.rmdir(wrel)
            elif not rel and self.policy.catalog:
                raise pyfuse3.FUSEError(errno.EISDIR)
            else:
                ws.unlink(wrel)
        except FsError as exc:
            raise self._fail(child, exc) from None
        self._move(child, None)
        self.policy.changed(child)

    def rename(self, old_parent: int, old: bytes, new_parent: int, new: bytes, flags: int) -> None:
        src = self._child(self.rel(old_parent), old)
        dst = self._child(self.rel(new_parent), new)
        try:
            self.policy.rename(self, src, dst, flags)
        except FsError as exc:
            raise self._fail(src, exc) from None
        if flags & pyfuse3.RENAME_EXCHANGE:
            tmp = "\0swap"
            self._move(src, tmp)
            self._move(dst, src)
            self._move(tmp, dst)
        else:
            self._move(dst, None)
            self._move(src, dst)
        self.policy.changed(src)
        self.policy.changed(dst)

    def setattr(self, inode: int, attr, fields) -> pyfuse3.EntryAttributes:
        rel = self.rel(inode)
        if not rel and self.policy.catalog:
            raise pyfuse3.FUSEError(errno.EACCES)
        ws, wrel = self.policy.walker(rel)
        try:
            if (fields.update_uid or fields.update_gid) and CAN_CHOWN and not self.policy.catalog:
                # the kernel has checked the caller may (default_permissions)
                ws.chown(wrel, attr.st_uid if fields.update_uid else -1,
                         attr.st_gid if fields.update_gid else -1)
            if fields.update_size:
                ws.truncate(wrel, attr.st_size)
            if fields.update_mode:
                ws.chmod(wrel, stat.S_IMODE(attr.st_mode))
            if fields.update_mtime or fields.update_atime:
                # the kernel resolved any link it meant to follow: this inode is
                # the one (a catalog shows a link to a file as that file)
                st = ws.stat(wrel) if self.policy.links_as_targets else ws.lstat(wrel)
                ws.utime(wrel, ns=(attr.st_atime_ns if fields.update_atime else st.st_atime_ns,
                                   attr.st_mtime_ns if fields.update_mtime else st.st_mtime_ns),
                         follow=not stat.S_ISLNK(st.st_mode))
        except FsError as exc:
            raise self._fail(rel, exc) from None
        self.policy.changed(rel)
        return self.getattr(inode)

    # -- files ---------------------------------------------------------------------
    def open(self, inode: int, flags: int) -> int:
        rel = self.rel(inode)
        if not rel and self.policy.catalog:
            raise pyfuse3.FUSEError(errno.EISDIR)
        ws, wrel = self.policy.walker(rel)
        try:
            return ws.open(wrel, flags & ~(os.O_CREAT | os.O_EXCL))
        except FsError as exc:
            raise self._fail(rel, exc) from None

    def changed_after_write(self, inode: int) -> None:
        if self.policy.catalog and inode in self.inodes:  # (not if removed while open)
            rel = self.rel(inode)
            if rel:
                self.policy.changed(rel)

    def xattrs(self, inode: int) -> dict[str, bytes]:
        return self.policy.xattrs(self.rel(inode))
