"""The FUSE protocol adapter: inodes, handles, errnos and cache policy.

No agent logic lives here (docs/architecture.md, "The FUSE adapter"): every
request is routed to a kernel or device call (what a proc/ file holds is
kernel/procfs.py's answer, a proc/new write kernel/spawnwriter.py's), every
open becomes one handle of its kind (handles.py), and every exception one
errno (errnos.py).
"""
from __future__ import annotations

import bisect
import errno
import itertools
import json
import logging
import os
import stat
import threading
import time
from typing import Callable

import pyfuse3
import trio

from ..devices.fs import FsError
from ..devices.llm.conversation import Conversation
from ..devices.mcp.device import ToolCall, tool_for_file
from ..kernel import request as spawn_request
from ..kernel.procfs import KINDS, WRITABLE, Kind, ProcFiles
from ..kernel.process import Process
from ..kernel.spawnwriter import SpawnWriter
from . import inodes
from .errnos import guard_handlers
from .handles import (BytesHandle, ContextHandle, ConversationHandle, CtlHandle, DirHandle, Handle, McpCtlHandle,
                      RealFileHandle, ShellHandle, SpawnHandle, StreamHandle, WaitHandle)
from .mcptree import McpTree
from .realfiles import CatalogTree, PlainDir, RealFiles, Tree
from .signals import Waits

log = logging.getLogger(__name__)

# Cache policy (docs/architecture.md, "proc/ files and their cache policy"), in seconds.
STATIC_TIMEOUT = 60.0  # fixed directories, immutable files, a zombie's files
ENTRY_TIMEOUT = 1.0  # names that can disappear (reaped processes)
SNAPSHOT_TIMEOUT = 0.5  # live status/context: size is a hint, reads are direct_io
LIVE_TIMEOUT = 0.0  # live trace/events/wait: the size must be fresh for tail -f
INVALIDATE_EVERY = 0.05  # seconds: kernel cache invalidations are batched this often
# proc/new, dev/llm/*, dev/shell run things as the daemon's user: only that
# user may open them (default_permissions enforces it, even with allow_other)
WRITE_MODE = 0o600
# A process's files belong to the uid that spawned it and only it may read
# them (root excepted): with allow_other, other users see pids, not agents.
PROC_DIR_MODE = 0o500
PROC_FILE_MODE = 0o400
PROC_WRITE_MODE = 0o600
XATTR_DAEMON = b"user.rnixfs.daemon"
XATTR_NAMESPACE = b"user."  # the only one served (docs/architecture.md, "Extended attributes")
TREE_INODES = {"skills": inodes.SKILLS, "agents": inodes.AGENTS}
# inode numbers of real files: one range per tree (fuse/realfiles.py)
REAL_BASE = {"skills": 1 << 44, "agents": (1 << 44) + (1 << 42), "dev/fs": 1 << 45}
REAL_MIN = min(REAL_BASE.values())
REAL_TOPS = frozenset({inodes.SKILLS, inodes.AGENTS, inodes.DEV_FS})


