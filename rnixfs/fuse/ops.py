"""The FUSE protocol adapter: inodes, handles, errnos and cache policy.

No agent logic lives here (docs/architecture.md): every request is translated into
a kernel or device call, and every SyscallError into its errno.
"""
from __future__ import annotations

import bisect
import errno
import itertools
import json
import logging
import os
import stat
import time
from typing import Callable

import pyfuse3
import trio

from ..devices.llm.conversation import Conversation
from ..devices.mcp.device import ToolCall, tool_for_file
from ..kernel import request as spawn_request
from ..kernel.errors import Code, SyscallError
from ..kernel.process import Process
from . import inodes
from .mcptree import McpTree
from .passthrough import Passthrough, Tree, pread, pwrite
from .workspace import WS_BASE, WorkspaceFS
from .signals import POLL_INTERVAL, reader_interrupted

log = logging.getLogger(__name__)

# Cache policy (README.md, "Cache policy"), in seconds.
STATIC_TIMEOUT = 60.0  # fixed directories and immutable files
ENTRY_TIMEOUT = 1.0  # names that can disappear (reaped processes)
SNAPSHOT_TIMEOUT = 0.5  # status/context: size is a hint, reads are direct_io
LIVE_TIMEOUT = 0.0  # trace/events/wait: the size must be fresh for tail -f

WRITABLE = {inodes.K["ctl"], inodes.K["context"]}
SNAPSHOT = {inodes.K["status"], inodes.K["intent"], inodes.K["context"], inodes.K["ctl"], inodes.K["result"], inodes.K["plan"]}
CTL_HELP = b"term kill killtree pause resume reap\n"
# proc/new, dev/llm/*, dev/shell run things as the daemon's user: only that
# user may open them (default_permissions enforces it, even with allow_other)
WRITE_MODE = 0o600
# A process's files belong to the uid that spawned it and only it may read
# them (root excepted): with allow_other, other users see pids, not agents.
PROC_DIR_MODE = 0o500
PROC_FILE_MODE = 0o400
PROC_WRITE_MODE = 0o600
MAX_STEER_BYTES = 64 * 1024
XATTR_DAEMON = b"user.rnixfs.daemon"
TREE_INODES = {"skills": inodes.SKILLS, "agents": inodes.AGENTS}


class Handle:
    __slots__ = ("kind", "proc", "k", "data", "caller", "out", "cursor", "conv", "pending", "fd", "ino",
                 "ppid", "uid", "gid")

    def __init__(self, kind: str, *, proc: Process | None = None, k: int = 0,
                 data: bytes = b"", caller: int = 0, conv: Conversation | None = None):
        self.kind = kind
        self.proc = proc
        self.k = k
        self.data = data
        self.caller = caller
        self.out = bytearray()
        self.cursor = 0
        self.conv = conv
        self.pending = bytearray()  # proc/new: bytes of a request not yet complete
        self.fd = -1  # skills/, agents/: the real file's descriptor
        self.ino = 0
        self.ppid = 0  # proc/new: the agent whose Bash command opened it
        self.uid, self.gid = os.getuid(), os.getgid()  # the opener (set from ctx)


# A refused request is the caller's business (it gets the errno and the reason
# in the file or trace): INFO. Only the daemon's own failures are warnings.
_DAEMON_FAULTS = (Code.INTERNAL, Code.NO_SPACE, Code.READ_ONLY)


def fuse_error(exc: SyscallError) -> pyfuse3.FUSEError:
    log.log(logging.WARNING if exc.code in _DAEMON_FAULTS else logging.INFO, "%s", exc)
    return pyfuse3.FUSEError(exc.errno)


