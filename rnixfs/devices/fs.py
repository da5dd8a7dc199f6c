"""dev/fs — the workspace, confined.

One ``Workspace`` serves the FUSE mount (``$M/dev/fs/…``) and the agents'
tools (Read, Write, Edit, Glob, Grep): the same code, so ``cat
$M/dev/fs/x`` and an agent's Read of ``x`` see the same file or the same
refusal.

Confinement is checked on the *resolved* path, race-free: a path is walked
component by component from a directory fd of the workspace root, with
``O_PATH|O_NOFOLLOW`` at every step. The kernel never follows a symlink
for us; we read each link with ``readlinkat`` and walk its text ourselves,
inside the same confinement. ``..`` pops our own stack of directory fds
(it never asks the kernel for a parent), so no rename can make ``..``
climb out. The final entry is opened with ``O_NOFOLLOW`` relative to its
directory fd; if a symlink was swapped in meanwhile, the open fails and the
walk starts again. See docs/devices.md for the rules and their limits.

All calls are blocking and synchronous; async callers run them through
``trio.to_thread``. Errors are ``FsError`` (a ``SyscallError``) whose
``code`` follows the kernel's codes and whose ``errno`` is the precise host
errno where there is one (EEXIST, ENOTDIR, ENOTEMPTY, ELOOP, …).

No pyfuse3 here: the mount adapter imports this module, not the reverse.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno as _errno
import os
import re
import secrets
import stat as _stat
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from rnixfs.kernel.errors import ERRNO, Code, SyscallError

from . import match

DEVICE = "/dev/fs"
MAX_SYMLINKS = 40          # Linux's MAXSYMLINKS
NAME_MAX = 255             # bytes per component
PATH_MAX = 4096            # bytes per path, including the terminating NUL
MAX_DEPTH = 64             # directory depth glob/grep descend to
# glob/grep list these but do not descend into them unless the pattern names them
SKIP_DIRS = frozenset({".git", ".hg", ".svn", "node_modules", ".venv", "__pycache__"})
BINARY_PROBE = 8192        # grep: a NUL byte in the first 8 KiB marks a binary file
_MAX_RETRIES = 16          # re-walks after a concurrent swap of the final entry

_O_WALK = os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC
_O_LISTDIR = os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC
_MAGIC = re.compile(r"[*?\[]")

# OSError errno -> kernel Code (the errno itself is kept on the FsError).
_CODES = {
    _errno.ENOENT: Code.NOT_FOUND,
    _errno.ENOTDIR: Code.NOT_FOUND,
    _errno.EACCES: Code.PERMISSION,
    _errno.EPERM: Code.PERMISSION,
    _errno.EROFS: Code.PERMISSION,
    _errno.EEXIST: Code.INVALID,
    _errno.ENOTEMPTY: Code.INVALID,
    _errno.EISDIR: Code.INVALID,
    _errno.EINVAL: Code.INVALID,
    _errno.ELOOP: Code.INVALID,
    _errno.ENAMETOOLONG: Code.INVALID,
    _errno.EXDEV: Code.INVALID,
    _errno.ENXIO: Code.INVALID,
    _errno.EBUSY: Code.BUSY,
    _errno.ETXTBSY: Code.BUSY,
    _errno.EMFILE: Code.BUSY,
    _errno.ENFILE: Code.BUSY,
    _errno.EFBIG: Code.TOO_BIG,
    _errno.ENOSPC: Code.TOO_BIG,
    _errno.EDQUOT: Code.TOO_BIG,
    _errno.EAGAIN: Code.AGAIN,
}


class FsError(SyscallError):
    """A refused or failed workspace operation.

    ``code`` is the kernel code (PERMISSION for every escape attempt);
    ``errno`` is the precise host errno when the host said more than the code
    does (EEXIST for mkdir of an existing directory, ELOOP for a link loop),
    else the code's errno. The mount adapter raises ``FUSEError(exc.errno)``.
    """

    def __init__(self, code: Code, cause: str, *, syscall: str = "", device: str = DEVICE,
                 errno: int | None = None):
        super().__init__(code, cause, syscall=syscall, device=device)
        self._errno = errno

    @property
    def errno(self) -> int:  # type: ignore[override]
        return self._errno if self._errno is not None else ERRNO[self.code]


class Matches(list):
    """A list of glob/grep results; ``truncated`` says a limit cut it short
    (``timed_out``: the ``timeout`` was that limit)."""

    truncated: bool = False
    timed_out: bool = False


class Stop:
    """When a running glob/grep gives up: ``cancel`` (a threading.Event) set
    from another thread (the caller was killed), or ``timeout`` seconds after
    the start. Checked between entries and between lines, so a search ends
    within one line's linear-time match of either."""

    def __init__(self, cancel: threading.Event | None = None, timeout: float | None = None):
        self._clock = time.monotonic
        self._deadline = None if not timeout or timeout <= 0 else self._clock() + timeout
        self._cancelled = cancel if cancel is not None else threading.Event()

    def check(self, out: "Matches", syscall: str) -> bool:
        """True when the search must end now: truncated on timeout, INTERRUPTED when cancelled."""
        if self._cancelled.is_set():
            raise FsError(Code.INTERRUPTED, "interrupted", syscall=syscall)
        if self._deadline is not None and self._clock() > self._deadline:
            out.truncated = out.timed_out = True
            return True
        return False


def _escape(rel: str, syscall: str, why: str) -> FsError:
    return FsError(Code.PERMISSION, f"{_show(rel)}: {why}", syscall=syscall)


