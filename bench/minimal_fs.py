"""A minimal pyfuse3 filesystem: the baseline rnixfs is measured against.

    python bench/minimal_fs.py MOUNTPOINT [--entries N] [--size BYTES]

Tree (everything static, built once):

    MOUNTPOINT/file        one regular file of --size bytes (default 900,
                           about the size of an rnixfs proc/<pid>/status)
    MOUNTPOINT/file_keep_cache   the same bytes, opened with keep_cache
    MOUNTPOINT/file_direct_io    the same bytes, opened with direct_io
    MOUNTPOINT/dir/        --entries directories named 1..N (like proc/<pid>)

Caching is pyfuse3's defaults, as in its examples (hello.py, tmpfs.py):
EntryAttributes' 300 s entry/attr timeouts, a plain FileInfo (page cache on,
no keep_cache, no direct_io) for `file`. The two other files differ only in
the open flags, so a benchmark can compare an rnixfs file with the minimal
file of the same cache policy: keep_cache (the kernel keeps the pages across
opens: no READ at all once read) or direct_io (every read is a READ). It prints "ready <pid>" on stdout once the
mount is up, and exits when unmounted (fusermount3 -u) or on SIGTERM/SIGINT.
"""
from __future__ import annotations

import argparse
import errno
import os
import signal
import stat
import sys
import time

import pyfuse3
import trio

ROOT = pyfuse3.ROOT_INODE
FILE = ROOT + 1
DIR = ROOT + 2
FILE_KEEP = ROOT + 3
FILE_DIRECT = ROOT + 4
FILES = {FILE: b"file", FILE_KEEP: b"file_keep_cache", FILE_DIRECT: b"file_direct_io"}
ENTRY_BASE = 1000  # inode of dir/<i> is ENTRY_BASE + i


class MinimalFS(pyfuse3.Operations):
    supports_dot_lookup = False
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, entries: int, size: int):
        super().__init__()
        self.n = entries
        line = b"minimal pyfuse3 file, the same size as an rnixfs status\n"
        self.data = (line * (size // len(line) + 1))[:size]
        self.names = [str(i).encode() for i in range(1, entries + 1)]
        self.uid, self.gid = os.getuid(), os.getgid()
        self.t = time.time_ns()

    def _attr(self, ino: int) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()  # pyfuse3's default timeouts (300 s)
        a.st_ino = ino
        if ino in FILES:
            a.st_mode = stat.S_IFREG | 0o444
            a.st_size = len(self.data)
            a.st_nlink = 1
        else:
            a.st_mode = stat.S_IFDIR | 0o555
            a.st_nlink = 2
        a.st_uid, a.st_gid = self.uid, self.gid
        a.st_blksize = 4096
        a.st_blocks = (a.st_size + 511) // 512
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = self.t
        return a

    def _valid(self, ino: int) -> bool:
        return ino in (ROOT, DIR) or ino in FILES or ENTRY_BASE < ino <= ENTRY_BASE + self.n

    async def getattr(self, inode, ctx=None):
        if not self._valid(inode):
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attr(inode)

    async def lookup(self, parent_inode, name, ctx=None):
        if parent_inode == ROOT:
            for ino, fname in FILES.items():
                if name == fname:
                    return self._attr(ino)
            if name == b"dir":
                return self._attr(DIR)
        elif parent_inode == DIR and name.isdigit() and not name.startswith(b"0"):
            i = int(name)
            if 1 <= i <= self.n:
                return self._attr(ENTRY_BASE + i)
        elif ENTRY_BASE < parent_inode <= ENTRY_BASE + self.n:
            raise pyfuse3.FUSEError(errno.ENOENT)
        raise pyfuse3.FUSEError(errno.ENOENT)

    async def opendir(self, inode, ctx):
        if inode in FILES or not self._valid(inode):
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return inode

    async def readdir(self, fh, start_id, token):
        if fh == ROOT:
            entries = [(fname, ino) for ino, fname in FILES.items()] + [(b"dir", DIR)]
            for i in range(start_id, len(entries)):
                name, ino = entries[i]
                if not pyfuse3.readdir_reply(token, name, self._attr(ino), i + 1):
                    return
        elif fh == DIR:
            for i in range(start_id, self.n):
                if not pyfuse3.readdir_reply(token, self.names[i], self._attr(ENTRY_BASE + i + 1), i + 1):
                    return

    async def releasedir(self, fh):
        pass

    async def open(self, inode, flags, ctx):
        if inode not in FILES:
            raise pyfuse3.FUSEError(errno.EISDIR if self._valid(inode) else errno.ENOENT)
        if flags & os.O_ACCMODE != os.O_RDONLY:
            raise pyfuse3.FUSEError(errno.EACCES)
        return pyfuse3.FileInfo(fh=inode, keep_cache=inode == FILE_KEEP, direct_io=inode == FILE_DIRECT)

    async def read(self, fh, off, size):
        return self.data[off:off + size]

    async def release(self, fh):
        pass

    async def forget(self, inode_list):
        pass

    async def statfs(self, ctx):
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 4096
        s.f_namemax = 255
        return s


_terminated = False


async def _serve() -> None:
    async with trio.open_nursery() as nursery:
        async def on_signal():
            global _terminated
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as sigs:
                async for _ in sigs:
                    _terminated = True
                    pyfuse3.terminate()
                    return

        nursery.start_soon(on_signal)
        await pyfuse3.main()
        nursery.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mountpoint")
    ap.add_argument("--entries", type=int, default=10_000)
    ap.add_argument("--size", type=int, default=900)
    args = ap.parse_args(argv)
    ops = MinimalFS(args.entries, args.size)
    opts = set(pyfuse3.default_options) | {"fsname=minimalfs", "subtype=minimalfs", "noatime"}
    pyfuse3.init(ops, args.mountpoint, opts)
    print(f"ready {os.getpid()}", flush=True)
    unmounted = False
    try:
        trio.run(_serve)
        unmounted = not _terminated  # otherwise main() returned: the kernel unmounted us
    finally:
        pyfuse3.close(unmount=not unmounted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
