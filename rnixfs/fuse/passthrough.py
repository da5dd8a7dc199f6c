"""skills/ and agents/: real files, passed through to their winning copy.

The FUSE side only maps inodes to (tree, relative path) and forwards file
operations, walked fd-relative from the entry's scope root; which copy wins,
where a new one is created and what the extended attributes say come from a
``Tree`` (rnixfs.catalog).
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
import trio

from ..devices.fs import FsError, Workspace
from ..fileio import ScopeEscape, scope_rel
from ..kernel.errors import Code
from .inodemap import InodeMap

log = logging.getLogger(__name__)

PT_BASE = 1 << 44  # inode numbers of passed-through files start here
TIMEOUT = 1.0  # seconds: changes made on disk show within a second
NAME_MAX = 255
MAX_ROOT_DEPTH = 2  # a skill root is at most this deep in its scope root (.rnix/skills)
RAW_LINK = "\0link"  # inode key suffix: see Passthrough._raw_link


class Tree(Protocol):
    """What the adapter needs from the skills or agents view."""

    def names(self) -> list[str]: ...

    def locate(self, name: str) -> tuple[Path, str] | None:
        """(scope root, path of the entry relative to it)."""

    def create(self, name: str) -> tuple[Path, str]: ...

    def xattrs(self, name: str) -> dict[str, bytes]: ...

    def changed(self, name: str | None = None, rest: str = "") -> None:
        """Something at ``<name>/<rest>`` changed through the mount."""


def _errno(exc: OSError) -> pyfuse3.FUSEError:
    return pyfuse3.FUSEError(exc.errno or errno.EIO)


class Passthrough:
    """Inode table and file operations for the passed-through trees.

    Every path is walked from a directory fd of its *scope root* (the
    project, the config directory, ``~/.agents``) by the dev/fs walker, so
    nothing read, written or removed here can be outside that root, whatever
    symlinks the tree holds or swaps in (docs/skills.md, "Symlinks"):

    * a symlink whose text stays inside its own skill (``latest -> v2``) is
      shown as a symlink with that text; one that resolves into another
      entry the tree shows (``alias -> real``) is shown as a symlink whose
      text reaches it through the mount (``_link_text``);
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

    def __init__(self, trees: dict[int, tuple[str, Tree]], attr):
        self.trees = trees  # root inode -> (name, Tree)
        self._attr = attr  # Operations._attr, to share uid/gid and layout
        # keys are "<root inode>:<relative path>", so one map serves every tree
        self.inodes = InodeMap(PT_BASE)
        self._ws: dict[Path, tuple[Workspace, tuple[int, int]]] = {}

    # -- inodes ------------------------------------------------------------------
    def owns(self, inode: int) -> bool:
        return inode in self.trees or inode >= PT_BASE and inode in self.inodes

    def ino_for(self, root: int, rel: str) -> int:
        return self.inodes.ino(f"{root}:{rel}")

    def where(self, inode: int) -> tuple[int, str]:
        if inode in self.trees:
            return inode, ""
        root, _, rel = self.inodes.path(inode).partition(":")
        return int(root), rel.removesuffix(RAW_LINK)

    def _raw_link(self, inode: int) -> bool:
        """A just-created symlink the mount shows as its target: the kernel
        was told "symlink" for this number, so it stays one (see symlink)."""
        return inode not in self.trees and self.inodes.path(inode).endswith(RAW_LINK)

    def _workspace(self, scope_root: Path) -> Workspace:
        """One open walker per scope root; opened anew if the root was replaced."""
        try:
            st = os.stat(scope_root)
        except OSError as exc:
            raise _errno(exc) from None
        key = (st.st_dev, st.st_ino)
        cached = self._ws.get(scope_root)
        if cached is not None and cached[1] == key:
            return cached[0]
        try:
            ws = Workspace(scope_root)
        except FsError as exc:
            raise pyfuse3.FUSEError(exc.errno) from None
        if cached is not None:
            cached[0].close()
        self._ws[scope_root] = (ws, key)
        return ws

    def confined(self, root: int, rel: str) -> tuple[Workspace, str, str, str]:
        """(walker, path for it, entry name, path inside the entry) of ``rel``.

        ENOENT when the skill or agent is gone.
        """
        name, _, rest = rel.partition("/")
        found = self.trees[root][1].locate(name)
        if found is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        scope_root, base = found
        ws = self._workspace(scope_root)
        return ws, (f"{base}/{rest}" if rest else base), name, rest

    def _fail(self, root: int, rel: str, exc: FsError) -> pyfuse3.FUSEError:
        """The errno of a walker error; a refusal is logged with its reason."""
        if exc.code is Code.PERMISSION:
            log.warning("%s/%s: refused: %s", self.trees[root][0], rel, exc.cause)
        return pyfuse3.FUSEError(exc.errno)

    def _refuse(self, root: int, rel: str, why: str) -> pyfuse3.FUSEError:
        log.warning("%s/%s: refused: %s", self.trees[root][0], rel, why)
        return pyfuse3.FUSEError(errno.EACCES)

    # -- symlinks ------------------------------------------------------------------
    def _link_text(self, root: int, ws: Workspace, wrel: str, rel: str) -> str | None:
        """The text the mount shows for symlink ``wrel`` (``rel`` in the
        tree), or None when it is shown as its target or refused.

        A text that stays lexically inside its own entry is shown as it is.
        Otherwise, if the link resolves (confined) into an entry the tree
        shows (``alias -> real``, ``SKILL.md -> ../shared/SKILL.md``), the
        text is rewritten to reach the same file through the mount, so the
        kernel follows it there and ``rm`` treats it as the link it is.
        """
        name, _, rest = rel.partition("/")
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
        tree = self.trees[root][1]
        scope_root = tree.locate(name)
        parts = target.split("/") if target != "." else []
        for i, w in enumerate(parts[:MAX_ROOT_DEPTH + 1]):
            found = tree.locate(w) if not w.startswith(".") else None
            if found is not None and found[0] == scope_root[0] and found[1] == "/".join(parts[:i + 1]):
                shown = "/".join([w] + parts[i + 1:])
                return posixpath.relpath(shown, posixpath.dirname(rel) or ".")
        return None

    def _shown(self, root: int, ws: Workspace, wrel: str, rel: str) -> os.stat_result:
        """The stat the mount shows for ``wrel`` (see the class docstring)."""
        st = ws.lstat(wrel)
        if not stat.S_ISLNK(st.st_mode) or self._link_text(root, ws, wrel, rel) is not None:
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

    def _no_link_on_the_way(self, root: int, ws: Workspace, rel: str) -> None:
        """Refuse to remove or rename below a symlinked directory: that would
        change what the link points to, not the link."""
        name, _, rest = rel.partition("/")
        found = self.trees[root][1].locate(name)
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
                raise self._fail(root, rel, exc) from None
            if stat.S_ISLNK(st.st_mode):
                raise self._refuse(root, rel, f"{path} is a symlink; remove the link itself, "
                                   "not what it points to")

    # -- attributes ----------------------------------------------------------------
    def getattr(self, inode: int) -> pyfuse3.EntryAttributes:
        root, rel = self.where(inode)
        if not rel:
            return self._attr(inode, stat.S_IFDIR | 0o755, timeout=TIMEOUT)
        ws, wrel, _, rest = self.confined(root, rel)
        try:
            st = ws.lstat(wrel) if self._raw_link(inode) else self._shown(root, ws, wrel, rel)
        except FsError as exc:
            raise self._fail(root, rel, exc) from None
        a = self._attr(inode, st.st_mode, size=st.st_size, timeout=TIMEOUT, ns=st.st_mtime_ns)
        a.st_nlink = st.st_nlink
        a.st_uid, a.st_gid = st.st_uid, st.st_gid
        a.st_atime_ns, a.st_ctime_ns = st.st_atime_ns, st.st_ctime_ns
        return a

    def lookup(self, parent: int, name: bytes) -> pyfuse3.EntryAttributes:
        root, rel = self.where(parent)
        child = self._child(rel, name)
        if not rel and child not in self.trees[root][1].names():
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self.entry(root, child)

    def entry(self, root: int, rel: str) -> pyfuse3.EntryAttributes:
        """Attributes of a name the kernel will hold: numbered only if it exists."""
        key = f"{root}:{rel}"
        fresh = self.ino_for(root, rel)
        try:
            attr = self.getattr(fresh)
        except pyfuse3.FUSEError:
            self.inodes.forget(fresh, 0)  # drop the number if nobody holds it
            raise
        self.inodes.ref(self.inodes.ino(key))
        return attr

    def forget(self, inode: int, count: int) -> None:
        self.inodes.forget(inode, count)

    @staticmethod
    def _child(rel: str, name: bytes) -> str:
        text = os.fsdecode(name)
        if not text or "/" in text or text in (".", "..") or len(name) > NAME_MAX:
            raise pyfuse3.FUSEError(errno.EINVAL)
        return f"{rel}/{text}" if rel else text

    def readdir(self, inode: int, start_id: int, token) -> None:
        root, rel = self.where(inode)
        if rel:
            ws, wrel, _, _ = self.confined(root, rel)
            try:
                names = sorted(ws.listdir(wrel))
            except FsError as exc:
                raise self._fail(root, rel, exc) from None
        else:
            names = sorted(self.trees[root][1].names())
        for i in range(start_id, len(names)):
            child = f"{rel}/{names[i]}" if rel else names[i]
            ino = self.ino_for(root, child)
            try:
                attr = self.getattr(ino)
            except pyfuse3.FUSEError:
                continue  # vanished meanwhile
            if not pyfuse3.readdir_reply(token, os.fsencode(names[i]), attr, i + 1):
                return
            self.inodes.ref(ino)  # readdirplus: the kernel now holds the entry

    def readlink(self, inode: int) -> bytes:
        root, rel = self.where(inode)
        ws, wrel, _, rest = self.confined(root, rel)
        try:
            if not stat.S_ISLNK(ws.lstat(wrel).st_mode):
                raise pyfuse3.FUSEError(errno.EINVAL)
        except FsError as exc:
            raise self._fail(root, rel, exc) from None
        text = self._link_text(root, ws, wrel, rel)
        if text is None:
            raise self._refuse(root, rel, "symlink leads outside its skill or scope, dangles or loops")
        return os.fsencode(text)

    def symlink(self, parent: int, name: bytes, target: bytes) -> pyfuse3.EntryAttributes:
        """A symlink inside a skill or agent, if its target stays in the scope root."""
        root, rel = self.where(parent)
        if not rel:
            raise pyfuse3.FUSEError(errno.EACCES)  # the top level holds directories only
        child = self._child(rel, name)
        ws, wrel, entry, _ = self.confined(root, child)
        text = os.fsdecode(target)
        if not text or "\0" in text:
            raise pyfuse3.FUSEError(errno.EINVAL)
        scope_root = self.trees[root][1].locate(entry)[0]
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
            raise self._refuse(root, child, f"symlink to {text!r} would lead outside {scope_root}")
        try:
            ws.symlink(text, wrel)
        except FsError as exc:
            raise self._fail(root, child, exc) from None
        self._changed(root, child)
        if self._link_text(root, ws, wrel, child) is not None:
            return self.entry(root, child)
        # shown as its target from the next lookup on; the reply to symlink(2)
        # must be a symlink, under a number of its own so no inode changes type
        ino = self.inodes.ino(f"{root}:{child}{RAW_LINK}")
        try:
            attr = self.getattr(ino)
        except pyfuse3.FUSEError:
            self.inodes.forget(ino, 0)
            raise
        attr.entry_timeout = 0
        self.inodes.ref(ino)
        return attr

    def setattr(self, inode: int, attr, fields) -> pyfuse3.EntryAttributes:
        root, rel = self.where(inode)
        if not rel:
            raise pyfuse3.FUSEError(errno.EACCES)
        ws, wrel, _, _ = self.confined(root, rel)
        try:
            if fields.update_size:
                ws.truncate(wrel, attr.st_size)
            if fields.update_mode:
                ws.chmod(wrel, stat.S_IMODE(attr.st_mode))
            if fields.update_mtime or fields.update_atime:
                st = ws.stat(wrel)
                ws.utime(wrel, ns=(attr.st_atime_ns if fields.update_atime else st.st_atime_ns,
                                   attr.st_mtime_ns if fields.update_mtime else st.st_mtime_ns))
        except FsError as exc:
            raise self._fail(root, rel, exc) from None
        self._changed(root, rel)
        return self.getattr(inode)

    # -- files ---------------------------------------------------------------------
    def open(self, inode: int, flags: int) -> int:
        root, rel = self.where(inode)
        if not rel:
            raise pyfuse3.FUSEError(errno.EISDIR)
        ws, wrel, _, _ = self.confined(root, rel)
        try:
            return ws.open(wrel, flags & ~(os.O_CREAT | os.O_EXCL))
        except FsError as exc:
            raise self._fail(root, rel, exc) from None

    def create(self, parent: int, name: bytes, mode: int, flags: int) -> tuple[int, pyfuse3.EntryAttributes]:
        root, rel = self.where(parent)
        if not rel:
            raise pyfuse3.FUSEError(errno.EACCES)  # top level holds directories only
        child = self._child(rel, name)
        ws, wrel, _, _ = self.confined(root, child)
        try:
            fd = ws.open(wrel, flags | os.O_CREAT, stat.S_IMODE(mode))
        except FsError as exc:
            raise self._fail(root, child, exc) from None
        self._changed(root, child)
        return fd, self.entry(root, child)

    def mkdir(self, parent: int, name: bytes, mode: int) -> pyfuse3.EntryAttributes:
        root, rel = self.where(parent)
        child = self._child(rel, name)
        tree = self.trees[root][1]
        try:
            if rel:
                ws, wrel, _, _ = self.confined(root, child)
                ws.mkdir(wrel, stat.S_IMODE(mode))
            else:
                if child in tree.names():
                    raise pyfuse3.FUSEError(errno.EEXIST)
                tree.create(child)
        except FsError as exc:
            raise self._fail(root, child, exc) from None
        except OSError as exc:
            raise _errno(exc) from None
        self._changed(root, child)
        return self.entry(root, child)

    def unlink(self, parent: int, name: bytes, *, directory: bool) -> None:
        """rm/rmdir. A symlink loses the link only, never what it points to."""
        root, rel = self.where(parent)
        child = self._child(rel, name)
        ws, wrel, _, _ = self.confined(root, child)
        self._no_link_on_the_way(root, ws, child)
        try:
            st = ws.lstat(wrel)
            if stat.S_ISLNK(st.st_mode):
                ws.unlink(wrel)  # even for rmdir: the mount may show it as a directory
            elif directory:
                ws.rmdir(wrel)  # a whole skill: `rm -r` emptied it first
            elif not rel:
                raise pyfuse3.FUSEError(errno.EISDIR)
            else:
                ws.unlink(wrel)
        except FsError as exc:
            raise self._fail(root, child, exc) from None
        self._forget_path(root, child)
        self._changed(root, child)

    def rename(self, old_parent: int, old: bytes, new_parent: int, new: bytes, flags: int) -> None:
        if flags & ~1:  # only RENAME_NOREPLACE; EXCHANGE/WHITEOUT are not done here
            raise pyfuse3.FUSEError(errno.EINVAL)
        root_a, rel_a = self.where(old_parent)
        root_b, rel_b = self.where(new_parent)
        if root_a != root_b or (rel_a and not rel_b) or (rel_b and not rel_a):
            raise pyfuse3.FUSEError(errno.EXDEV)  # another tree, or a file becoming a skill
        src_rel, dst_rel = self._child(rel_a, old), self._child(rel_b, new)
        try:
            if rel_b:  # inside one skill: the confined walker renames
                ws_a, src, entry_a, _ = self.confined(root_a, src_rel)
                ws_b, dst, entry_b, _ = self.confined(root_b, dst_rel)
                if entry_a != entry_b:
                    raise pyfuse3.FUSEError(errno.EXDEV)  # another skill: mv copies
                self._no_link_on_the_way(root_a, ws_a, src_rel)
                self._no_link_on_the_way(root_b, ws_b, dst_rel)
                ws_a.rename(src, dst, noreplace=bool(flags & 1))
            else:  # renaming a skill: the new name lives beside the old copy
                if dst_rel in self.trees[root_b][1].names():
                    raise pyfuse3.FUSEError(errno.EEXIST)
                ws, src, _, _ = self.confined(root_a, src_rel)
                ws.rename(src, posixpath.join(posixpath.dirname(src), dst_rel), noreplace=True)
        except FsError as exc:
            raise self._fail(root_a, src_rel, exc) from None
        self._forget_path(root_b, dst_rel)
        self._move_path(root_a, src_rel, dst_rel)
        self._changed(root_a, src_rel)
        self._changed(root_b, dst_rel)

    def _move_path(self, root: int, src: str, dst: str) -> None:
        self.inodes.move(f"{root}:{src}", f"{root}:{dst}")
        self.inodes.move(f"{root}:{src}{RAW_LINK}", f"{root}:{dst}{RAW_LINK}")

    def _forget_path(self, root: int, rel: str) -> None:
        self.inodes.move(f"{root}:{rel}", None)
        self.inodes.move(f"{root}:{rel}{RAW_LINK}", None)

    def _changed(self, root: int, rel: str) -> None:
        """Tell the tree what changed, so it re-resolves only that (if anything)."""
        name, _, rest = rel.partition("/")
        self.trees[root][1].changed(name, rest)

    def changed_after_write(self, inode: int) -> None:
        root, rel = self.where(inode)
        if rel:
            self._changed(root, rel)

    # -- xattrs --------------------------------------------------------------------
    def xattrs(self, inode: int) -> dict[str, bytes]:
        root, rel = self.where(inode)
        if not rel:
            top = getattr(self.trees[root][1], "root_xattrs", None)
            return top() if top is not None else {}
        if "/" in rel:
            return {}
        return self.trees[root][1].xattrs(rel)


async def pread(fd: int, size: int, off: int) -> bytes:
    return await trio.to_thread.run_sync(os.pread, fd, size, off)


async def pwrite(fd: int, buf: bytes, off: int) -> int:
    return await trio.to_thread.run_sync(os.pwrite, fd, buf, off)
