"""Structured syscall errors and their errno at the FUSE boundary.

The kernel speaks in codes (README.md, "proc/<pid>/"); only the adapter turns them into
errnos, via ``ERRNO`` below, so one table decides what `echo` prints.
"""
from __future__ import annotations

import errno
from enum import Enum


class Code(str, Enum):
    TIMEOUT = "TIMEOUT"
    NOT_FOUND = "NOT_FOUND"
    PERMISSION = "PERMISSION"
    INTERNAL = "INTERNAL"
    DRIVER = "DRIVER"
    INVALID = "INVALID"
    # Process-level conditions that are not syscall failures of a device but
    # still need a precise errno for users of ctl / proc/new.
    NO_PROCESS = "NO_PROCESS"
    BUSY = "BUSY"
    TOO_BIG = "TOO_BIG"
    INTERRUPTED = "INTERRUPTED"
    AGAIN = "AGAIN"
    # The state store cannot take writes (see README.md, "State directory").
    NO_SPACE = "NO_SPACE"
    READ_ONLY = "READ_ONLY"


ERRNO = {
    Code.NOT_FOUND: errno.ENOENT,
    Code.PERMISSION: errno.EACCES,
    Code.INVALID: errno.EINVAL,
    Code.TIMEOUT: errno.ETIMEDOUT,
    Code.DRIVER: errno.EIO,
    Code.INTERNAL: errno.EIO,
    Code.NO_PROCESS: errno.ESRCH,
    Code.BUSY: errno.EBUSY,
    Code.TOO_BIG: errno.EFBIG,
    Code.INTERRUPTED: errno.EINTR,
    Code.AGAIN: errno.EAGAIN,
    Code.NO_SPACE: errno.ENOSPC,
    Code.READ_ONLY: errno.EROFS,
}


class SyscallError(Exception):
    """A failed syscall: what failed, for whom, on which device, and why."""

    def __init__(
        self,
        code: Code,
        cause: str,
        *,
        syscall: str = "",
        pid: int | None = None,
        device: str = "",
    ):
        super().__init__(cause)
        self.code = Code(code)
        self.cause = cause
        self.syscall = syscall
        self.pid = pid
        self.device = device

    @property
    def errno(self) -> int:
        return ERRNO[self.code]

    def __str__(self) -> str:
        parts = [f"[{self.code.value}]"]
        if self.pid is not None:
            parts.append(f"PID {self.pid}")
        if self.syscall:
            parts.append(f"{self.syscall}:" if self.device else self.syscall)
        if self.device:
            parts.append(self.device)
        return " ".join(parts) + f" ({self.cause})"

    def to_dict(self) -> dict:
        return {
            "code": self.code.value,
            "syscall": self.syscall,
            "pid": self.pid,
            "device": self.device,
            "cause": self.cause,
        }
