"""Inode numbers for real files, keyed by path.

The kernel keeps an entry's inode across a rename, so a rename moves the
path (and everything below it) to the same numbers; a removal forgets them.
"""
from __future__ import annotations

import errno
import itertools

import pyfuse3


class InodeMap:
    def __init__(self, base: int, fixed: dict[str, int] | None = None):
        self._ino: dict[str, int] = dict(fixed or {})
        self._path: dict[int, str] = {v: k for k, v in self._ino.items()}
        self._next = itertools.count(base)

    def __contains__(self, inode: int) -> bool:
        return inode in self._path

    def ino(self, path: str) -> int:
        ino = self._ino.get(path)
        if ino is None:
            ino = next(self._next)
            self._ino[path] = ino
            self._path[ino] = path
        return ino

    def path(self, inode: int) -> str:
        try:
            return self._path[inode]
        except KeyError:
            raise pyfuse3.FUSEError(errno.ENOENT) from None

    def move(self, src: str, dst: str | None) -> None:
        """Rename ``src`` (and below) to ``dst``; ``None`` forgets them."""
        prefix = src + "/"
        for key in [k for k in self._ino if k == src or k.startswith(prefix)]:
            ino = self._ino.pop(key)
            if dst is None:
                self._path.pop(ino, None)
            else:
                new = dst + key[len(src):]
                self._ino[new] = ino
                self._path[ino] = new