def _show(rel: str) -> str:
    text = repr(rel)
    return text if len(text) <= 200 else text[:197] + "...'"


def _oserror(exc: OSError, rel: str, syscall: str) -> FsError:
    code = _CODES.get(exc.errno, Code.INTERNAL)
    return FsError(code, f"{_show(rel)}: {os.strerror(exc.errno) if exc.errno else exc}",
                   syscall=syscall, errno=exc.errno or None)


def _err(code: Code, rel: str, what: str, syscall: str, errno: int | None = None) -> FsError:
    return FsError(code, f"{_show(rel)}: {what}", syscall=syscall, errno=errno)


# -- renameat2 (RENAME_NOREPLACE / RENAME_EXCHANGE) ---------------------------------------
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
_libc = None


def renameat2(src_dir_fd: int, src: str, dst_dir_fd: int, dst: str, flags: int) -> None:
    """``renameat2(2)`` via libc; raises OSError (ENOSYS where unsupported)."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    fn = getattr(_libc, "renameat2", None)
    if fn is None:
        raise OSError(_errno.ENOSYS, "renameat2 is not available")
    rc = fn(src_dir_fd, os.fsencode(src), dst_dir_fd, os.fsencode(dst), ctypes.c_uint(flags))
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


# -- the walk -----------------------------------------------------------------------------
@dataclass
class _Ref:
    """Where a walked path ends: entry ``name`` in directory ``dirfd``.

    ``parts`` are the canonical components from the root (``[]`` for the root
    itself, then ``name`` is ``"."``). ``st`` is the entry's lstat (None if it
    does not exist). ``dirfd`` is owned (closed by ``close``) unless it is the
    workspace's root fd.
    """

    dirfd: int
    name: str
    parts: list[str]
    st: os.stat_result | None
    must_dir: bool = False
    dotted: bool = False           # the path ended in "." or ".."
    owned: bool = True

    @property
    def is_root(self) -> bool:
        return not self.parts

    @property
    def rel(self) -> str:
        return "/".join(self.parts) or "."

    def close(self) -> None:
        if self.owned:
            os.close(self.dirfd)
            self.owned = False

    def __enter__(self) -> "_Ref":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class _Parsed:
    comps: list[str]
    must_dir: bool
    dotted: bool
    text: str = field(default="")


class Workspace:
    """The workspace at ``root``; every path argument is relative to it.

    Holds one ``O_PATH`` directory fd of the root for its lifetime (``close``,
    or use as a context manager). Thread-safe: every call works on its own
    fds.
    """

    def __init__(self, root: Path | str, *, hidden: tuple[str, ...] = ()):
        self.root = Path(root)
        # Canonical paths never served, not even stat'ed: the daemon's own
        # mount point when it lies inside the workspace (a stat of it would
        # wait on the daemon itself). See docs/devices.md.
        self._hidden = frozenset(tuple(c for c in h.split("/") if c) for h in hidden if h.strip("/"))
        self._roots = {os.path.abspath(self.root).rstrip("/") or "/",
                       os.path.realpath(self.root).rstrip("/") or "/"}
        try:
            self._root_fd = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise _oserror(exc, str(root), "Mount") from None

    def close(self) -> None:
        fd, self._root_fd = self._root_fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> "Workspace":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass

    # -- parsing ------------------------------------------------------------------------
    def _parse(self, rel, syscall: str, *, empty_ok: bool) -> _Parsed:
        if isinstance(rel, os.PathLike):
            rel = os.fspath(rel)
        if isinstance(rel, bytes):
            if b"\0" in rel:
                raise _err(Code.INVALID, os.fsdecode(rel.replace(b"\0", b"\\0")), "NUL byte in path", syscall)
            rel = os.fsdecode(rel)
        if not isinstance(rel, str):
            raise FsError(Code.INVALID, f"path must be text, not {type(rel).__name__}", syscall=syscall)
        if "\0" in rel:
            raise _err(Code.INVALID, rel.replace("\0", "\\0"), "NUL byte in path", syscall)
        if rel == "":
            if empty_ok:
                return _Parsed([], False, False, "")
            raise FsError(Code.INVALID, "empty path", syscall=syscall)
        if rel.startswith("/"):
            raise _escape(rel, syscall, "absolute paths are outside the workspace")
        try:
            raw = os.fsencode(rel)
        except UnicodeEncodeError:
            raise _err(Code.INVALID, rel, "path is not encodable", syscall) from None
        if len(raw) >= PATH_MAX:
            raise _err(Code.INVALID, rel, f"path longer than {PATH_MAX - 1} bytes", syscall,
                       _errno.ENAMETOOLONG)
        comps = [c for c in rel.split("/") if c]
        depth = 0
        for c in comps:
            if len(os.fsencode(c)) > NAME_MAX:
                raise _err(Code.INVALID, rel, f"a name is longer than {NAME_MAX} bytes", syscall,
                           _errno.ENAMETOOLONG)
            if c == "..":
                depth -= 1
                if depth < 0:   # refused on the string already, whatever the tree holds
                    raise _escape(rel, syscall, "'..' leads outside the workspace")
            elif c != ".":
                depth += 1
        dotted = bool(comps) and comps[-1] in (".", "..")
        return _Parsed(comps, rel.endswith("/") or dotted, dotted, rel)

    def _link_target(self, text: str, rel: str, syscall: str) -> tuple[bool, list[str]]:
        """(restart at root?, components) for a symlink's text, or an escape error."""
        if not text:
            raise _err(Code.NOT_FOUND, rel, "empty symlink", syscall, _errno.ENOENT)
        if text.startswith("/"):
            norm = text.rstrip("/") or "/"
            for root in self._roots:
                if norm == root or norm.startswith(root.rstrip("/") + "/"):
                    return True, [c for c in norm[len(root):].split("/") if c]
            raise _escape(rel, syscall, f"symlink points outside the workspace ({_show(text)})")
        return False, [c for c in text.split("/") if c]

    def _walk(self, rel, syscall: str, *, follow: bool, empty_ok: bool = False) -> _Ref:
        """Walk ``rel`` from the root fd, confined; see the module docstring."""
        p = self._parse(rel, syscall, empty_ok=empty_ok)
        root = self._root_fd
        if root < 0:
            raise FsError(Code.INTERNAL, "workspace is closed", syscall=syscall)
        names: list[str] = []
        fds: list[int] = []          # fds[i] is the directory names[: i + 1]
        todo = deque(p.comps)
        links = 0
        keep = -1                    # the fd handed to the _Ref (not closed here)

        def cur() -> int:
            return fds[-1] if fds else root

        def splice(text: str) -> None:
            nonlocal links
            links += 1
            if links > MAX_SYMLINKS:
                raise _err(Code.INVALID, p.text, "too many levels of symbolic links", syscall, _errno.ELOOP)
            restart, comps = self._link_target(text, p.text, syscall)
            # ".." inside a link's text is popped off our own fd stack like any other
            if restart:
                while fds:
                    os.close(fds.pop())
                names.clear()
            todo.extendleft(reversed(comps))

        try:
            while todo:
                c = todo.popleft()
                if c == ".":
                    continue
                if c == "..":
                    if not names:
                        raise _escape(p.text, syscall, "resolves outside the workspace")
                    names.pop()
                    os.close(fds.pop())
                    continue
                last = not todo
                here = cur()
                if self._hidden and tuple(names + [c]) in self._hidden:
                    raise _err(Code.NOT_FOUND, p.text, "no such file or directory", syscall, _errno.ENOENT)
                if last and not (p.must_dir and follow):
                    # the final entry: lstat it, follow a symlink only when asked
                    try:
                        st = os.stat(c, dir_fd=here, follow_symlinks=False)
                    except FileNotFoundError:
                        st = None
                    except OSError as exc:
                        raise _oserror(exc, p.text, syscall) from None
                    if st is not None and follow and _stat.S_ISLNK(st.st_mode):
                        try:
                            splice(os.readlink(c, dir_fd=here))
                        except OSError as exc:  # swapped away meanwhile: look again
                            if exc.errno not in (_errno.EINVAL, _errno.ENOENT):
                                raise _oserror(exc, p.text, syscall) from None
                            links += 1
                            if links > MAX_SYMLINKS:
                                raise _err(Code.BUSY, p.text, "path keeps changing under us",
                                           syscall) from None
                            todo.appendleft(c)
                        continue
                    keep = here
                    return _Ref(here, c, names + [c], st, p.must_dir, p.dotted, owned=bool(fds))
                try:
                    fd = os.open(c, _O_WALK, dir_fd=here)
                except OSError as exc:
                    if exc.errno in (_errno.ENOTDIR, _errno.ELOOP):
                        try:
                            text = os.readlink(c, dir_fd=here)
                        except OSError:
                            raise _err(Code.NOT_FOUND, p.text, "not a directory", syscall,
                                       _errno.ENOTDIR) from None
                        splice(text)
                        continue
                    if exc.errno == _errno.ENOENT and last:
                        # "new/" for mkdir or create: the final entry does not exist yet
                        keep = here
                        return _Ref(here, c, names + [c], None, p.must_dir, p.dotted, owned=bool(fds))
                    raise _oserror(exc, p.text, syscall) from None
                names.append(c)
                fds.append(fd)
            # the path ended on a directory on our stack ("", ".", "a/..", "dir/")
            if not names:
                return _Ref(root, ".", [], os.fstat(root), True, p.dotted or not p.comps, owned=False)
            st = os.fstat(fds[-1])
            os.close(fds.pop())
            name = names[-1]
            keep = cur()
            return _Ref(keep, name, list(names), st, True, p.dotted, owned=bool(fds))
        finally:
            for fd in fds:
                if fd != keep:
                    os.close(fd)

    # -- public API -----------------------------------------------------------------------
    def resolve(self, rel) -> str:
        """The canonical relative path ``rel`` names (symlinks inside followed).

        ``"."`` for the root. A final entry that does not exist yet is fine
        (``resolve("new.txt")`` for a file about to be created); a missing
        directory on the way is NOT_FOUND.
        """
        with self._walk(rel, "Resolve", follow=True, empty_ok=True) as ref:
            if ref.must_dir and ref.st is not None and not _stat.S_ISDIR(ref.st.st_mode):
                raise _err(Code.NOT_FOUND, rel, "not a directory", "Resolve", _errno.ENOTDIR)
            return ref.rel

    def open(self, rel, flags: int, mode: int = 0o644) -> int:
        """Open ``rel`` confined; return a plain fd (the caller closes it).

        ``flags`` are ``os.O_*``. ``O_CLOEXEC``, ``O_NOCTTY`` are always added;
        ``O_NOFOLLOW`` in ``flags`` means a final symlink is not followed
        (ELOOP, as open(2)); ``O_CREAT|O_EXCL`` never follows either. Only
        regular files and directories are served: FIFOs, sockets and device
        nodes are INVALID (opened non-blocking, so a FIFO never hangs us).
        """
        if flags & os.O_PATH:
            raise _err(Code.INVALID, str(rel), "O_PATH is not served", "Open")
        follow = not (flags & os.O_NOFOLLOW) and not (flags & os.O_CREAT and flags & os.O_EXCL)
        want = flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK
        for _ in range(_MAX_RETRIES):
            with self._walk(rel, "Open", follow=follow) as ref:
                st = ref.st
                if st is None and not flags & os.O_CREAT:
                    raise _err(Code.NOT_FOUND, rel, "no such file or directory", "Open", _errno.ENOENT)
                if st is None and ref.must_dir:
                    raise _err(Code.INVALID, rel, "is a directory", "Open", _errno.EISDIR)
                if st is not None and not _served(st.st_mode) and not _stat.S_ISLNK(st.st_mode):
                    raise _err(Code.INVALID, rel, "not a regular file or directory", "Open")
                try:
                    fd = os.open(ref.name, want, mode, dir_fd=ref.dirfd)
                except OSError as exc:
                    if exc.errno == _errno.ELOOP and follow:
                        continue          # a symlink was swapped in: walk again
                    raise _oserror(exc, rel, "Open") from None
            try:
                fst = os.fstat(fd)
                if not _served(fst.st_mode):
                    raise _err(Code.INVALID, rel, "not a regular file or directory", "Open")
                if ref.must_dir and not _stat.S_ISDIR(fst.st_mode):
                    raise _err(Code.NOT_FOUND, rel, "not a directory", "Open", _errno.ENOTDIR)
                if not flags & os.O_NONBLOCK:
                    os.set_blocking(fd, True)
            except BaseException:
                os.close(fd)
                raise
            return fd
        raise _err(Code.BUSY, rel, "path keeps changing under us", "Open")

    def stat(self, rel="") -> os.stat_result:
        """stat(2) of ``rel``, symlinks inside followed; ``""`` is the root."""
        with self._walk(rel, "Stat", follow=True, empty_ok=True) as ref:
            if ref.st is None:
                raise _err(Code.NOT_FOUND, rel, "no such file or directory", "Stat", _errno.ENOENT)
            if ref.must_dir and not _stat.S_ISDIR(ref.st.st_mode):
                raise _err(Code.NOT_FOUND, rel, "not a directory", "Stat", _errno.ENOTDIR)
            return ref.st

    def lstat(self, rel="") -> os.stat_result:
        """lstat(2): a final symlink is described, not followed."""
        with self._walk(rel, "Lstat", follow=False, empty_ok=True) as ref:
            if ref.st is None:
                raise _err(Code.NOT_FOUND, rel, "no such file or directory", "Lstat", _errno.ENOENT)
            return ref.st

    def exists(self, rel) -> bool:
        try:
            self.stat(rel)
            return True
        except FsError as exc:
            if exc.code in (Code.NOT_FOUND,):
                return False
            raise

    def _opendir(self, rel, syscall: str) -> tuple[int, list[str]]:
        for _ in range(_MAX_RETRIES):
            with self._walk(rel, syscall, follow=True, empty_ok=True) as ref:
                if ref.st is None:
                    raise _err(Code.NOT_FOUND, rel, "no such file or directory", syscall, _errno.ENOENT)
                if not _stat.S_ISDIR(ref.st.st_mode):
                    raise _err(Code.NOT_FOUND, rel, "not a directory", syscall, _errno.ENOTDIR)
                try:
                    return os.open(ref.name, _O_LISTDIR, dir_fd=ref.dirfd), ref.parts
                except OSError as exc:
                    if exc.errno in (_errno.ELOOP, _errno.ENOTDIR):
                        continue
                    raise _oserror(exc, rel, syscall) from None
        raise _err(Code.BUSY, rel, "path keeps changing under us", syscall)

    def listdir(self, rel="") -> list[str]:
        """Sorted entry names of directory ``rel`` (without ``.`` and ``..``)."""
        fd, parts = self._opendir(rel, "Readdir")
        try:
            return [n for n in sorted(os.listdir(fd)) if not self.is_hidden(parts, n)]
        finally:
            os.close(fd)

    def is_hidden(self, parts: list[str], name: str) -> bool:
        """Whether entry ``name`` of canonical directory ``parts`` is never served."""
        return bool(self._hidden) and tuple(parts) + (name,) in self._hidden

    def entries(self, rel="") -> list[tuple[str, os.stat_result]]:
        """``listdir`` with each entry's lstat (for readdir with attributes).

        Entries that vanish between the listing and their lstat are left out.
        """
        fd, parts = self._opendir(rel, "Readdir")
        try:
            out = []
            for name in sorted(os.listdir(fd)):
                if self.is_hidden(parts, name):
                    continue
                try:
                    out.append((name, os.stat(name, dir_fd=fd, follow_symlinks=False)))
                except FileNotFoundError:
                    continue
            return out
        finally:
            os.close(fd)

    def _mutable(self, rel, syscall: str) -> _Ref:
        ref = self._walk(rel, syscall, follow=False)
        if ref.is_root:
            ref.close()
            raise _err(Code.BUSY, rel, "the workspace root itself", syscall)
        if ref.dotted:
            ref.close()
            raise _err(Code.INVALID, rel, "path ends in '.' or '..'", syscall)
        return ref

    def mkdir(self, rel, mode: int = 0o777) -> None:
        with self._walk(rel, "Mkdir", follow=False) as ref:
            if ref.is_root or ref.dotted or ref.st is not None:
                raise _err(Code.INVALID, rel, "file exists", "Mkdir", _errno.EEXIST)
            try:
                os.mkdir(ref.name, mode, dir_fd=ref.dirfd)
            except OSError as exc:
                raise _oserror(exc, rel, "Mkdir") from None

    def unlink(self, rel) -> None:
        """Remove a file or a symlink (the link itself, never its target)."""
        with self._mutable(rel, "Unlink") as ref:
            if ref.st is None:
                raise _err(Code.NOT_FOUND, rel, "no such file or directory", "Unlink", _errno.ENOENT)
            if _stat.S_ISDIR(ref.st.st_mode):
                raise _err(Code.INVALID, rel, "is a directory", "Unlink", _errno.EISDIR)
            if ref.must_dir:
                raise _err(Code.NOT_FOUND, rel, "not a directory", "Unlink", _errno.ENOTDIR)
            try:
                os.unlink(ref.name, dir_fd=ref.dirfd)
            except OSError as exc:
                raise _oserror(exc, rel, "Unlink") from None

    def rmdir(self, rel) -> None:
        with self._mutable(rel, "Rmdir") as ref:
            try:
                os.rmdir(ref.name, dir_fd=ref.dirfd)
            except OSError as exc:
                raise _oserror(exc, rel, "Rmdir") from None

    def rename(self, src, dst, *, noreplace: bool = False, exchange: bool = False) -> None:
        """rename(2) inside the workspace (entries themselves, links not followed).

        ``noreplace``/``exchange`` are renameat2's RENAME_NOREPLACE /
        RENAME_EXCHANGE (FUSE passes them as rename flags).
        """
        with self._mutable(src, "Rename") as a, self._mutable(dst, "Rename") as b:
            if a.st is None:
                raise _err(Code.NOT_FOUND, src, "no such file or directory", "Rename", _errno.ENOENT)
            try:
                flags = (RENAME_NOREPLACE if noreplace else 0) | (RENAME_EXCHANGE if exchange else 0)
                if flags:
                    renameat2(a.dirfd, a.name, b.dirfd, b.name, flags)
                else:
                    os.rename(a.name, b.name, src_dir_fd=a.dirfd, dst_dir_fd=b.dirfd)
            except OSError as exc:
                raise _oserror(exc, f"{src} -> {dst}", "Rename") from None

    def readlink(self, rel) -> str:
        """The text of symlink ``rel``, whatever it points at (never followed).

        A link pointing outside is reported as it is; any attempt to go
        through it is PERMISSION. ``link_target`` says where it leads.
        """
        with self._walk(rel, "Readlink", follow=False) as ref:
            if ref.st is None:
                raise _err(Code.NOT_FOUND, rel, "no such file or directory", "Readlink", _errno.ENOENT)
            if not _stat.S_ISLNK(ref.st.st_mode):
                raise _err(Code.INVALID, rel, "not a symbolic link", "Readlink", _errno.EINVAL)
            try:
                return os.readlink(ref.name, dir_fd=ref.dirfd)
            except OSError as exc:
                raise _oserror(exc, rel, "Readlink") from None

    def link_target(self, rel) -> str | None:
        """Canonical relative path a path leads to, or None if it leads outside."""
        try:
            return self.resolve(rel)
        except FsError as exc:
            if exc.code is Code.PERMISSION:
                return None
            raise

    def symlink(self, target: str, rel) -> None:
        """Create symlink ``rel`` with text ``target`` (stored as given).

        Any text is allowed, like symlink(2): a link pointing outside is
        harmless because no operation here ever goes through it.
        """
        if not isinstance(target, str) or "\0" in target or not target:
            raise _err(Code.INVALID, str(rel), "bad symlink target", "Symlink")
        with self._walk(rel, "Symlink", follow=False) as ref:
            if ref.is_root or ref.dotted or ref.st is not None:
                raise _err(Code.INVALID, rel, "file exists", "Symlink", _errno.EEXIST)
            try:
                os.symlink(target, ref.name, dir_fd=ref.dirfd)
            except OSError as exc:
                raise _oserror(exc, rel, "Symlink") from None

    def link(self, src, dst) -> None:
        """Hard link ``dst`` to the entry ``src`` (a final symlink is linked
        itself, as link(2) on Linux). Both names are inside, so the link is."""
        with self._mutable(src, "Link") as a, self._walk(dst, "Link", follow=False) as b:
            if a.st is None:
                raise _err(Code.NOT_FOUND, src, "no such file or directory", "Link", _errno.ENOENT)
            if _stat.S_ISDIR(a.st.st_mode):
                raise _err(Code.PERMISSION, src, "hard links to directories are not allowed", "Link",
                           _errno.EPERM)
            if b.is_root or b.dotted or b.st is not None:
                raise _err(Code.INVALID, dst, "file exists", "Link", _errno.EEXIST)
            if a.must_dir or b.must_dir:
                raise _err(Code.NOT_FOUND, f"{src} -> {dst}", "not a directory", "Link", _errno.ENOTDIR)
            try:
                os.link(a.name, b.name, src_dir_fd=a.dirfd, dst_dir_fd=b.dirfd, follow_symlinks=False)
            except OSError as exc:
                raise _oserror(exc, f"{src} -> {dst}", "Link") from None

    def mknod(self, rel, mode: int) -> None:
        """Create a FIFO, a socket node or an empty regular file at ``rel``.

        Device nodes are PERMISSION (EPERM) whoever asks: the daemon may run
        as root, and a device node in the workspace would hand its access on.
        """
        kind = _stat.S_IFMT(mode) or _stat.S_IFREG
        if kind not in (_stat.S_IFIFO, _stat.S_IFSOCK, _stat.S_IFREG):
            raise _err(Code.PERMISSION, str(rel), "only FIFOs, sockets and regular files can be made",
                       "Mknod", _errno.EPERM)
        with self._walk(rel, "Mknod", follow=False) as ref:
            if ref.is_root or ref.dotted or ref.st is not None:
                raise _err(Code.INVALID, rel, "file exists", "Mknod", _errno.EEXIST)
            if ref.must_dir:
                raise _err(Code.NOT_FOUND, rel, "not a directory", "Mknod", _errno.ENOENT)
            try:
                os.mknod(ref.name, kind | _stat.S_IMODE(mode), dir_fd=ref.dirfd)
            except OSError as exc:
                raise _oserror(exc, rel, "Mknod") from None

    def chown(self, rel, uid: int, gid: int) -> None:
        """lchown of the entry ``rel`` itself (-1 keeps a field); a link is
        never followed, so a swap makes this change the link, not a target."""
        with self._walk(rel, "Chown", follow=False, empty_ok=True) as ref:
            if ref.st is None:
                raise _err(Code.NOT_FOUND, rel, "no such file or directory", "Chown", _errno.ENOENT)
            try:
                os.chown(ref.name, uid, gid, dir_fd=ref.dirfd, follow_symlinks=False)
            except OSError as exc:
                raise _oserror(exc, rel, "Chown") from None

    def chmod(self, rel, mode: int) -> None:
        """chmod of ``rel`` (symlinks inside followed; a link itself has no mode)."""
        for _ in range(_MAX_RETRIES):
            with self._walk(rel, "Chmod", follow=True, empty_ok=True) as ref:
                if ref.st is None:
                    raise _err(Code.NOT_FOUND, rel, "no such file or directory", "Chmod", _errno.ENOENT)
                try:
                    fd = os.open(ref.name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=ref.dirfd)
                except OSError as exc:
                    raise _oserror(exc, rel, "Chmod") from None
            try:
                if _stat.S_ISLNK(os.fstat(fd).st_mode):
                    continue              # swapped for a link meanwhile
                # our own O_PATH fd through /proc: chmod exactly the inode we hold
                os.chmod(f"/proc/self/fd/{fd}", mode)
                return
            except OSError as exc:
                raise _oserror(exc, rel, "Chmod") from None
            finally:
                os.close(fd)
        raise _err(Code.BUSY, rel, "path keeps changing under us", "Chmod")

    def truncate(self, rel, size: int) -> None:
        fd = self.open(rel, os.O_WRONLY)
        try:
            os.ftruncate(fd, size)
        except OSError as exc:
            raise _oserror(exc, rel, "Truncate") from None
        finally:
            os.close(fd)

    def utime(self, rel, ns: tuple[int, int] | None = None, *, follow: bool = True) -> None:
        """Set atime/mtime (nanoseconds; None = now) of ``rel``; links inside
        followed unless ``follow`` is False (then a final link itself)."""
        with self._walk(rel, "Utime", follow=follow, empty_ok=True) as ref:
            if ref.st is None:
                raise _err(Code.NOT_FOUND, rel, "no such file or directory", "Utime", _errno.ENOENT)
            try:
                # AT_SYMLINK_NOFOLLOW: a link swapped in meanwhile gets the times, not its target
                os.utime(ref.name, ns=ns, dir_fd=ref.dirfd, follow_symlinks=False)
            except OSError as exc:
                raise _oserror(exc, rel, "Utime") from None

    def read_file(self, rel, limit: int) -> tuple[bytes, bool]:
        """Up to ``limit`` bytes of file ``rel`` and whether there was more."""
        fd = self.open(rel, os.O_RDONLY)
        try:
            if _stat.S_ISDIR(os.fstat(fd).st_mode):
                raise _err(Code.INVALID, rel, "is a directory", "Read", _errno.EISDIR)
            return _read_fd(fd, limit)
        except OSError as exc:
            raise _oserror(exc, rel, "Read") from None
        finally:
            os.close(fd)

    def write_file(self, rel, data: bytes | str, *, create: bool = True) -> int:
        """Replace file ``rel`` with ``data`` atomically; return the byte count.

        A temp file in the same directory is written, fsynced and renamed over
        the target, so readers see the old or the new content, never a mix.
        An existing file keeps its permission bits (and owner, when we may);
        a new one gets 0666 & ~umask. A symlink inside is written through
        (its target is replaced, the link stays). ``create=False``: the file
        must exist (NOT_FOUND otherwise). Replacing makes a new inode: hard
        links to the old file keep the old content.
        """
        if isinstance(data, str):
            data = data.encode()
        with self._walk(rel, "Write", follow=True) as ref:
            if ref.is_root or ref.dotted:
                raise _err(Code.INVALID, rel, "is a directory", "Write", _errno.EISDIR)
            st = ref.st
            if st is None and not create:
                raise _err(Code.NOT_FOUND, rel, "no such file or directory", "Write", _errno.ENOENT)
            if st is not None and _stat.S_ISDIR(st.st_mode):
                raise _err(Code.INVALID, rel, "is a directory", "Write", _errno.EISDIR)
            if ref.must_dir:
                raise _err(Code.NOT_FOUND, rel, "not a directory", "Write", _errno.ENOTDIR)
            if st is not None and not _stat.S_ISREG(st.st_mode):
                raise _err(Code.INVALID, rel, "not a regular file", "Write")
            tmp = f".{ref.name[:200]}.rnix-{secrets.token_hex(6)}.tmp"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o600 if st is not None else 0o666, dir_fd=ref.dirfd)
            except OSError as exc:
                raise _oserror(exc, rel, "Write") from None
            try:
                try:
                    view = memoryview(data)
                    while view:
                        n = os.write(fd, view)
                        view = view[n:]
                    if st is not None:
                        os.fchmod(fd, _stat.S_IMODE(st.st_mode))
                        if (st.st_uid, st.st_gid) != (os.geteuid(), os.getegid()):
                            try:
                                os.fchown(fd, st.st_uid, st.st_gid)
                            except PermissionError:
                                pass
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.rename(tmp, ref.name, src_dir_fd=ref.dirfd, dst_dir_fd=ref.dirfd)
            except BaseException as exc:
                try:
                    os.unlink(tmp, dir_fd=ref.dirfd)
                except OSError:
                    pass
                if isinstance(exc, OSError):
                    raise _oserror(exc, rel, "Write") from None
                raise
            return len(data)

    # -- glob and grep ----------------------------------------------------------------------
    def glob(self, pattern: str, limit: int = 1000, *, max_entries: int = 200_000,
             cancel: threading.Event | None = None, timeout: float | None = None) -> Matches:
        """Canonical relative paths matching ``pattern``, in sorted walk order.

        Shell wildcards per component (``*``, ``?``, ``[...]``) and ``**`` for
        any number of directories. Wildcards match dot-files too. The walk
        never descends through a symlink (a link whose name matches is listed
        as itself) nor into ``SKIP_DIRS`` (.git, node_modules, .venv, …) unless
        the pattern names them; ``..`` is refused after the first wildcard. ``truncated`` is set
        when ``limit`` results or ``max_entries`` visited entries cut it short. Matching is
        linear-time (``match``): no pattern makes a name slow to test. ``cancel`` set from
        another thread ends the walk with INTERRUPTED; after ``timeout`` seconds it ends
        ``truncated`` and ``timed_out``.
        """
        stop = Stop(cancel, timeout) if cancel is not None or timeout else None
        out = Matches()
        for rel, _dirfd, _name, _st in self._search(pattern, "Glob", max_entries, out, follow=False,
                                                     stop=stop):
            if len(out) >= limit:
                out.truncated = True
                break
            out.append(rel)
        return out

    def grep(self, pattern: str, path_glob: str = "**", limit: int = 500, *,
             ignore_case: bool = False, max_line: int = 400,
             max_bytes: int = 64 * 1024 * 1024, max_entries: int = 200_000,
             cancel: threading.Event | None = None, timeout: float | None = None) -> Matches:
        """Lines matching regex ``pattern`` in the files ``path_glob`` selects.

        Returns ``(rel, lineno, line)`` tuples (line without its newline,
        cut to ``max_line`` characters with ``…``). ``path_glob`` without a
        ``/`` matches file names at any depth (``*.py``); with a ``/`` it is a
        glob of the whole path (``src/**/*.py``); a plain directory searches
        it recursively. Binary files (a NUL byte in the first 8 KiB),
        symlinks and non-regular files are skipped. At most ``limit`` lines,
        and at most ``max_bytes`` read overall; ``truncated`` says so.

        ``pattern`` is RE2 syntax, matched in linear time (``match``; no
        backreferences or lookaround): a hostile regex cannot stall the
        daemon. ``cancel`` and ``timeout`` end it early, as for ``glob``.
        """
        stop = Stop(cancel, timeout) if cancel is not None or timeout else None
        try:
            rx = match.compile_regex(pattern, ignore_case=ignore_case)
        except match.PatternError as exc:
            raise FsError(Code.INVALID, f"bad regular expression {_show(pattern)}: {exc}",
                          syscall="Grep") from None
        path_glob = path_glob or "**"
        if "/" not in path_glob.rstrip("/") and _MAGIC.search(path_glob):
            path_glob = "**/" + path_glob
        elif not _MAGIC.search(path_glob):
            try:
                st = self.stat(path_glob)
            except FsError as exc:
                if exc.code is Code.NOT_FOUND:
                    return Matches()
                raise
            if _stat.S_ISDIR(st.st_mode):
                path_glob = path_glob.rstrip("/") + "/**"
        out = Matches()
        budget = max_bytes
        for rel, dirfd, name, st in self._search(path_glob, "Grep", max_entries, out, follow=True,
                                                 stop=stop):
            if not _stat.S_ISREG(st.st_mode):
                continue
            if budget <= 0:
                out.truncated = True
                break
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY,
                             dir_fd=dirfd)
            except OSError:
                continue
            with open(fd, "rb", closefd=True) as f:
                if not _stat.S_ISREG(os.fstat(fd).st_mode):
                    continue
                head = f.read(BINARY_PROBE)
                budget -= len(head)
                if b"\0" in head:
                    continue
                f.seek(0)
                for lineno, raw in enumerate(_lines(f, max_line * 4 + 4096), 1):
                    if stop is not None and lineno % 16 == 0 and stop.check(out, "Grep"):
                        return out
                    budget -= len(raw)
                    line = raw.rstrip(b"\r\n").decode("utf-8", "replace")
                    if rx.search(line):
                        if len(out) >= limit:
                            out.truncated = True
                            return out
                        if len(line) > max_line:
                            line = line[:max_line] + "…"
                        out.append((rel, lineno, line))
                    if budget <= 0:
                        out.truncated = True
                        return out
        return out

    def _search(self, pattern: str, syscall: str, max_entries: int, out: Matches, *,
                follow: bool, stop: Stop | None = None) -> Iterator[tuple[str, int, str, os.stat_result]]:
        """Yield (canonical rel, dir fd, name, lstat) of entries matching a glob.

        ``follow``: a pattern without wildcards names its symlink's target
        (grep) rather than the link itself (glob).
        """
        if not isinstance(pattern, str) or not pattern:
            raise FsError(Code.INVALID, "empty pattern", syscall=syscall)
        if len(pattern) > match.MAX_PATTERN:
            raise FsError(Code.INVALID, f"pattern is {len(pattern)} characters; the cap is "
                          f"{match.MAX_PATTERN}", syscall=syscall)
        p = self._parse(pattern, syscall, empty_ok=False)
        comps = [c for c in p.comps if c != "."]
        first = next((i for i, c in enumerate(comps) if _MAGIC.search(c)), None)
        if first is None:                # no wildcard: the path itself, if it exists
            try:
                with self._walk(pattern, syscall, follow=follow) as ref:
                    if ref.st is not None and not ref.is_root:
                        yield ref.rel, ref.dirfd, ref.name, ref.st
            except FsError as exc:
                if exc.code is not Code.NOT_FOUND:
                    raise
            return
        rest = comps[first:]
        if ".." in rest:
            raise FsError(Code.INVALID, f"{_show(pattern)}: '..' after a wildcard", syscall=syscall)
        prefix = "/".join(comps[:first])
        try:
            fd, base = self._opendir(prefix, syscall)
        except FsError as exc:
            if exc.code is Code.NOT_FOUND:
                return
            raise
        named = {c for c in rest if c in SKIP_DIRS}
        try:
            if "**" in rest:
                rx = match.compile_full(_glob_regex(rest))
                depth_cap = MAX_DEPTH
                per_level = None
            else:
                rx = None
                depth_cap = len(rest)
                per_level = [match.compile_full("(?s:" + _component_regex(c) + ")") for c in rest]
        except match.PatternError as exc:
            raise FsError(Code.INVALID, f"bad pattern {_show(pattern)}: {exc}", syscall=syscall) from None
        seen = [0]

        def walk(dirfd: int, parts: list[str], depth: int):
            try:
                names = sorted(os.listdir(dirfd))
            except OSError:
                return
            for name in names:
                seen[0] += 1
                if seen[0] > max_entries:
                    out.truncated = True
                    return
                if stop is not None and seen[0] % 256 == 0 and stop.check(out, syscall):
                    return
                if per_level is not None and not per_level[depth].fullmatch(match.matchable(name)):
                    continue
                if self.is_hidden(base + parts, name):
                    continue
                try:
                    st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
                except OSError:
                    continue
                sub = parts + [name]
                if rx is None:
                    hit = depth + 1 == depth_cap
                else:
                    hit = bool(rx.fullmatch(match.matchable("/".join(sub))))
                if hit:
                    yield "/".join(base + sub), dirfd, name, st
                if (_stat.S_ISDIR(st.st_mode) and depth + 1 < depth_cap
                        and (name not in SKIP_DIRS or name in named)):
                    try:
                        child = os.open(name, _O_LISTDIR, dir_fd=dirfd)
                    except OSError:
                        continue
                    try:
                        yield from walk(child, sub, depth + 1)
                    finally:
                        os.close(child)
                    if out.truncated:
                        return

        try:
            yield from walk(fd, [], 0)
        finally:
            os.close(fd)


