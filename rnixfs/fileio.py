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