class Operations(pyfuse3.Operations):
    supports_dot_lookup = False
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, kernel, providers, nursery: trio.Nursery, *,
                 daemon_info: Callable[[], dict], max_blocking: int,
                 trees: dict[str, Tree] | None = None, workspace=None,
                 shell_session: Callable[[], object] | None = None, mcp=None,
                 procfiles: ProcFiles | None = None):
        """``procfiles``: the ProcFiles whose ``changed`` is the kernel's
        ``on_change`` hook (without it, a zombie's cached pages are not
        invalidated when it is reparented)."""
        super().__init__()
        self.mcp = McpTree(mcp, self._attr) if mcp is not None else None
        self.trees = {name: tree for name, tree in (trees or {}).items() if name in TREE_INODES}
        self.real = [RealFiles(TREE_INODES[n], REAL_BASE[n], CatalogTree(n, t), self._attr)
                     for n, t in self.trees.items()]
        self.wsfs = None
        if workspace is not None:
            self.wsfs = RealFiles(inodes.DEV_FS, REAL_BASE["dev/fs"], PlainDir(workspace), self._attr)
            self.real.append(self.wsfs)
        self.shell_session = shell_session
        self.kernel = kernel
        self.providers = providers
        self.nursery = nursery
        self.daemon_info = daemon_info
        self.llm_names = sorted(providers.names())[: inodes.LLM_MAX]
        self._fh = itertools.count(1)
        self.handles: dict[int, Handle] = {}
        self.dirs: dict[int, DirHandle] = {}
        self.uid, self.gid = os.getuid(), os.getgid()
        self.waits = Waits(max_blocking, owner=self.uid)
        self.slots = self.waits.slots
        self.owners: dict[int, tuple[int, int]] = {}  # pid -> (uid, gid) of its spawner
        self.mounted_ns = time.time_ns()
        self.files = procfiles if procfiles is not None else ProcFiles()
        self._live_attr: dict[int, float] = {}  # inode -> until when the kernel may cache its live size
        self._session = False  # FUSE_INIT seen and not closed: the kernel's caches can be told
        self._notify_lock = threading.Lock()  # held while a thread tells them
        nursery.start_soon(self._invalidator)

    def init(self) -> None:
        self._session = True

    def end_session(self) -> None:
        """The FUSE session is closing: no more notifications (waits for one
        in flight, so the session is never closed under it)."""
        with self._notify_lock:
            self._session = False

    def _invalidate(self, names: list[bytes], inos: list[int], attr_only: bool) -> None:
        """In a thread: forget reaped names and cached attributes/pages. An
        inode the kernel no longer knows answers ENOENT: nothing to do."""
        with self._notify_lock:
            if not self._session:
                return
            for name in names:
                try:
                    pyfuse3.invalidate_entry(inodes.PROC, name)
                except OSError:
                    pass
            for ino in inos:
                try:
                    pyfuse3.invalidate_inode(ino, attr_only)
                except OSError:
                    pass

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
        if inode < REAL_MIN and inode not in REAL_TOPS:
            return None  # proc/, dev/ (the common case: no table to ask)
        for real in self.real:
            if real.owns(inode):
                return real
        return None

    def _unlinked_attr(self, inode: int) -> pyfuse3.EntryAttributes | None:
        """fstat of a real file removed while still open (its name is gone,
        its open descriptor is not: a temp file's usual life)."""
        if inode < REAL_MIN:
            return None
        for h in self.handles.values():
            if isinstance(h, RealFileHandle) and h.ino == inode and h.fd >= 0:
                return h.files.from_fd(inode, h.fd)
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
        """Attributes of proc/<pid>/ and its files. A zombie's never change
        (long timeouts; the pid is watched so a reparent or reap still
        reaches the kernel's cache); a live snapshot's size may be cached
        for SNAPSHOT_TIMEOUT, a live stream's not at all."""
        ino = inodes.pid_ino(proc.pid, k)
        name = inodes.NAMES.get(k)
        if name is None and k != inodes.K_DIR:
            raise pyfuse3.FUSEError(errno.ENOENT)  # a number no file of proc/<pid>/ has
        owner = self.owner(proc)
        frozen = self.files.frozen(proc, name)
        if frozen:
            self.files.watch(proc.pid)
        created = int(proc.created * 1e9)
        if k == inodes.K_DIR or name == "fd":
            return self._attr(ino, stat.S_IFDIR | PROC_DIR_MODE, ns=created, owner=owner,
                              timeout=STATIC_TIMEOUT if frozen else ENTRY_TIMEOUT)
        mode = stat.S_IFREG | (PROC_WRITE_MODE if name in WRITABLE else PROC_FILE_MODE)
        size = self.files.size(proc, name)
        if frozen:
            ns = created if name == "intent" else int((proc.exited or proc.created) * 1e9)
            return self._attr(ino, mode, size=size, timeout=STATIC_TIMEOUT, ns=ns, owner=owner)
        if KINDS[name] is Kind.SNAPSHOT:
            self._live_attr[ino] = time.monotonic() + SNAPSHOT_TIMEOUT
            self.files.watch(proc.pid)
            timeout = SNAPSHOT_TIMEOUT
        else:
            timeout = LIVE_TIMEOUT
        return self._attr(ino, mode, size=size, timeout=timeout, entry_timeout=ENTRY_TIMEOUT,
                          ns=time.time_ns(), owner=owner)

    async def _fresh_size(self, ino: int) -> None:
        """A file about to be page-cached whose live size the kernel may still
        hold: drop that attribute first, or reads would stop at the old size."""
        until = self._live_attr.pop(ino, None)
        if len(self._live_attr) > 4096:
            now = time.monotonic()
            self._live_attr = {i: t for i, t in self._live_attr.items() if t > now}
        if until is not None and until > time.monotonic() and self._session:
            await trio.to_thread.run_sync(self._invalidate, [], [ino], True)

    async def _invalidator(self) -> None:
        """Tell the kernel's caches what changed: a watched process's files
        (pages and attributes), and the names of reaped ones. Batched, in a
        thread, never awaited by a request (docs/architecture.md)."""
        while True:
            pids = await self.files.next_changes()
            if not self._session:
                continue
            names, inos = [], []
            for pid in pids:
                if pid not in self.kernel.table:
                    names.append(str(pid).encode())
                inos += [inodes.pid_ino(pid, k) for k in range(len(inodes.PROC_FILES) + 1)]
            await trio.to_thread.run_sync(self._invalidate, names, inos, False)
            await trio.sleep(INVALIDATE_EVERY)

    async def getattr(self, inode, ctx=None):
        if (real := self._real(inode)) is not None:
            try:
                return real.getattr(inode)
            except (pyfuse3.FUSEError, FsError) as exc:
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
        if inode in (inodes.PROC_NEW, inodes.DEV_SHELL) or kind == "llm" or (kind == "pid" and inodes.NAMES.get(b) in WRITABLE):
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

    async def _check_dir(self, inode: int) -> None:
        """ENOTDIR (or ENOENT) unless ``inode`` is a directory."""
        if (real := self._real(inode)) is not None:
            if not stat.S_ISDIR(real.getattr(inode).st_mode):
                raise pyfuse3.FUSEError(errno.ENOTDIR)
            return
        if self.mcp is not None and self.mcp.owns(inode):
            if not await self.mcp.is_dir(inode):
                raise pyfuse3.FUSEError(errno.ENOTDIR)
            return
        kind, a, b = inodes.decode(inode)
        if kind == "pid":
            self._proc(a)
            if b not in (inodes.K_DIR, inodes.K["fd"]):
                raise pyfuse3.FUSEError(errno.ENOTDIR)
        elif inode != inodes.PROC and self._children(inode) is None:
            raise pyfuse3.FUSEError(errno.ENOTDIR)

    async def opendir(self, inode, ctx):
        await self._check_dir(inode)
        fh = next(self._fh)
        self.dirs[fh] = DirHandle(inode)
        return fh

    async def readdir(self, fh, start_id, token):
        h = self.dirs.get(fh)
        if h is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        inode = h.inode
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
    def _new_handle(self, handle: Handle) -> pyfuse3.FileInfo:
        fh = next(self._fh)
        self.handles[fh] = handle
        return pyfuse3.FileInfo(fh=fh, direct_io=handle.direct_io, keep_cache=handle.keep_cache,
                                nonseekable=handle.nonseekable)

    def _handle(self, fh: int) -> Handle:
        h = self.handles.get(fh)
        if h is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        return h

    async def open(self, inode, flags, ctx):
        if (real := self._real(inode)) is not None:
            fd = real.open(inode, flags)
            # a hard-linked file may have changed through another name: no stale pages
            shared = real.policy.hard_links and os.fstat(fd).st_nlink > 1
            return self._new_handle(RealFileHandle(fd, inode, real, shared=shared).opened_by(ctx))
        if self.mcp is not None and self.mcp.owns(inode):
            return await self._open_mcp(inode, flags, ctx)
        if inode == inodes.DEV_SHELL and self.shell_session is not None:
            return self._new_handle(ShellHandle(self.shell_session(), self.waits).opened_by(ctx))
        kind, a, b = inodes.decode(inode)
        writing = (flags & os.O_ACCMODE) != os.O_RDONLY
        if inode == inodes.PROC_NEW:
            return self._new_handle(self._spawn_handle(ctx))
        if kind == "llm":
            if a >= len(self.llm_names):
                raise pyfuse3.FUSEError(errno.ENOENT)
            name = self.llm_names[a]
            conv = Conversation(self.providers.get(name), self.nursery, f"/dev/llm/{name}")
            return self._new_handle(ConversationHandle(conv, self.waits).opened_by(ctx))
        if kind != "pid" or b in (inodes.K_DIR, inodes.K["fd"]):
            raise pyfuse3.FUSEError(errno.EISDIR if kind != "fd" else errno.ELOOP)
        name = inodes.NAMES.get(b)
        if name is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._new_handle((await self._open_proc(self._proc(a), name, writing)).opened_by(ctx))

    async def _open_proc(self, proc: Process, name: str, writing: bool) -> Handle:
        """A proc/<pid>/ file: page-cached once frozen (a zombie's, the
        intent), else direct_io so every read is fresh."""
        if writing and name not in WRITABLE:
            raise pyfuse3.FUSEError(errno.EACCES)
        cached = self.files.frozen(proc, name) and not writing
        if cached:
            await self._fresh_size(inodes.pid_ino(proc.pid, inodes.K[name]))
            self.files.watch(proc.pid)
        kind = KINDS[name]
        if kind is Kind.STREAM:
            return StreamHandle(proc, name, cached=cached)
        if kind is Kind.WAIT:
            return WaitHandle(proc, self.waits, lambda: self.files.content(proc, "wait"), cached=cached)
        data = b"" if writing else self.files.content(proc, name)
        if name == "ctl":
            return CtlHandle(data, self.kernel, proc.pid)
        if name == "context":
            h = ContextHandle(data, self.kernel, proc.pid)
            h.direct_io, h.keep_cache = not cached, cached
            return h
        return BytesHandle(data, cached=cached)

    def _spawn_handle(self, ctx) -> SpawnHandle:
        """proc/new: its spawns belong to the opener, or to the agent whose
        Bash command opened it (then the agent is their parent)."""
        ppid = self.kernel.agent_of(ctx.pid) or 0
        parent = self.kernel.table.get(ppid) if ppid else None
        spawner = self.owner(parent) if parent is not None else (ctx.uid, ctx.gid)
        writer = SpawnWriter(self.kernel, ppid=ppid, on_spawn=lambda proc: self._record_owner(proc.pid, spawner))
        return SpawnHandle(writer).opened_by(ctx)

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
            return self._new_handle(McpCtlHandle(self.mcp.devices, parts[0]).opened_by(ctx))
        if parts[1] == "tools" and parts[3] == "call":
            server = self.mcp.devices.get(parts[0])
            call = ToolCall(server, tool_for_file(server, parts[2]), self.nursery)
            return self._new_handle(ConversationHandle(call, self.waits).opened_by(ctx))
        data = await self.waits.interruptible(ctx.uid, ctx.pid, lambda: self.mcp.snapshot(parts))
        return self._new_handle(BytesHandle(data).opened_by(ctx))

    def interrupt_all(self) -> None:
        """Shutdown: every waiting read answers EINTR now, so the FUSE loop
        can end (it waits for its handlers)."""
        self.waits.interrupt_all()

    async def read(self, fh, off, size):
        return await self._handle(fh).read(off, size)

    async def write(self, fh, off, buf):
        return await self._handle(fh).write(off, buf)

    async def flush(self, fh):
        h = self.handles.get(fh)
        if h is not None:
            await h.flush()


    # Names under proc/ and dev/ are the kernel's: nothing is created, removed
    # or renamed there. skills/ and agents/ are real files.
    async def _refuse(self, *args, **kwargs):
        raise pyfuse3.FUSEError(errno.EACCES)

    async def symlink(self, parent_inode, name, target, ctx):
        if (real := self._real(parent_inode)) is None:
            raise pyfuse3.FUSEError(errno.EACCES)
        return real.symlink(parent_inode, name, target, ctx)

    async def link(self, inode, new_parent_inode, new_name, ctx):
        real = self._real(new_parent_inode)
        if real is None or not real.policy.hard_links:
            raise pyfuse3.FUSEError(errno.EACCES)
        if not real.owns(inode):
            raise pyfuse3.FUSEError(errno.EXDEV)
        entry = real.link(inode, new_parent_inode, new_name)
        # the old name's cached attributes (nlink, and soon size) are now stale;
        # told after this reply, outside the request that holds the inode
        self.nursery.start_soon(self._invalidate_attr, inode)
        return entry

    async def _invalidate_attr(self, inode: int) -> None:
        await trio.to_thread.run_sync(self._invalidate, [], [inode], True)

    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        if (real := self._real(parent_inode)) is None:
            raise pyfuse3.FUSEError(errno.EACCES)
        return real.mknod(parent_inode, name, mode, ctx)

    async def create(self, parent_inode, name, mode, flags, ctx):
        if (real := self._real(parent_inode)) is None:
            raise pyfuse3.FUSEError(errno.EACCES)
        fd, attr = real.create(parent_inode, name, mode, flags, ctx)
        return self._new_handle(RealFileHandle(fd, attr.st_ino, real).opened_by(ctx)), attr

    async def mkdir(self, parent_inode, name, mode, ctx):
        if (real := self._real(parent_inode)) is None:
            raise pyfuse3.FUSEError(errno.EACCES)
        return real.mkdir(parent_inode, name, mode, ctx)

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
        if h is not None:
            await h.fsync(datasync)

    async def release(self, fh):
        h = self.handles.pop(fh, None)
        if h is not None:
            await h.release()

    async def releasedir(self, fh):
        self.dirs.pop(fh, None)

    async def forget(self, inode_list):
        # proc/ and dev/ numbers are computed; real files' numbers are counted
        for inode, count in inode_list:
            if (real := self._real(inode)) is not None:
                real.forget(inode, count)
            elif self.mcp is not None and self.mcp.owns(inode):
                self.mcp.forget(inode, count)

    # -- xattrs and statfs --------------------------------------------------------------
    async def getxattr(self, inode, name, ctx):
        if not name.startswith(XATTR_NAMESPACE):
            # no ACLs, no security labels anywhere in the mount: "not supported"
            # (not "no such attribute") lets ls remember that for the whole
            # filesystem instead of asking three times per entry
            raise pyfuse3.FUSEError(errno.EOPNOTSUPP)
        if inode == inodes.ROOT and name == XATTR_DAEMON:
            return json.dumps(self.daemon_info()).encode()
        if (real := self._real(inode)) is not None:
            value = real.xattrs(inode).get(os.fsdecode(name))
            if value is not None:
                return value
        raise pyfuse3.FUSEError(pyfuse3.ENOATTR)

    async def listxattr(self, inode, ctx):
        if inode == inodes.ROOT:
            return [XATTR_DAEMON]
        if (real := self._real(inode)) is not None:
            return [os.fsencode(k) for k in real.xattrs(inode)]
        return []

    async def statfs(self, ctx):
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 4096
        s.f_namemax = 255
        s.f_files = len(self.kernel.table) + 16
        return s


guard_handlers(Operations)
