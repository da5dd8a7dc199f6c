"""dev/fs: the workspace through the same confined device the agents use.

Every operation goes to ``rnixfs.devices.fs.Workspace`` by relative path, so
`..`, absolute paths and symlinks leading outside are refused there, on the
resolved path, at the moment of the call: the daemon never follows a link
out. Symlinks are stored and shown with their text as given (a venv's
``bin/python -> /usr/bin/python3``); when a client follows one, its own
kernel resolves the text in the client's namespace with the client's own
permissions, as on any filesystem (docs/devices.md).
"""
from __future__ import annotations

import errno
import os
import posixpath
import stat

import pyfuse3

from ..devices.fs import FsError, Workspace
from . import inodes
from .inodemap import InodeMap

WS_BASE = 1 << 45
# Only a root daemon can give files away; otherwise every file is the
# daemon's user's (a single-owner filesystem) and chown is not applied.
_CAN_CHOWN = os.geteuid() == 0
TIMEOUT = 1.0


def _fuse(exc: FsError) -> pyfuse3.FUSEError:
    return pyfuse3.FUSEError(exc.errno)


class WorkspaceFS:
    def __init__(self, ws: Workspace, attr):
        self.ws = ws
        self._attr = attr
        self.inodes = InodeMap(WS_BASE, {"": inodes.DEV_FS})

    def owns(self, inode: int) -> bool:
        return inode == inodes.DEV_FS or inode >= WS_BASE and inode in self.inodes

    def ino_for(self, rel: str) -> int:
        return self.inodes.ino(rel)

    def rel(self, inode: int) -> str:
        return self.inodes.path(inode)

    @staticmethod
    def child(rel: str, name: bytes) -> str:
        text = os.fsdecode(name)
        if not text or "/" in text or text in (".", ".."):
            raise pyfuse3.FUSEError(errno.EINVAL)
        return posixpath.join(rel, text) if rel else text

    def _from_stat(self, inode: int, st: os.stat_result) -> pyfuse3.EntryAttributes:
        # A hard-linked file has one number per name here: never cache its
        # attributes, or a write through one name leaves the other's size stale.
        shared = st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode)
        a = self._attr(inode, st.st_mode, size=st.st_size, timeout=0.0 if shared else TIMEOUT,
                       ns=st.st_mtime_ns)
        a.st_nlink, a.st_uid, a.st_gid = st.st_nlink, st.st_uid, st.st_gid
        a.st_atime_ns, a.st_ctime_ns = st.st_atime_ns, st.st_ctime_ns
        return a

    def from_fd(self, inode: int, fd: int) -> pyfuse3.EntryAttributes:
        return self._from_stat(inode, os.fstat(fd))

    def _lstat(self, rel: str) -> os.stat_result:
        try:
            return self.ws.lstat(rel)
        except FsError as exc:
            raise _fuse(exc) from None

    def getattr(self, inode: int) -> pyfuse3.EntryAttributes:
        return self._from_stat(inode, self._lstat(self.rel(inode)))

    def entry(self, rel: str) -> pyfuse3.EntryAttributes:
        """Attributes of a name the kernel will hold: numbered only if it exists."""
        st = self._lstat(rel)
        return self._from_stat(self.inodes.lookup(rel), st)

    def lookup(self, parent: int, name: bytes) -> pyfuse3.EntryAttributes:
        return self.entry(self.child(self.rel(parent), name))

    def forget(self, inode: int, count: int) -> None:
        self.inodes.forget(inode, count)

    def readdir(self, inode: int, start_id: int, token) -> None:
        rel = self.rel(inode)
        try:
            entries = sorted(self.ws.entries(rel))
        except FsError as exc:
            raise _fuse(exc) from None
        for i in range(start_id, len(entries)):
            name, st = entries[i]
            crel = posixpath.join(rel, name) if rel else name
            ino = self.ino_for(crel)
            if not pyfuse3.readdir_reply(token, os.fsencode(name), self._from_stat(ino, st), i + 1):
                return
            self.inodes.ref(ino)  # readdirplus: the kernel now holds the entry

    def readlink(self, inode: int) -> bytes:
        try:
            return os.fsencode(self.ws.readlink(self.rel(inode)))
        except FsError as exc:
            raise _fuse(exc) from None

    def open(self, inode: int, flags: int) -> int:
        try:
            return self.ws.open(self.rel(inode), flags & ~os.O_CREAT)
        except FsError as exc:
            raise _fuse(exc) from None

    def _made(self, rel: str, ctx, mode: int | None) -> pyfuse3.EntryAttributes:
        """A new entry gets the caller's uid and gid (the parent's gid in a
        setgid directory) when the daemon can give it away, and exactly the
        permission bits asked (the client's umask is already applied; the
        daemon's own must not be applied twice)."""
        try:
            st = self.ws.lstat(rel)
            if mode is not None and not stat.S_ISLNK(st.st_mode) and (st.st_mode & 0o777) != (mode & 0o777):
                self.ws.chmod(rel, (stat.S_IMODE(st.st_mode) & ~0o777) | (mode & 0o777))
            if ctx is not None and _CAN_CHOWN and (ctx.uid, ctx.gid) != (st.st_uid, st.st_gid):
                parent = posixpath.dirname(rel)
                setgid = self.ws.stat(parent).st_mode & stat.S_ISGID
                self.ws.chown(rel, ctx.uid, -1 if setgid else ctx.gid)
        except FsError as exc:
            raise _fuse(exc) from None
        return self.entry(rel)

    def create(self, parent: int, name: bytes, mode: int, flags: int, ctx=None):
        rel = self.child(self.rel(parent), name)
        try:
            fd = self.ws.open(rel, flags | os.O_CREAT, stat.S_IMODE(mode))
        except FsError as exc:
            raise _fuse(exc) from None
        try:
            return fd, self._made(rel, ctx, stat.S_IMODE(mode))
        except BaseException:
            os.close(fd)
            raise

    def mkdir(self, parent: int, name: bytes, mode: int, ctx=None) -> pyfuse3.EntryAttributes:
        rel = self.child(self.rel(parent), name)
        try:
            self.ws.mkdir(rel, stat.S_IMODE(mode))
        except FsError as exc:
            raise _fuse(exc) from None
        return self._made(rel, ctx, stat.S_IMODE(mode))

    def symlink(self, parent: int, name: bytes, target: bytes, ctx=None) -> pyfuse3.EntryAttributes:
        rel = self.child(self.rel(parent), name)
        try:
            self.ws.symlink(os.fsdecode(target), rel)
        except FsError as exc:
            raise _fuse(exc) from None
        return self._made(rel, ctx, None)

    def link(self, inode: int, new_parent: int, new_name: bytes) -> pyfuse3.EntryAttributes:
        rel = self.child(self.rel(new_parent), new_name)
        try:
            self.ws.link(self.rel(inode), rel)
        except FsError as exc:
            raise _fuse(exc) from None
        return self.entry(rel)

    def mknod(self, parent: int, name: bytes, mode: int, ctx=None) -> pyfuse3.EntryAttributes:
        rel = self.child(self.rel(parent), name)
        try:
            self.ws.mknod(rel, mode)
        except FsError as exc:
            raise _fuse(exc) from None
        return self._made(rel, ctx, stat.S_IMODE(mode))

    def unlink(self, parent: int, name: bytes, *, directory: bool) -> None:
        rel = self.child(self.rel(parent), name)
        try:
            (self.ws.rmdir if directory else self.ws.unlink)(rel)
        except FsError as exc:
            raise _fuse(exc) from None
        self._move(rel, None)

    def rename(self, old_parent: int, old: bytes, new_parent: int, new: bytes, flags: int) -> None:
        src = self.child(self.rel(old_parent), old)
        dst = self.child(self.rel(new_parent), new)
        try:
            self.ws.rename(src, dst, noreplace=bool(flags & 1), exchange=bool(flags & 2))
        except FsError as exc:
            raise _fuse(exc) from None
        if flags & 2:
            tmp = "\0swap"
            self._move(src, tmp)
            self._move(dst, src)
            self._move(tmp, dst)
        else:
            self._move(dst, None)
            self._move(src, dst)

    def _move(self, src: str, dst: str | None) -> None:
        self.inodes.move(src, dst)

    def setattr(self, inode: int, attr, fields) -> pyfuse3.EntryAttributes:
        rel = self.rel(inode)
        try:
            if (fields.update_uid or fields.update_gid) and _CAN_CHOWN:
                # the kernel has checked the caller may (default_permissions)
                self.ws.chown(rel, attr.st_uid if fields.update_uid else -1,
                              attr.st_gid if fields.update_gid else -1)
            if fields.update_size:
                self.ws.truncate(rel, attr.st_size)
            if fields.update_mode:
                self.ws.chmod(rel, stat.S_IMODE(attr.st_mode))
            if fields.update_mtime or fields.update_atime:
                # the kernel resolved any link it meant to follow: this inode is the one
                st = self.ws.lstat(rel)
                self.ws.utime(rel, ns=(attr.st_atime_ns if fields.update_atime else st.st_atime_ns,
                                       attr.st_mtime_ns if fields.update_mtime else st.st_mtime_ns),
                              follow=not stat.S_ISLNK(st.st_mode))
        except FsError as exc:
            raise _fuse(exc) from None
        return self.getattr(inode)