class Operations(pyfuse3.Operations):
    supports_dot_lookup = False
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, kernel, providers, nursery: trio.Nursery, *,
                 daemon_info: Callable[[], dict], max_blocking: int,
                 trees: dict[str, Tree] | None = None, workspace=None,
                 shell_session: Callable[[], object] | None = None, mcp=None):
        super().__init__()
        self.mcp = McpTree(mcp, self._attr) if mcp is not None else None
        self.trees = {name: tree for name, tree in (trees or {}).items() if name in TREE_INODES}
        self.pt = Passthrough({TREE_INODES[n]: (n, t) for n, t in self.trees.items()}, self._attr)
        self.wsfs = WorkspaceFS(workspace, self._attr) if workspace is not None else None
        self.shell_session = shell_session
        self.kernel = kernel
        self.providers = providers
        self.nursery = nursery
        self.daemon_info = daemon_info
        self.llm_names = sorted(providers.names())[: inodes.LLM_MAX]
        self._fh = itertools.count(1)
        self.handles: dict[int, Handle] = {}
        self._waits: set[trio.CancelScope] = set()
        self.uid, self.gid = os.getuid(), os.getgid()
        self.slots = BlockingSlots(max_blocking, owner=self.uid)
        self.owners: dict[int, tuple[int, int]] = {}  # pid -> (uid, gid) of its spawner
        self.mounted_ns = time.time_ns()

    # -- attributes ----------------------------------------------------------------
    def _attr(self, ino: int, mode: int, *, size: int = 0, timeout: float = STATIC_TIMEOUT,
              entry_timeout: float | None = None, ns: int | None = None,
              owner: tuple[int, int] | None = None) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.st_mode = mode
        a.st_nlink = 2 if stat.S_ISDIR(mode) else 1
        a.st_size = size
        a.st_uid, a.st_gid = owner or (self.uid, self.gid)
        a.st_blksize = spawn_request.WRITE_BLOCK
        a.st_blocks = (size + 511) // 512
        t = self.mounted_ns if ns is None else ns
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = t
        a.attr_timeout = timeout
        a.entry_timeout = timeout if entry_timeout is None else entry_timeout
        return a

    def _real(self, inode: int):
        """The backend of a real-file inode (skills/, agents/, dev/fs), or None."""
        if self.pt.owns(inode):
            return self.pt
        if self.wsfs is not None and self.wsfs.owns(inode):
            return self.wsfs
        return None

    def _unlinked_attr(self, inode: int) -> pyfuse3.EntryAttributes | None:
        """fstat of a dev/fs file removed while still open (its name is gone,
        its open descriptor is not: a temp file's usual life)."""
        if self.wsfs is None or inode < WS_BASE:
            return None
        for h in self.handles.values():
            if h.kind == "real" and h.ino == inode and h.fd >= 0:
                return self.wsfs.from_fd(inode, h.fd)
        return None

    def _proc(self, pid: int) -> Process:
        proc = self.kernel.table.get(pid)
        if proc is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return proc

    def owner(self, proc: Process) -> tuple[int, int]:
        """(uid, gid) of whoever spawned ``proc``: recorded at proc/new, else
        its parent's (an agent's child), else the daemon's."""
        found = self.owners.get(proc.pid)
        if found is None:
            parent = self.kernel.table.get(proc.ppid) if proc.ppid else None
            found = self.owner(parent) if parent is not None else (self.uid, self.gid)
            self.owners[proc.pid] = found
        return found

    def _record_owner(self, pid: int, owner: tuple[int, int]) -> None:
        if len(self.owners) > 2 * len(self.kernel.table) + 64:  # forget reaped ones
            self.owners = {p: o for p, o in self.owners.items() if p in self.kernel.table}
        self.owners[pid] = owner

    def _proc_attr(self, proc: Process, k: int) -> pyfuse3.EntryAttributes:
        ino = inodes.pid_ino(proc.pid, k)
        created = int(proc.created * 1e9)
        owner = self.owner(proc)
        if k in (inodes.K_DIR, inodes.K["fd"]):
            return self._attr(ino, stat.S_IFDIR | PROC_DIR_MODE, timeout=ENTRY_TIMEOUT, ns=created,
                              owner=owner)
        file_mode = stat.S_IFREG | PROC_FILE_MODE
        if k == inodes.K["intent"]:
            return self._attr(ino, file_mode, size=len(proc.intent.encode()) + 1,
                              timeout=STATIC_TIMEOUT, entry_timeout=ENTRY_TIMEOUT, ns=created, owner=owner)
        if k == inodes.K["result"] and not proc.alive:
            ns = int((proc.exited or proc.created) * 1e9)
            return self._attr(ino, file_mode, size=len(self._render(proc, k)),
                              timeout=STATIC_TIMEOUT, entry_timeout=ENTRY_TIMEOUT, ns=ns, owner=owner)
        if k == inodes.K["trace"]:
            return self._attr(ino, file_mode, size=len(proc.trace),
                              timeout=LIVE_TIMEOUT, entry_timeout=ENTRY_TIMEOUT, ns=time.time_ns(), owner=owner)
        if k == inodes.K["events"]:
            return self._attr(ino, file_mode, size=len(proc.events),
                              timeout=LIVE_TIMEOUT, entry_timeout=ENTRY_TIMEOUT, ns=time.time_ns(), owner=owner)
        if k == inodes.K["wait"]:
            size = 0 if proc.alive else len(proc.wait_line())
            return self._attr(ino, file_mode, size=size,
                              timeout=LIVE_TIMEOUT, entry_timeout=ENTRY_TIMEOUT, ns=time.time_ns(), owner=owner)
        mode = PROC_WRITE_MODE if k in WRITABLE else PROC_FILE_MODE
        return self._attr(ino, stat.S_IFREG | mode, size=len(self._render(proc, k)),
                          timeout=SNAPSHOT_TIMEOUT, entry_timeout=ENTRY_TIMEOUT, ns=time.time_ns(), owner=owner)

    def _render(self, proc: Process, k: int) -> bytes:
        if k == inodes.K["status"]:
            return (json.dumps(proc.status(), indent=2, ensure_ascii=False) + "\n").encode()
        if k == inodes.K["intent"]:
            return (proc.intent + "\n").encode()
        if k == inodes.K["context"]:
            lines = [json.dumps(m, ensure_ascii=False) for m in proc.messages]
            lines += [json.dumps({"role": "user", "content": t, "pending": True}, ensure_ascii=False)
                      for t in proc.pending_input]
            return ("\n".join(lines) + "\n").encode() if lines else b""
        if k == inodes.K["ctl"]:
            return CTL_HELP
        if k == inodes.K["result"]:
            if proc.alive or proc.result is None:
                return b""
            return proc.result.encode() + (b"" if proc.result.endswith("\n") else b"\n")
        if k == inodes.K["plan"]:  # agent.yaml planning: true; empty until the plan step answered
            if not proc.plan:
                return b""
            return proc.plan.encode() + (b"" if proc.plan.endswith("\n") else b"\n")
        raise pyfuse3.FUSEError(errno.EIO)

    async def getattr(self, inode, ctx=None):
        if (real := self._real(inode)) is not None:
            try:
                return real.getattr(inode)
            except pyfuse3.FUSEError as exc:
                if exc.errno != errno.ENOENT or (attr := self._unlinked_attr(inode)) is None:
                    raise
                return attr
        if (attr := self._unlinked_attr(inode)) is not None:
            return attr
        if self.mcp is not None and self.mcp.owns(inode):
            return await self.mcp.getattr(inode)
        kind, a, b = inodes.decode(inode)
        if kind == "pid":
            return self._proc_attr(self._proc(a), b)
        if kind == "fd":
            proc = self._proc(a)
            if b not in proc.fds:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self._attr(inode, stat.S_IFLNK | 0o777, size=len(proc.fds[b]),
                              timeout=LIVE_TIMEOUT, entry_timeout=LIVE_TIMEOUT, owner=self.owner(proc))
        if kind == "llm":
            if a >= len(self.llm_names):
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self._attr(inode, stat.S_IFREG | WRITE_MODE)
        if inode in (inodes.ROOT, inodes.PROC, inodes.DEV, inodes.DEV_LLM):
            timeout = ENTRY_TIMEOUT if inode == inodes.PROC else STATIC_TIMEOUT
            return self._attr(inode, stat.S_IFDIR | 0o555, timeout=timeout)
        if inode == inodes.PROC_NEW or (inode == inodes.DEV_SHELL and self.shell_session is not None):
            return self._attr(inode, stat.S_IFREG | WRITE_MODE)
        if inode == inodes.PROC_SELF:
            return self._self_attr(ctx)
        raise pyfuse3.FUSEError(errno.ENOENT)

    async def setattr(self, inode, attr, fields, fh, ctx):
        if (real := self._real(inode)) is not None:
            return real.setattr(inode, attr, fields)
        if self.mcp is not None and self.mcp.owns(inode):
            got = await self.mcp.getattr(inode)
            if (fields.update_size and attr.st_size != 0) or not got.st_mode & stat.S_IWUSR:
                raise pyfuse3.FUSEError(errno.EACCES if not got.st_mode & stat.S_IWUSR else errno.EINVAL)
            return got
        # `echo x > file` truncates first: accept it on the append-only files.
        if fields.update_size and attr.st_size != 0:
            raise pyfuse3.FUSEError(errno.EINVAL)
        kind, a, b = inodes.decode(inode)
        if inode in (inodes.PROC_NEW, inodes.DEV_SHELL) or kind == "llm" or (kind == "pid" and b in WRITABLE):
            return await self.getattr(inode, ctx)
        raise pyfuse3.FUSEError(errno.EACCES)

    # -- names ---------------------------------------------------------------------
    def _children(self, inode: int) -> dict[bytes, int] | None:
        if inode == inodes.ROOT:
            tops = {b"proc": inodes.PROC, b"dev": inodes.DEV}
            tops.update({n.encode(): TREE_INODES[n] for n in self.trees})
            return tops
        if inode == inodes.DEV:
            devs = {b"llm": inodes.DEV_LLM}
            if self.wsfs is not None:
                devs[b"fs"] = inodes.DEV_FS
            if self.shell_session is not None:
                devs[b"shell"] = inodes.DEV_SHELL
            if self.mcp is not None:
                devs[b"mcp"] = inodes.DEV_MCP
            return devs
        if inode == inodes.DEV_LLM:
            return {n.encode(): inodes.LLM_BASE + i for i, n in enumerate(self.llm_names)}
        return None

    async def lookup(self, parent_inode, name, ctx=None):
        if (real := self._real(parent_inode)) is not None:
            return real.lookup(parent_inode, name)
        if self.mcp is not None and self.mcp.owns(parent_inode):
            return await self.mcp.lookup(parent_inode, name)
        kind, a, b = inodes.decode(parent_inode)
        if parent_inode == inodes.PROC:
            if name == b"new":
                return await self.getattr(inodes.PROC_NEW)
            if name == b"self":
                return self._self_attr(ctx)
            if name.isdigit() and not name.startswith(b"0"):
                proc = self._proc(int(name))
                return self._proc_attr(proc, inodes.K_DIR)
            raise pyfuse3.FUSEError(errno.ENOENT)
        if kind == "pid" and b == inodes.K_DIR:
            k = inodes.K.get(name.decode("utf-8", "replace"))
            if k is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self._proc_attr(self._proc(a), k)
        if kind == "pid" and b == inodes.K["fd"]:
            if name.isdigit() and int(name) in self._proc(a).fds:
                return await self.getattr(inodes.fd_ino(a, int(name)))
            raise pyfuse3.FUSEError(errno.ENOENT)
        children = self._children(parent_inode)
        if children is None:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        if name not in children:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return await self.getattr(children[name])

    def _self_attr(self, ctx) -> pyfuse3.EntryAttributes:
        """proc/self: the calling agent (found from the caller's host pid)."""
        pid = self.kernel.agent_of(ctx.pid) if ctx is not None else None
        if pid is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attr(inodes.PROC_SELF, stat.S_IFLNK | 0o777, size=len(str(pid)), timeout=LIVE_TIMEOUT)

    async def readlink(self, inode, ctx):
        if (real := self._real(inode)) is not None:
            return real.readlink(inode)
        if inode == inodes.PROC_SELF:
            pid = self.kernel.agent_of(ctx.pid)
            if pid is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return str(pid).encode()
        kind, pid, fd = inodes.decode(inode)
        if kind != "fd":
            raise pyfuse3.FUSEError(errno.EINVAL)
        device = self._proc(pid).fds.get(fd)
        if device is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return device.encode()

    async def opendir(self, inode, ctx):
        if (real := self._real(inode)) is not None:
            if not stat.S_ISDIR(real.getattr(inode).st_mode):
                raise pyfuse3.FUSEError(errno.ENOTDIR)
            return inode
        if self.mcp is not None and self.mcp.owns(inode):
            if not await self.mcp.is_dir(inode):
                raise pyfuse3.FUSEError(errno.ENOTDIR)
            return inode
        kind, a, b = inodes.decode(inode)
        if kind == "pid":
            self._proc(a)
            if b not in (inodes.K_DIR, inodes.K["fd"]):
                raise pyfuse3.FUSEError(errno.ENOTDIR)
        elif inode != inodes.PROC and self._children(inode) is None:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return inode

    async def readdir(self, fh, start_id, token):
        inode = fh
        if (real := self._real(inode)) is not None:
            return real.readdir(inode, start_id, token)
        if self.mcp is not None and self.mcp.owns(inode):
            return await self.mcp.readdir(inode, start_id, token)
        kind, a, b = inodes.decode(inode)
        if inode == inodes.PROC:
            return self._readdir_proc(start_id, token)
        if kind == "pid" and b == inodes.K_DIR:
            proc = self._proc(a)
            names = list(inodes.PROC_FILES)
            for i in range(start_id, len(names)):
                if not pyfuse3.readdir_reply(token, names[i].encode(),
                                             self._proc_attr(proc, inodes.K[names[i]]), i + 1):
                    return
            return
        if kind == "pid":
            proc = self._proc(a)
            for fd in sorted(proc.fds):
                if fd < start_id:
                    continue
                attr = await self.getattr(inodes.fd_ino(a, fd))
                if not pyfuse3.readdir_reply(token, str(fd).encode(), attr, fd + 1):
                    return
            return
        entries = list(self._children(inode).items())
        for i in range(start_id, len(entries)):
            name, ino = entries[i]
            if not pyfuse3.readdir_reply(token, name, await self.getattr(ino), i + 1):
                return

    def _readdir_proc(self, start_id: int, token) -> None:
        if start_id == 0:
            if not pyfuse3.readdir_reply(token, b"new", self._attr(inodes.PROC_NEW, stat.S_IFREG | WRITE_MODE), 1):
                return
            start_id = 1
        pids = self.kernel.pids()
        table = self.kernel.table
        for i in range(bisect.bisect_left(pids, start_id), len(pids)):
            pid = pids[i]
            proc = table.get(pid)
            if proc is None:
                continue
            if not pyfuse3.readdir_reply(token, str(pid).encode(), self._proc_attr(proc, inodes.K_DIR), pid + 1):
                return

    # -- open / read / write ---------------------------------------------------------------
    def _new_handle(self, handle: Handle, *, direct_io=True, keep_cache=False, nonseekable=False):
        fh = next(self._fh)
        self.handles[fh] = handle
        return pyfuse3.FileInfo(fh=fh, direct_io=direct_io, keep_cache=keep_cache, nonseekable=nonseekable)

    async def open(self, inode, flags, ctx):
        if (real := self._real(inode)) is not None:
            h = Handle("real")
            h.fd, h.ino = real.open(inode, flags), inode
            # a hard-linked file may have changed through another name: no stale pages
            shared = real is self.wsfs and os.fstat(h.fd).st_nlink > 1
            return self._new_handle(h, direct_io=False, keep_cache=not shared)
        if self.mcp is not None and self.mcp.owns(inode):
            return await self._open_mcp(inode, flags, ctx)
        if inode == inodes.DEV_SHELL and self.shell_session is not None:
            h = _opened(Handle("shell", caller=ctx.pid), ctx)
            h.conv = self.shell_session()
            return self._new_handle(h, nonseekable=True)
        kind, a, b = inodes.decode(inode)
        writing = (flags & os.O_ACCMODE) != os.O_RDONLY
        if inode == inodes.PROC_NEW:
            h = _opened(Handle("new", caller=ctx.pid), ctx)
            h.ppid = self.kernel.agent_of(ctx.pid) or 0
            return self._new_handle(h, nonseekable=True)
        if kind == "llm":
            if a >= len(self.llm_names):
                raise pyfuse3.FUSEError(errno.ENOENT)
            name = self.llm_names[a]
            conv = Conversation(self.providers.get(name), self.nursery, f"/dev/llm/{name}")
            return self._new_handle(_opened(Handle("llm", caller=ctx.pid, conv=conv), ctx), nonseekable=True)
        if kind != "pid" or b in (inodes.K_DIR, inodes.K["fd"]):
            raise pyfuse3.FUSEError(errno.EISDIR if kind != "fd" else errno.ELOOP)
        proc = self._proc(a)
        if writing and b not in WRITABLE:
            raise pyfuse3.FUSEError(errno.EACCES)
        if b in SNAPSHOT:
            data = b"" if writing else self._render(proc, b)
            cached = b == inodes.K["intent"] or (b == inodes.K["result"] and not proc.alive)
            return self._new_handle(Handle("file", proc=proc, k=b, data=data),
                                    direct_io=not cached, keep_cache=cached)
        kind = "wait" if b == inodes.K["wait"] else "stream"
        return self._new_handle(_opened(Handle(kind, proc=proc, k=b, caller=ctx.pid), ctx))

    async def _open_mcp(self, inode: int, flags: int, ctx):
        """dev/mcp files: snapshots (status, schema, resources, prompts), the
        ctl file, and per-open tool calls."""
        attr = await self.mcp.getattr(inode)
        if stat.S_ISDIR(attr.st_mode):
            raise pyfuse3.FUSEError(errno.EISDIR)
        parts = self.mcp.where(inode)
        writing = (flags & os.O_ACCMODE) != os.O_RDONLY
        if writing and not attr.st_mode & stat.S_IWUSR:
            raise pyfuse3.FUSEError(errno.EACCES)
        if parts[1] == "ctl":
            return self._new_handle(_opened(Handle("mcpctl", data=parts[0].encode()), ctx), nonseekable=True)
        if parts[1] == "tools" and parts[3] == "call":
            server = self.mcp.devices.get(parts[0])
            call = ToolCall(server, tool_for_file(server, parts[2]), self.nursery)
            return self._new_handle(_opened(Handle("call", caller=ctx.pid, conv=call), ctx), nonseekable=True)
        h = _opened(Handle("file", caller=ctx.pid), ctx)
        h.data = await self._interruptible(h, lambda: self.mcp.snapshot(parts))
        return self._new_handle(h)

    async def _block_until(self, handle: Handle, ready: Callable[[], bool],
                           changed: Callable[[], trio.Event]) -> None:
        """Wait until ``ready()``; EINTR as soon as the caller has a signal."""
        if ready():
            return

        async def until_ready():
            while not ready():
                await changed().wait()
            return True

        await self._interruptible(handle, until_ready)

    async def _interruptible(self, handle: Handle, work):
        """Run a read that may wait, in a cancel scope watched every
        POLL_INTERVAL for a signal to the reader (and cancelled by
        ``interrupt_all`` at shutdown): then it is EINTR."""
        if not self.slots.acquire(handle.uid):
            raise pyfuse3.FUSEError(errno.EAGAIN)
        outcome: dict = {}
        scope = trio.CancelScope()
        self._waits.add(scope)
        try:
            with scope:
                async with trio.open_nursery() as nursery:
                    async def watch():
                        while not reader_interrupted(handle.caller):
                            await trio.sleep(POLL_INTERVAL)
                        scope.cancel()

                    async def run():
                        try:
                            outcome["value"] = await work()
                        except Exception as exc:  # re-raised below, outside the nursery
                            outcome["error"] = exc
                        nursery.cancel_scope.cancel()

                    nursery.start_soon(watch)
                    nursery.start_soon(run)
        finally:
            self._waits.discard(scope)
            self.slots.release(handle.uid)
        if "error" in outcome:
            raise outcome["error"]
        if "value" in outcome:
            return outcome["value"]
        raise pyfuse3.FUSEError(errno.EINTR)

    def interrupt_all(self) -> None:
        """Shutdown: every waiting read answers EINTR now, so the FUSE loop
        can end (it waits for its handlers)."""
        for scope in list(self._waits):
            scope.cancel()

    async def read(self, fh, off, size):
        h = self.handles.get(fh)
        if h is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        if h.kind == "file":
            return h.data[off:off + size]
        if h.kind == "real":
            try:
                return await pread(h.fd, size, off)
            except OSError as exc:
                raise pyfuse3.FUSEError(exc.errno) from None
        if h.kind == "stream":
            buf = h.proc.trace if h.k == inodes.K["trace"] else h.proc.events
            return bytes(buf[off:off + size])
        if h.kind == "wait":
            proc = h.proc
            await self._block_until(h, lambda: proc.exited_event.is_set(), lambda: proc.exited_event)
            return proc.wait_line().encode()[off:off + size]
        if h.kind == "new":
            if h.pending:
                try:
                    await self._complete(h)
                except SyscallError as exc:
                    log.warning("%s", exc)  # the reason is the next line read
            data = bytes(h.out[h.cursor:h.cursor + size])
            h.cursor += len(data)
            return data
        if h.kind == "shell":
            try:
                return await self._interruptible(h, lambda: h.conv.read(size))
            except SyscallError as exc:
                raise fuse_error(exc) from None
        if h.kind in ("llm", "call"):
            conv = h.conv
            await self._block_until(h, conv.ready, lambda: conv.changed)
            try:
                return conv.take(size)
            except SyscallError as exc:
                raise fuse_error(exc) from None
        raise pyfuse3.FUSEError(errno.EBADF)

    async def write(self, fh, off, buf):
        h = self.handles.get(fh)
        if h is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        if h.kind == "real":
            try:
                n = await pwrite(h.fd, buf, off)
            except OSError as exc:
                raise pyfuse3.FUSEError(exc.errno) from None
            if self.pt.owns(h.ino):
                self.pt.changed_after_write(h.ino)
            return n
        try:
            if h.kind == "shell":
                return h.conv.write(buf)
            if h.kind == "new":
                return await self._spawn_write(h, buf)
            if h.kind in ("llm", "call"):
                h.conv.send(buf)
                return len(buf)
            if h.kind == "mcpctl":
                await self.mcp.devices.ctl(h.data.decode(), _text(buf, "command"))
                return len(buf)
            if h.kind == "file" and h.k == inodes.K["ctl"]:
                await self.kernel.signal(h.proc.pid, _text(buf, "command"))
                return len(buf)
            if h.kind == "file" and h.k == inodes.K["context"]:
                if len(buf) > MAX_STEER_BYTES:
                    raise SyscallError(Code.TOO_BIG, f"message is {len(buf)} bytes; the cap is "
                                       f"{MAX_STEER_BYTES}", syscall="Steer", pid=h.proc.pid)
                text = _text(buf, "context text").strip()
                if not text:
                    raise SyscallError(Code.INVALID, "empty message", syscall="Steer")
                await self.kernel.steer(h.proc.pid, text)
                return len(buf)
        except SyscallError as exc:
            raise fuse_error(exc) from None
        raise pyfuse3.FUSEError(errno.EBADF)

    async def _spawn_write(self, h: Handle, buf: bytes) -> int:
        h.pending += buf
        if len(h.pending) > spawn_request.MAX_REQUEST_BYTES:
            size = len(h.pending)
            h.pending.clear()
            reason = f"request is {size} bytes; the cap is {spawn_request.MAX_REQUEST_BYTES}"
            if size > len(buf):
                reason = f"request is over {size} bytes; the cap is {spawn_request.MAX_REQUEST_BYTES}"
            h.out += f"error: {reason}\n".encode()
            raise SyscallError(Code.TOO_BIG, reason, syscall="Spawn", device="/proc/new")
        framing = spawn_request.framing(bytes(h.pending), len(buf))
        if framing == "now":
            await self._complete(h)
        elif framing == "later":
            await self._check_early(h)
        return len(buf)

    async def _check_early(self, h: Handle) -> None:
        """A YAML request waits for its last line, but what is already wrong
        fails this write (a missing intent may still come)."""
        try:
            req = spawn_request.parse(bytes(h.pending))
        except SyscallError as exc:
            h.pending.clear()
            h.out += f"error: {exc.cause}\n".encode()
            raise
        if req.intent == bytes(h.pending).decode().strip():
            return  # no "intent" yet: plain text so far
        try:
            await trio.to_thread.run_sync(self.kernel.check, req)
        except SyscallError as exc:
            h.pending.clear()
            h.out += f"error: {exc.cause}\n".encode()
            raise

    async def _complete(self, h: Handle) -> None:
        """Spawn from the pending bytes; one line back per request."""
        data = bytes(h.pending)
        h.pending.clear()
        try:
            proc = await self.kernel.spawn(spawn_request.parse(data), ppid=h.ppid)
        except SyscallError as exc:
            h.out += f"error: {exc.cause}\n".encode()
            raise
        parent = self.kernel.table.get(h.ppid) if h.ppid else None
        self._record_owner(proc.pid, self.owner(parent) if parent is not None else (h.uid, h.gid))
        h.out += f"{proc.pid}\n".encode()

    async def flush(self, fh):
        h = self.handles.get(fh)
        if h is not None and h.kind == "new" and h.pending:
            try:
                await self._complete(h)
            except SyscallError as exc:
                raise fuse_error(exc) from None

    # Names under proc/ and dev/ are the kernel's: nothing is created, removed
    # or renamed there. skills/ and agents/ are real files.
    async def _refuse(self, *args, **kwargs):
        raise pyfuse3.FUSEError(errno.EACCES)

    async def symlink(self, parent_inode, name, target, ctx):
        if self.pt.owns(parent_inode):
            return self.pt.symlink(parent_inode, name, target)
        if self.wsfs is None or not self.wsfs.owns(parent_inode):
            raise pyfuse3.FUSEError(errno.EACCES)
        return self.wsfs.symlink(parent_inode, name, target, ctx)

    async def link(self, inode, new_parent_inode, new_name, ctx):
        if self.wsfs is None or not self.wsfs.owns(new_parent_inode):
            raise pyfuse3.FUSEError(errno.EACCES)
        if not self.wsfs.owns(inode):
            raise pyfuse3.FUSEError(errno.EXDEV)
        entry = self.wsfs.link(inode, new_parent_inode, new_name)
        # the old name's cached attributes (nlink, and soon size) are now stale;
        # told after this reply, outside the request that holds the inode
        self.nursery.start_soon(self._invalidate_attr, inode)
        return entry

    async def _invalidate_attr(self, inode: int) -> None:
        try:
            await trio.to_thread.run_sync(pyfuse3.invalidate_inode, inode, True)
        except OSError:  # forgotten meanwhile: nothing to refresh
            pass

    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        if self.wsfs is None or not self.wsfs.owns(parent_inode):
            raise pyfuse3.FUSEError(errno.EACCES)
        return self.wsfs.mknod(parent_inode, name, mode, ctx)

    async def create(self, parent_inode, name, mode, flags, ctx):
        if (real := self._real(parent_inode)) is None:
            raise pyfuse3.FUSEError(errno.EACCES)
        fd, attr = (real.create(parent_inode, name, mode, flags, ctx) if real is self.wsfs
                    else real.create(parent_inode, name, mode, flags))
        h = Handle("real")
        h.fd, h.ino = fd, attr.st_ino
        return self._new_handle(h, direct_io=False, keep_cache=True), attr

    async def mkdir(self, parent_inode, name, mode, ctx):
        if (real := self._real(parent_inode)) is None:
            raise pyfuse3.FUSEError(errno.EACCES)
        if real is self.wsfs:
            return real.mkdir(parent_inode, name, mode, ctx)
        return real.mkdir(parent_inode, name, mode)

    async def unlink(self, parent_inode, name, ctx):
        if (real := self._real(parent_inode)) is None:
            raise pyfuse3.FUSEError(errno.EACCES)
        real.unlink(parent_inode, name, directory=False)

    async def rmdir(self, parent_inode, name, ctx):
        if (real := self._real(parent_inode)) is None:
            raise pyfuse3.FUSEError(errno.EACCES)
        real.unlink(parent_inode, name, directory=True)

    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        a, b = self._real(parent_inode_old), self._real(parent_inode_new)
        if a is None or b is None:
            raise pyfuse3.FUSEError(errno.EACCES)
        if a is not b:
            raise pyfuse3.FUSEError(errno.EXDEV)
        a.rename(parent_inode_old, name_old, parent_inode_new, name_new, flags)

    async def fsync(self, fh, datasync):
        h = self.handles.get(fh)
        if h is not None and h.kind == "real":
            await trio.to_thread.run_sync(os.fdatasync if datasync else os.fsync, h.fd)

    async def release(self, fh):
        h = self.handles.pop(fh, None)
        if h is not None and h.kind == "shell":
            with trio.CancelScope(shield=True):
                await h.conv.aclose()
        elif h is not None and h.conv is not None:
            h.conv.close()
        if h is not None and h.fd >= 0:
            os.close(h.fd)

    async def releasedir(self, fh):
        pass

    async def forget(self, inode_list):
        # proc/ and dev/ numbers are computed; real files' numbers are counted
        for inode, count in inode_list:
            if (real := self._real(inode)) is not None:
                real.forget(inode, count)
            elif self.mcp is not None and self.mcp.owns(inode):
                self.mcp.forget(inode, count)

    # -- xattrs and statfs --------------------------------------------------------------
    async def getxattr(self, inode, name, ctx):
        if inode == inodes.ROOT and name == XATTR_DAEMON:
            return json.dumps(self.daemon_info()).encode()
        if self.pt.owns(inode):
            value = self.pt.xattrs(inode).get(os.fsdecode(name))
            if value is not None:
                return value
        raise pyfuse3.FUSEError(pyfuse3.ENOATTR)

    async def listxattr(self, inode, ctx):
        if inode == inodes.ROOT:
            return [XATTR_DAEMON]
        if self.pt.owns(inode):
            return [os.fsencode(k) for k in self.pt.xattrs(inode)]
        return []

    async def statfs(self, ctx):
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 4096
        s.f_namemax = 255
        s.f_files = len(self.kernel.table) + 16
        return s


