"""Which page-cache policy a FUSE file is served with, seen from outside.

    python bench/cache_policy.py FILE...

The benchmark compares an rnixfs file with the minimal pyfuse3 file that has
the same policy (bench/minimal_fs.py serves one of each), so it must know
the policy without reading rnixfs's code. The kernel tells:

- ``direct_io``: a shared read-only mmap of the file fails (ENODEV), since
  the filesystem did not allow mmap on direct_io files;
- ``keep_cache``: after one open+read+close, the next open keeps the pages:
  mmap them and ``mincore`` says they are resident without touching them;
- ``page_cache``: mmap works but the pages are gone after the open (FUSE
  drops a file's cache at open unless the filesystem says keep_cache).
"""
from __future__ import annotations

import ctypes
import errno
import os
import sys

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
_PROT_READ, _MAP_SHARED = 0x1, 0x01
_MAP_FAILED = ctypes.c_void_p(-1).value


def _read_all(path: str) -> int:
    fd = os.open(path, os.O_RDONLY)
    n = 0
    try:
        while chunk := os.read(fd, 131072):
            n += len(chunk)
    finally:
        os.close(fd)
    return n


def policy(path: str) -> str:
    """'direct_io', 'keep_cache' or 'page_cache' (see the module docstring)."""
    size = _read_all(path)
    if size == 0:
        raise ValueError(f"{path}: empty, its policy cannot be seen")
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, _PROT_READ, _MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            err = ctypes.get_errno()
            if err == errno.ENODEV:
                return "direct_io"
            raise OSError(err, f"mmap {path}: {os.strerror(err)}")
        try:
            pages = (size + os.sysconf("SC_PAGE_SIZE") - 1) // os.sysconf("SC_PAGE_SIZE")
            vec = ctypes.create_string_buffer(pages)
            if _libc.mincore(addr, size, vec) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"mincore {path}: {os.strerror(err)}")
            return "keep_cache" if all(b & 1 for b in vec.raw[:pages]) else "page_cache"
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(p, policy(p))
