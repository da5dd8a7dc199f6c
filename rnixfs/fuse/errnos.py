"""The one place an exception becomes an errno at the FUSE boundary.

Handlers raise what they mean: ``SyscallError`` (its code's errno through
``kernel/errors.ERRNO``; a walker's ``FsError`` carries the host's exact
errno), ``OSError``, or ``pyfuse3.FUSEError`` for an errno decided here.
``guarded`` wraps every FUSE handler once and applies ``to_fuse``, because
pyfuse3 ends its main loop on any exception but FUSEError: one bad request
must never unmount everyone (docs/architecture.md, "The FUSE adapter").
"""
from __future__ import annotations

import errno
import functools
import logging

import pyfuse3
import trio

from ..devices.fs import FsError
from ..kernel.errors import Code, SyscallError

log = logging.getLogger(__name__)
# A refused request is the caller's business (it gets the errno, and the reason
# in the file or trace): INFO. Only the daemon's own failures are warnings.
DAEMON_FAULTS = (Code.INTERNAL, Code.NO_SPACE, Code.READ_ONLY)


def to_fuse(exc: Exception, where: str = "") -> pyfuse3.FUSEError:
    """The FUSEError answering ``exc``; reasons worth reading are logged."""
    if isinstance(exc, pyfuse3.FUSEError):
        return exc
    if isinstance(exc, SyscallError):
        if not isinstance(exc, FsError):  # walker errors are expected answers (ENOENT…)
            log.log(logging.WARNING if exc.code in DAEMON_FAULTS else logging.INFO, "%s", exc)
        return pyfuse3.FUSEError(exc.errno)
    if isinstance(exc, OSError):
        return pyfuse3.FUSEError(exc.errno or errno.EIO)
    if isinstance(exc, RecursionError):
        log.info("%s: input nested too deeply", where)
        return pyfuse3.FUSEError(errno.EINVAL)
    log.error("%s failed; answering EIO", where, exc_info=exc)
    return pyfuse3.FUSEError(errno.EIO)


def guarded(name: str, fn):
    """``fn`` with every exception but cancellation answered by ``to_fuse``."""

    @functools.wraps(fn)
    async def handler(*args, **kwargs):
        try:
            return await fn(*args, **kwargs)
        except (pyfuse3.FUSEError, trio.Cancelled):
            raise
        except Exception as exc:
            raise to_fuse(exc, name) from None

    return handler


def guard_handlers(cls: type) -> type:
    """Wrap each FUSE handler (the public coroutine methods) of ``cls``."""
    for name, fn in list(vars(cls).items()):
        if not name.startswith("_") and callable(fn) and getattr(fn, "__code__", None) is not None \
                and fn.__code__.co_flags & 0x80:  # CO_COROUTINE
            setattr(cls, name, guarded(name, fn))
    return cls
