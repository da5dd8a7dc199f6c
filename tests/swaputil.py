"""A directory and a symlink leading out trading places, as fast as the
kernel allows, from another process (its own GIL), for race tests."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SWAPPER = r"""
import ctypes, ctypes.util, os, sys, time
real, target = sys.argv[1], sys.argv[2]
link = real + ".link"
os.symlink(target, link)
libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
a, b = os.fsencode(real), os.fsencode(link)
AT_FDCWD, RENAME_EXCHANGE = -100, 2
while True:  # the directory and a symlink leading out trade places, atomically
    libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE)
    time.sleep(0.00005)  # thousands of swaps a second, without taking a whole core
"""


def swap_forever(real_dir: Path, target: Path) -> subprocess.Popen:
    """Another process (its own GIL), so the swaps land between our syscalls."""
    return subprocess.Popen([sys.executable, "-c", SWAPPER, str(real_dir), str(target)])


def stop_swapping(p: subprocess.Popen, real_dir: Path) -> None:
    p.kill()
    p.wait(10)
    link = Path(f"{real_dir}.link")
    if real_dir.is_symlink():
        real_dir.unlink()
        link.rename(real_dir)
    elif os.path.lexists(link):
        link.unlink()
