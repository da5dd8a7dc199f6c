"""Inode numbers computed from what they name, so nothing needs a table.

Fixed nodes are small numbers; a process's files are PID_BASE + pid*16 + k;
its fd/ entries are FD_BASE + pid*4096 + fd. Lookups and forgets then need
no bookkeeping, and an inode never points at a different object.
"""
from __future__ import annotations

from ..kernel.procfs import FILES

ROOT = 1
PROC = 2
DEV = 3
PROC_NEW = 4
DEV_LLM = 5
SKILLS = 6
AGENTS = 7
PROC_SELF = 8
DEV_FS = 9
DEV_SHELL = 10
DEV_MCP = 11
LLM_BASE = 100  # + index of the provider name
LLM_MAX = 1000

PID_BASE = 1 << 20
FD_BASE = 1 << 52
MAX_FD = 4096

PROC_FILES = FILES  # the names in proc/<pid>/, kernel/procfs.py
K_DIR = 0
K = {name: i + 1 for i, name in enumerate(PROC_FILES)}
NAMES = {k: name for name, k in K.items()}


def pid_ino(pid: int, k: int = K_DIR) -> int:
    return PID_BASE + pid * 16 + k


def fd_ino(pid: int, fd: int) -> int:
    return FD_BASE + pid * MAX_FD + fd


def decode(ino: int) -> tuple[str, int, int]:
    """("fixed", ino, 0) | ("llm", index, 0) | ("pid", pid, k) | ("fd", pid, fd)"""
    if ino >= FD_BASE:
        pid, fd = divmod(ino - FD_BASE, MAX_FD)
        return "fd", pid, fd
    if ino >= PID_BASE:
        pid, k = divmod(ino - PID_BASE, 16)
        return "pid", pid, k
    if LLM_BASE <= ino < LLM_BASE + LLM_MAX:
        return "llm", ino - LLM_BASE, 0
    return "fixed", ino, 0
