"""skills/ and agents/: real files, passed through to their winning copy.

The FUSE side only maps inodes to (tree, relative path) and forwards file
operations to the real path; which copy wins, where a new one is created and
what the extended attributes say come from a ``Tree`` (rnixfs.views).
"""
from __future__ import annotations

import errno
import logging
import os
import stat
from pathlib import Path
from typing import Protocol

import pyfuse3
import trio

from ..devices.fs import FsError, Workspace
from .inodemap import InodeMap

log = logging.getLogger(__name__)

PT_BASE = 1 << 44  # inode numbers of passed-through files start here
TIMEOUT = 1.0  # seconds: changes made on disk show within a second
NAME_MAX = 255


class Tree(Protocol):
    """What the adapter needs from the skills or agents view."""

    def names(self) -> list[str]: ...

    def locate(self, name: str) -> Path | None: ...

    def create(self, name: str) -> Path: ...

    def xattrs(self, name: str) -> dict[str, bytes]: ...

    def changed(self) -> None: ...


def _errno(exc: OSError) -> pyfuse3.FUSEError:
    return pyfuse3.FUSEError(exc.errno or errno.EIO)


class Passthrough:
    """Inode table and file operations for the passed-through trees."""

    def __init__(self, trees: dict[int, tuple[str, Tree]], attr):
        self.trees = trees  # root inode -> (name, Tree)
        self._attr = attr  # Operations._attr, to share uid/gid and layout
        # keys are "<root inode>:<relative path>", so one map serves every tree
        self.inodes = InodeMap(PT_BASE)
        self._ws: dict[Path, Workspace] = {}

    # -- inodes ------------------------------------------------------------------
    def owns(self, inode: int) -> bool:
        return inode in self.trees or inode >= PT_BASE and inode in self.inodes

    def ino_for(self, root: int, rel: str) -> int:
        return self.inodes.ino(f"{root}:{rel}")

    def where(self, inode: int) -> tuple[int, str]:
        if inode in self.trees:
            return inode, ""
        root, _, rel = self.inodes.path(inode).partition(":")
        return int(root), rel

    def real(self, root: int, rel: str) -> Path:
        """The real path of a skill directory; ENOENT when the skill is gone."""
        name, _, rest = rel.partition("/")
        base = self.trees[root][1].locate(name)
        if base is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return base / rest if rest else base

    def confined(self, root: int, rel: str) -> tuple[Workspace, str]:
        """The skill's directory as a confined device, and the path inside it:
        a symlink swapped in anywhere below cannot lead out (same walker as
        dev/fs)."""
        name, _, rest = rel.partition("/")
        base = self.real(root, name)
        ws = self._ws.get(base)
        if ws is not None and not _same_dir(ws, base):   # replaced on disk (skill update)
            ws.close()
            ws = None
        if ws is None:
            try:
                ws = Workspace(base)
            except FsError as exc:
                raise pyfuse3.FUSEError(exc.errno) from None
            self._ws[base] = ws
        return ws, rest

    # -- attributes ----------------------------------------------------------------
    def getattr(self, inode: int) -> pyfuse3.EntryAttributes:
        root, rel = self.where(inode)
        if not rel:
            return self._attr(inode, stat.S_IFDIR | 0o755, timeout=TIMEOUT)
        ws, rest = self.confined(root, rel)
        try:
            st = ws.lstat(rest)
        except FsError as exc:
            raise pyfuse3.FUSEError(exc.errno) from None
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
            ws, rest = self.confined(root, rel)
            try:
                names = sorted(ws.listdir(rest))
            except FsError as exc:
                raise pyfuse3.FUSEError(exc.errno) from None
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
        ws, rest = self.confined(root, rel)
        try:
            return os.fsencode(ws.readlink(rest))
        except FsError as exc:
            raise pyfuse3.FUSEError(exc.errno) from None

    def setattr(self, inode: int, attr, fields) -> pyfuse3.EntryAttributes:
        root, rel = self.where(inode)
        if not rel:
            raise pyfuse3.FUSEError(errno.EACCES)
        ws, rest = self.confined(root, rel)
        try:
            if fields.update_size:
                ws.truncate(rest, attr.st_size)
            if fields.update_mode:
                ws.chmod(rest, stat.S_IMODE(attr.st_mode))
            if fields.update_mtime or fields.update_atime:
                st = ws.stat(rest)
                ws.utime(rest, ns=(attr.st_atime_ns if fields.update_atime else st.st_atime_ns,
                                   attr.st_mtime_ns if fields.update_mtime else st.st_mtime_ns))
        except FsError as exc:
            raise pyfuse3.FUSEError(exc.errno) from None
        self._changed(root)
        return self.getattr(inode)

    # -- files ---------------------------------------------------------------------
    def open(self, inode: int, flags: int) -> int:
        root, rel = self.where(inode)
        if not rel:
            raise pyfuse3.FUSEError(errno.EISDIR)
        ws, rest = self.confined(root, rel)
        try:
            return ws.open(rest, flags & ~(os.O_CREAT | os.O_EXCL))
        except FsError as exc:
            raise pyfuse3.FUSEError(exc.errno) from None

    def create(self, parent: int, name: bytes, mode: int, flags: int) -> tuple[int, pyfuse3.EntryAttributes]:
        root, rel = self.where(parent)
        if not rel:
            raise pyfuse3.FUSEError(errno.EACCES)  # top level holds directories only
        child = self._child(rel, name)
        ws, rest = self.confined(root, child)
        try:
            fd = ws.open(rest, flags | os.O_CREAT, stat.S_IMODE(mode))
        except FsError as exc:
            raise pyfuse3.FUSEError(exc.errno) from None
        self._changed(root)
        return fd, self.entry(root, child)

    def mkdir(self, parent: int, name: bytes, mode: int) -> pyfuse3.EntryAttributes:
        root, rel = self.where(parent)
        child = self._child(rel, name)
        tree = self.trees[root][1]
        try:
            if rel:
                ws, rest = self.confined(root, child)
                ws.mkdir(rest, stat.S_IMODE(mode))
            else:
                if child in tree.names():
                    raise pyfuse3.FUSEError(errno.EEXIST)
                tree.create(child)
        except FsError as exc:
            raise pyfuse3.FUSEError(exc.errno) from None
        except OSError as exc:
            raise _errno(exc) from None
        self._changed(root)
        return self.entry(root, child)

    def unlink(self, parent: int, name: bytes, *, directory: bool) -> None:
        root, rel = self.where(parent)
        child = self._child(rel, name)
        try:
            if rel:
                ws, rest = self.confined(root, child)
                (ws.rmdir if directory else ws.unlink)(rest)
            elif directory:
                os.rmdir(self.real(root, child))  # a whole skill: `rm -r` emptied it first
            else:
                raise pyfuse3.FUSEError(errno.EISDIR)
        except FsError as exc:
            raise pyfuse3.FUSEError(exc.errno) from None
        except OSError as exc:
            raise _errno(exc) from None
        self._forget_path(root, child)
        self._changed(root)

    def rename(self, old_parent: int, old: bytes, new_parent: int, new: bytes, flags: int) -> None:
        if flags & ~1:  # only RENAME_NOREPLACE; EXCHANGE/WHITEOUT are not done here
            raise pyfuse3.FUSEError(errno.EINVAL)
        root_a, rel_a = self.where(old_parent)
        root_b, rel_b = self.where(new_parent)
        if root_a != root_b or (rel_a and not rel_b):
            raise pyfuse3.FUSEError(errno.EXDEV)  # another tree, or a file becoming a skill
        src_rel, dst_rel = self._child(rel_a, old), self._child(rel_b, new)
        try:
            if rel_b:  # inside one skill: the confined device renames
                ws_a, src = self.confined(root_a, src_rel)
                ws_b, dst = self.confined(root_b, dst_rel)
                if ws_a is not ws_b:
                    raise pyfuse3.FUSEError(errno.EXDEV)  # another skill: mv copies
                ws_a.rename(src, dst, noreplace=bool(flags & 1))
            else:  # renaming a skill: the new name lives beside the old copy
                if dst_rel in self.trees[root_b][1].names():
                    raise pyfuse3.FUSEError(errno.EEXIST)
                src_path = self.real(root_a, src_rel)
                self._ws.pop(src_path, None)
                os.rename(src_path, src_path.parent / dst_rel)
        except FsError as exc:
            raise pyfuse3.FUSEError(exc.errno) from None
        except OSError as exc:
            raise _errno(exc) from None
        self._forget_path(root_b, dst_rel)
        self._move_path(root_a, src_rel, dst_rel)
        self._changed(root_a)

    def _move_path(self, root: int, src: str, dst: str) -> None:
        self.inodes.move(f"{root}:{src}", f"{root}:{dst}")

    def _forget_path(self, root: int, rel: str) -> None:
        self.inodes.move(f"{root}:{rel}", None)

    def _changed(self, root: int) -> None:
        self.trees[root][1].changed()
        for ws in self._ws.values():  # skills may have moved: open their roots anew
            ws.close()
        self._ws.clear()

    def changed_after_write(self, inode: int) -> None:
        root, _ = self.where(inode)
        self._changed(root)

    # -- xattrs --------------------------------------------------------------------
    def xattrs(self, inode: int) -> dict[str, bytes]:
        root, rel = self.where(inode)
        if not rel or "/" in rel:
            return {}
        return self.trees[root][1].xattrs(rel)


def _same_dir(ws: Workspace, base: Path) -> bool:
    """Is the directory the cached Workspace holds still the one at ``base``?
    An atomic swap (``skill update``) puts a new directory there."""
    try:
        a, b = os.stat(base), os.fstat(ws._root_fd)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


async def pread(fd: int, size: int, off: int) -> bytes:
    return await trio.to_thread.run_sync(os.pread, fd, size, off)


async def pwrite(fd: int, buf: bytes, off: int) -> int:
    return await trio.to_thread.run_sync(os.pwrite, fd, buf, off)
