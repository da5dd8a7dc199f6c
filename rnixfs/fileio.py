"""Reading a small file that someone else controls, safely."""
from __future__ import annotations

import os
import stat


class NotRegularFile(OSError):
    """A FIFO, device or directory where a regular file was expected."""


def read_regular(path: str | os.PathLike, cap: int, *, head: bool = False) -> tuple[bytes, int]:
    """Read at most ``cap + 1`` bytes of a regular file; returns (data, size).

    O_NONBLOCK so a FIFO planted in place of the file never hangs the
    reader; ``len(data) > cap`` tells the caller the file is too big (also
    when it grew after fstat). A file already larger than ``cap`` is not
    read at all, unless ``head`` asks for its first bytes anyway.
    Raises OSError, NotRegularFile.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    return _read_fd(fd, path, cap, head)


def read_config_text(path: str | os.PathLike, cap: int, error: type[Exception]) -> str | None:
    """A small UTF-8 config file (limits.yaml, mcp.yaml, .mcp.json): None when
    there is none; ``error`` with one readable line when it cannot be read, is
    larger than ``cap`` or is not UTF-8. A FIFO in its place never hangs us."""
    try:
        data, size = read_regular(path, cap)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > cap or size > cap:
        raise error(f"{path}: larger than {cap} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"{path}: not UTF-8") from None


class ScopeEscape(PermissionError):
    """A path that leads outside its scope root (by ``..``, a symlink, a swap)."""


def scope_rel(scope_root: str | os.PathLike, path: str | os.PathLike) -> str:
    """``path`` relative to ``scope_root``, lexically; ScopeEscape if it is not below it."""
    root = os.path.abspath(scope_root)
    full = os.path.abspath(path)
    rel = os.path.relpath(full, root)
    if rel == os.curdir:
        return ""
    if rel == os.pardir or rel.startswith(os.pardir + os.sep) or os.path.isabs(rel):
        raise ScopeEscape(13, f"{path} is not inside {scope_root}")
    return rel


def read_in_scope(scope_root: str | os.PathLike, path: str | os.PathLike, cap: int, *,
                  head: bool = False) -> tuple[bytes, int]:
    """``read_regular`` for a file below ``scope_root``, race-free.

    The path is walked from a directory fd of the scope root, one component
    at a time with ``O_NOFOLLOW`` (the dev/fs walker, rnixfs.devices.fs):
    symlinks are followed only while they stay inside the root, and a
    directory swapped for a symlink between two steps cannot lead out. See
    docs/skills.md. Raises ScopeEscape, FileNotFoundError, NotRegularFile,
    OSError.
    """
    from .devices.fs import FsError, Workspace

    rel = scope_rel(scope_root, path)
    try:
        with Workspace(scope_root) as ws:
            fd = ws.open(rel, os.O_RDONLY | os.O_NONBLOCK)
    except FsError as exc:
        raise _oserror(exc, path, scope_root) from None
    return _read_fd(fd, path, cap, head)


def confined_dir(scope_root: str | os.PathLike, directory: str | os.PathLike):
    """A Workspace (rnixfs.devices.fs) rooted at ``directory``, reached by the
    fd-relative walk from ``scope_root``: a skill directory that is (or is
    swapped for) a symlink leading out of its scope root is ScopeEscape, never
    a walker rooted outside. The caller closes it. Raises like ``read_in_scope``.
    """
    from .devices.fs import FsError, Workspace

    drel = scope_rel(scope_root, directory) or "."
    try:
        with Workspace(scope_root) as ws:
            dfd = ws.open(drel, os.O_RDONLY | os.O_DIRECTORY)
        try:
            # our own fd through /proc: the walker's root is exactly this directory
            return Workspace(f"/proc/self/fd/{dfd}")
        finally:
            os.close(dfd)
    except FsError as exc:
        raise _oserror(exc, directory, scope_root) from None


def read_below(scope_root: str | os.PathLike, directory: str | os.PathLike, rel: str, cap: int
               ) -> tuple[bytes, int]:
    """``read_regular`` for ``<directory>/<rel>``, confined twice: the
    directory is reached by the walk from ``scope_root`` (``confined_dir``),
    then ``rel`` is walked from it, so nothing outside ``directory`` is read
    (a skill's resources). Raises like ``read_in_scope``."""
    from .devices.fs import FsError

    with confined_dir(scope_root, directory) as inner:
        try:
            fd = inner.open(rel, os.O_RDONLY | os.O_NONBLOCK)
        except FsError as exc:
            raise _oserror(exc, os.path.join(directory, rel), directory) from None
    return _read_fd(fd, rel, cap, False)


def _oserror(exc, path, root) -> OSError:
    """The walker's refusal or failure as the OSError a file reader expects."""
    from .kernel.errors import Code

    if exc.code is Code.PERMISSION:
        return ScopeEscape(13, f"{path} leads outside {root} ({exc.cause})")
    if exc.errno in (2, 20):  # ENOENT, ENOTDIR
        return FileNotFoundError(exc.errno, f"{path}: no such file")
    if exc.code is Code.INVALID and exc.errno == 22:
        return NotRegularFile(f"{path} is not a regular file")
    return OSError(exc.errno, f"{path}: {exc.cause}")


def _read_fd(fd: int, path, cap: int, head: bool) -> tuple[bytes, int]:
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(f"{path} is not a regular file")
        data = b""
        if st.st_size > cap and not head:
            return data, st.st_size
        while len(data) <= cap:
            chunk = os.read(fd, min(1 << 16, cap + 1 - len(data)))
            if not chunk:
                break
            data += chunk
        return data, st.st_size
    finally:
        os.close(fd)
