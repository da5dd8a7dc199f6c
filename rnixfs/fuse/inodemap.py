"""Inode numbers for real files, keyed by path.

The kernel keeps an entry's inode across a rename, so a rename moves the
path (and everything below it) to the same numbers; a removal forgets them.
A children index keeps both proportional to the subtree, and lookup counts
(what the kernel holds, returned by FORGET) let unused numbers go.
"""
from __future__ import annotations

import errno
import itertools
import posixpath

import pyfuse3


class InodeMap:
    def __init__(self, base: int, fixed: dict[str, int] | None = None):
        self._ino: dict[str, int] = dict(fixed or {})
        self._path: dict[int, str] = {v: k for k, v in self._ino.items()}
        self._fixed = set(self._path)
        self._kids: dict[str, set[str]] = {}
        self._refs: dict[int, int] = {}
        self._next = itertools.count(base)

    def __contains__(self, inode: int) -> bool:
        return inode in self._path

    def __len__(self) -> int:
        return len(self._path)

    def ino(self, path: str) -> int:
        """The number of ``path`` (allocated on first use, not counted)."""
        ino = self._ino.get(path)
        if ino is None:
            ino = next(self._next)
            self._ino[path] = ino
            self._path[ino] = path
            self._kids.setdefault(posixpath.dirname(path), set()).add(path)
        return ino

    def lookup(self, path: str) -> int:
        """The number of ``path``, counted as one more kernel reference."""
        ino = self.ino(path)
        self._refs[ino] = self._refs.get(ino, 0) + 1
        return ino

    def ref(self, ino: int) -> None:
        self._refs[ino] = self._refs.get(ino, 0) + 1

    def forget(self, ino: int, count: int) -> None:
        left = self._refs.get(ino, 0) - count
        if left > 0:
            self._refs[ino] = left
            return
        self._refs.pop(ino, None)
        path = self._path.get(ino)
        if path is not None and ino not in self._fixed:
            self._drop(path)

    def path(self, inode: int) -> str:
        try:
            return self._path[inode]
        except KeyError:
            raise pyfuse3.FUSEError(errno.ENOENT) from None

    def _drop(self, path: str) -> None:
        ino = self._ino.pop(path, None)
        if ino is not None:
            self._path.pop(ino, None)
        siblings = self._kids.get(posixpath.dirname(path))
        if siblings is not None:
            siblings.discard(path)

    def _subtree(self, path: str) -> list[str]:
        out, todo = [], [path]
        while todo:
            p = todo.pop()
            if p in self._ino:
                out.append(p)
            todo.extend(self._kids.get(p, ()))
        return out

    def move(self, src: str, dst: str | None) -> None:
        """Rename ``src`` (and below) to ``dst``; ``None`` forgets them."""
        for key in self._subtree(src):
            ino = self._ino[key]
            self._drop(key)
            self._kids.pop(key, None)
            if dst is not None:
                new = dst + key[len(src):]
                self._ino[new] = ino
                self._path[ino] = new
                self._kids.setdefault(posixpath.dirname(new), set()).add(new)
            else:
                self._refs.pop(ino, None)
