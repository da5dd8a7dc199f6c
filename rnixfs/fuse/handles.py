"""Open files of the mount: one class per kind of open.

Each handle forwards read/write/flush/release to what it was opened on
(a kernel snapshot, a spawn writer, a conversation, a real file…). The
cache flags it carries (direct_io, keep_cache, nonseekable) are the open
half of the cache policy (docs/architecture.md, "proc/ files and their
cache policy").
"""
from __future__ import annotations

import errno
import os
from typing import Callable

import pyfuse3
import trio

from ..kernel.errors import Code, SyscallError
from ..kernel.process import Process
from ..kernel.spawnwriter import SpawnWriter
from .signals import Waits

MAX_STEER_BYTES = 64 * 1024


def text(buf: bytes, what: str) -> str:
    try:
        return buf.decode("utf-8")
    except UnicodeDecodeError:
        raise SyscallError(Code.INVALID, f"{what} is not UTF-8") from None


class Handle:
    """An open file; subclasses answer what their kind supports (EBADF otherwise)."""

    direct_io = True
    keep_cache = False
    nonseekable = False
    uid = gid = caller = 0

    def opened_by(self, ctx) -> "Handle":
        """Record the opener (its uid counts its waiting reads; its pid is
        polled for signals)."""
        if ctx is not None:
            self.uid, self.gid, self.caller = ctx.uid, ctx.gid, ctx.pid
        else:
            self.uid, self.gid = os.getuid(), os.getgid()
        return self

    async def read(self, off: int, size: int) -> bytes:
        raise pyfuse3.FUSEError(errno.EBADF)

    async def write(self, off: int, buf: bytes) -> int:
        raise pyfuse3.FUSEError(errno.EBADF)

    async def flush(self) -> None:
        pass

    async def fsync(self, datasync: bool) -> None:
        pass

    async def release(self) -> None:
        pass


class DirHandle:
    """An open directory: listings are read afresh at each readdir, from the
    offset the kernel passes (a pid, a name's index)."""

    __slots__ = ("inode",)

    def __init__(self, inode: int):
        self.inode = inode


class BytesHandle(Handle):
    """Bytes taken at open: proc/<pid>/status, intent, result…, dev/mcp snapshots.
    ``cached``: the bytes never change, so the page cache may keep them."""

    def __init__(self, data: bytes, *, cached: bool = False):
        self.data = data
        self.direct_io = not cached
        self.keep_cache = cached

    async def read(self, off: int, size: int) -> bytes:
        return self.data[off:off + size]


class CtlHandle(BytesHandle):
    """proc/<pid>/ctl: one signal per write."""

    def __init__(self, data: bytes, kernel, pid: int):
        super().__init__(data)
        self.kernel, self.pid = kernel, pid

    async def write(self, off: int, buf: bytes) -> int:
        await self.kernel.signal(self.pid, text(buf, "command"))
        return len(buf)


class ContextHandle(BytesHandle):
    """proc/<pid>/context: readable snapshot; a write steers the agent."""

    def __init__(self, data: bytes, kernel, pid: int):
        super().__init__(data)
        self.kernel, self.pid = kernel, pid

    async def write(self, off: int, buf: bytes) -> int:
        if len(buf) > MAX_STEER_BYTES:
            raise SyscallError(Code.TOO_BIG, f"message is {len(buf)} bytes; the cap is "
                               f"{MAX_STEER_BYTES}", syscall="Steer", pid=self.pid)
        message = text(buf, "context text").strip()
        if not message:
            raise SyscallError(Code.INVALID, "empty message", syscall="Steer")
        await self.kernel.steer(self.pid, message)
        return len(buf)


class StreamHandle(Handle):
    """proc/<pid>/trace and events: the committed bytes so far (they grow)."""

    def __init__(self, proc: Process, name: str, *, cached: bool = False):
        self.buf = proc.trace if name == "trace" else proc.events
        self.direct_io = not cached
        self.keep_cache = cached

    async def read(self, off: int, size: int) -> bytes:
        return bytes(self.buf[off:off + size])


class WaitHandle(Handle):
    """proc/<pid>/wait: blocks until exit, then the exit line."""

    def __init__(self, proc: Process, waits: Waits, line: Callable[[], bytes], *, cached: bool = False):
        self.proc, self.waits, self.line = proc, waits, line
        self.direct_io = not cached
        self.keep_cache = cached

    async def read(self, off: int, size: int) -> bytes:
        proc = self.proc
        await self.waits.until(self.uid, self.caller, proc.exited_event.is_set, lambda: proc.exited_event)
        return self.line()[off:off + size]


class SpawnHandle(Handle):
    """proc/new: writes are spawn requests, reads the PIDs (kernel/spawnwriter.py)."""

    nonseekable = True

    def __init__(self, writer: SpawnWriter):
        self.writer = writer

    async def read(self, off: int, size: int) -> bytes:
        return await self.writer.read(size)

    async def write(self, off: int, buf: bytes) -> int:
        return await self.writer.feed(buf)

    async def flush(self) -> None:
        await self.writer.finish()


class ConversationHandle(Handle):
    """dev/llm/<provider> and dev/mcp/…/call: a write sends, reads stream the
    answer (waiting for it, interruptible)."""

    nonseekable = True

    def __init__(self, conv, waits: Waits):
        self.conv, self.waits = conv, waits

    async def read(self, off: int, size: int) -> bytes:
        conv = self.conv
        await self.waits.until(self.uid, self.caller, conv.ready, lambda: conv.changed)
        return conv.take(size)

    async def write(self, off: int, buf: bytes) -> int:
        self.conv.send(buf)
        return len(buf)

    async def release(self) -> None:
        self.conv.close()


class ShellHandle(Handle):
    """dev/shell: one shell session per open."""

    nonseekable = True

    def __init__(self, session, waits: Waits):
        self.session, self.waits = session, waits

    async def read(self, off: int, size: int) -> bytes:
        return await self.waits.interruptible(self.uid, self.caller, lambda: self.session.read(size))

    async def write(self, off: int, buf: bytes) -> int:
        return self.session.write(buf)

    async def release(self) -> None:
        with trio.CancelScope(shield=True):
            await self.session.aclose()


class McpCtlHandle(Handle):
    """dev/mcp/<server>/ctl: start | stop | restart."""

    nonseekable = True

    def __init__(self, devices, server: str):
        self.devices, self.server = devices, server

    async def write(self, off: int, buf: bytes) -> int:
        await self.devices.ctl(self.server, text(buf, "command"))
        return len(buf)


class RealFileHandle(Handle):
    """skills/, agents/, dev/fs: a real file's descriptor, opened confined.
    ``shared``: a hard-linked file may change through another name, so its
    pages are not kept."""

    direct_io = False

    def __init__(self, fd: int, ino: int, files, *, shared: bool = False):
        self.fd, self.ino = fd, ino
        self.files = files  # the fuse/realfiles.RealFiles it was opened in
        self.keep_cache = not shared

    async def read(self, off: int, size: int) -> bytes:
        return await trio.to_thread.run_sync(os.pread, self.fd, size, off)

    async def write(self, off: int, buf: bytes) -> int:
        n = await trio.to_thread.run_sync(os.pwrite, self.fd, buf, off)
        self.files.changed_after_write(self.ino)
        return n

    async def fsync(self, datasync: bool) -> None:
        await trio.to_thread.run_sync(os.fdatasync if datasync else os.fsync, self.fd)

    async def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
