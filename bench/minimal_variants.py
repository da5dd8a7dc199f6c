"""bench/minimal_fs.py plus what rnixfs must answer and the minimal does not.

    python bench/minimal_variants.py MOUNTPOINT [--xattrs] [--flush] [minimal_fs options]

--xattrs  getxattr/listxattr answer "no such attribute" (rnixfs serves
          xattrs, so the kernel asks it; the minimal answers ENOSYS once and
          the kernel never asks again: `ls -l` makes three queries per entry)
--flush   flush answers (rnixfs needs it for proc/new; the minimal answers
          ENOSYS once and the kernel stops sending FLUSH on close)
"""
from __future__ import annotations

import sys
from pathlib import Path

import pyfuse3

sys.path.insert(0, str(Path(__file__).resolve().parent))

import minimal_fs  # noqa: E402


def main(argv: list[str]) -> int:
    with_xattrs, with_flush = "--xattrs" in argv, "--flush" in argv
    rest = [a for a in argv if a not in ("--xattrs", "--flush")]
    base = minimal_fs.MinimalFS

    class Variant(base):
        if with_xattrs:
            async def getxattr(self, inode, name, ctx):
                raise pyfuse3.FUSEError(pyfuse3.ENOATTR)

            async def listxattr(self, inode, ctx):
                return []
        if with_flush:
            async def flush(self, fh):
                pass

    minimal_fs.MinimalFS = Variant
    return minimal_fs.main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