def _served(mode: int) -> bool:
    return _stat.S_ISREG(mode) or _stat.S_ISDIR(mode)


def _read_fd(fd: int, limit: int) -> tuple[bytes, bool]:
    chunks, left = [], max(0, limit)
    while left > 0:
        b = os.read(fd, min(left, 1 << 20))
        if not b:
            return b"".join(chunks), False
        chunks.append(b)
        left -= len(b)
    return b"".join(chunks), bool(os.read(fd, 1))


def _lines(f, cap: int) -> Iterator[bytes]:
    """Lines of a binary file; a line longer than ``cap`` bytes is cut, its rest skipped."""
    while True:
        raw = f.readline(cap)
        if not raw:
            return
        if len(raw) == cap and not raw.endswith(b"\n"):
            while True:
                more = f.readline(cap)
                if not more or more.endswith(b"\n"):
                    break
        yield raw


def _glob_regex(comps: list[str]) -> str:
    """Regex for a whole relative path from glob components (``**`` = any dirs)."""
    out = []
    for i, c in enumerate(comps):
        last = i == len(comps) - 1
        if c == "**":
            out.append(".*" if last else "(?:[^/]+/)*")
        else:
            body = _component_regex(c)
            out.append(body + ("" if last else "/"))
    return "(?s:" + "".join(out) + ")"


def _component_regex(c: str) -> str:
    """One glob component as an RE2 regex that never matches '/'."""
    i, n, res = 0, len(c), []
    while i < n:
        ch = c[i]
        i += 1
        if ch == "*":
            res.append("[^/]*")
        elif ch == "?":
            res.append("[^/]")
        elif ch == "[":
            j = i
            if j < n and c[j] in "!^":
                j += 1
            if j < n and c[j] == "]":
                j += 1
            while j < n and c[j] != "]":
                j += 1
            if j >= n:
                res.append("\\[")
            else:
                body = c[i:j].replace("\\", "\\\\")
                i = j + 1
                if body[:1] in ("!", "^"):
                    body = "^" + body[1:]
                res.append(f"[{body}]")
        else:
            res.append(re.escape(ch))
    return "".join(res)
