"""Mounting and serving: the only place pyfuse3's lifecycle is touched."""
from __future__ import annotations

import logging
import os

import pyfuse3

from .ops import Operations

log = logging.getLogger(__name__)

# pyfuse3 does not answer FUSE_INTERRUPT, so a waiting read holds a worker
# task until it notices the caller's signal. Cap waiting readers below the
# task pool so stat/ls/getattr always find a free worker (README.md, "Blocking reads and Ctrl-C").
MAX_TASKS = 512
MAX_BLOCKING = MAX_TASKS - 64


def mount_options(*, allow_other: bool = False) -> set[str]:
    opts = set(pyfuse3.default_options)
    opts |= {"fsname=rnixfs", "subtype=rnixfs", "noatime"}
    if allow_other:
        opts.add("allow_other")
    return opts


_ops: Operations | None = None  # the mounted filesystem (one per process)


def init(ops: Operations, mountpoint: str, *, allow_other: bool = False) -> None:
    global _ops
    pyfuse3.init(ops, os.fspath(mountpoint), mount_options(allow_other=allow_other))
    _ops = ops


async def serve() -> None:
    """Serve until unmounted (fusermount3 -u) or ``terminate()``."""
    await pyfuse3.main(min_tasks=4, max_tasks=MAX_TASKS)


def terminate() -> None:
    pyfuse3.terminate()


def close(*, unmount: bool) -> None:
    global _ops
    if _ops is not None:
        _ops.end_session()  # no cache notification may race the close
        _ops = None
    pyfuse3.close(unmount=unmount)