def _opened(h: Handle, ctx) -> Handle:
    h.uid, h.gid = ctx.uid, ctx.gid
    return h


class BlockingSlots:
    """Reads that wait hold one of ``total`` slots, counted per uid so one
    user cannot take another's: the daemon's own user may use all but a
    quarter, which is kept for other users (each at most a quarter of it)."""

    def __init__(self, total: int, *, owner: int):
        self.total, self.owner = total, owner
        self.others_cap = total // 4
        self.per_other = max(1, self.others_cap // 4) if self.others_cap else 0
        self.held: dict[int, int] = {}
        self.others = 0
        self.mine = 0

    def acquire(self, uid: int) -> bool:
        if uid == self.owner:
            if self.mine >= self.total - self.others_cap:
                return False
            self.mine += 1
            return True
        if self.others >= self.others_cap or self.held.get(uid, 0) >= self.per_other:
            return False
        self.others += 1
        self.held[uid] = self.held.get(uid, 0) + 1
        return True

    def release(self, uid: int) -> None:
        if uid == self.owner:
            self.mine -= 1
            return
        self.others -= 1
        self.held[uid] -= 1
        if not self.held[uid]:
            del self.held[uid]


def _text(buf: bytes, what: str) -> str:
    try:
        return buf.decode("utf-8")
    except UnicodeDecodeError:
        raise SyscallError(Code.INVALID, f"{what} is not UTF-8") from None


def _guarded(name: str, fn):
    """pyfuse3 ends its main loop on any exception but FUSEError: one bad
    request must never unmount everyone, so map what leaks to an errno."""
    import functools

    @functools.wraps(fn)
    async def handler(*args, **kwargs):
        try:
            return await fn(*args, **kwargs)
        except (pyfuse3.FUSEError, trio.Cancelled):
            raise
        except SyscallError as exc:
            raise fuse_error(exc) from None
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
        except RecursionError:
            log.info("%s: input nested too deeply", name)
            raise pyfuse3.FUSEError(errno.EINVAL) from None
        except BaseException as exc:
            if not isinstance(exc, Exception):
                raise
            log.exception("%s failed; answering EIO", name)
            raise pyfuse3.FUSEError(errno.EIO) from None

    return handler


for _name, _fn in list(vars(Operations).items()):
    if not _name.startswith("_") and callable(_fn) and getattr(_fn, "__code__", None) is not None \
            and _fn.__code__.co_flags & 0x80:  # CO_COROUTINE: the FUSE handlers
        setattr(Operations, _name, _guarded(_name, _fn))
