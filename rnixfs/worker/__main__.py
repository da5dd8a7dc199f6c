"""``python -m rnixfs.worker --fd N``: one worker process, started by the
daemon's WorkerPool with one end of a socketpair as fd N."""
from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import socket
import sys
from pathlib import Path

import trio

from ..catalog import Catalog
from ..config import load_providers
from ..devices import sandbox, shell
from ..devices.fs import Workspace
from ..devices.llm.redact import install_log_filter
from ..devices.llm.registry import ProviderRegistry
from ..fileio import confined_dir
from ..kernel.tools import Tools
from ..limits import WORKER_NICE
from ..logsetup import setup_logging
from . import protocol
from .channel import Channel, PeerGone
from .host import WorkerHost
from .protocol import ProtocolError

log = logging.getLogger("rnixfs.worker")

PARENT_POLL = 1.0  # seconds between checks that the daemon is still our parent


async def watch_parent(daemon: int, cancel: trio.CancelScope) -> None:
    """Leave when the daemon is gone, however it went. EOF on the socket is
    the usual sign; this also holds if the socket is somehow kept open.
    (PR_SET_PDEATHSIG would fire when the daemon thread that started us
    ends, and trio starts processes from threads it retires when idle.)"""
    while os.getppid() == daemon:
        await trio.sleep(PARENT_POLL)
    log.warning("the daemon (pid %d) is gone: ending every loop", daemon)
    cancel.cancel()


async def serve(fd: int, daemon: int) -> int:
    os.set_inheritable(fd, False)  # agents' commands never get the kernel's socket
    sock = socket.socket(fileno=fd)
    channel = Channel(trio.SocketStream(trio.socket.from_stdlib_socket(sock)), name="kernel")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(channel.writer)
        nursery.start_soon(watch_parent, daemon, nursery.cancel_scope)
        try:
            with trio.fail_after(60):
                await channel.handshake("worker", "kernel", pid=os.getpid())
                cfg = await channel.receive()
            if cfg is None:
                log.info("the kernel closed the connection before configuring us (umount)")
                return 0
            if not isinstance(cfg, protocol.Configure):
                raise ProtocolError(f"expected configure, got {getattr(cfg, 'kind', 'EOF')}")
        except PeerGone:
            log.info("the kernel closed the connection before its hello (umount)")
            return 0
        except (ProtocolError, trio.TooSlowError) as exc:
            log.error("kernel handshake failed: %s", exc)
            await channel.aclose()
            return 2
        providers = ProviderRegistry.from_config(load_providers(Path(cfg.config_dir)), Path(cfg.state_dir))
        install_log_filter(providers.redactor)  # no key in daemon.log, from workers either
        sandbox.protect_daemon()
        project = Path(cfg.project)
        await trio.to_thread.run_sync(lambda: shell.configure(writable=[project]))
        workspace = Workspace(project, hidden=tuple(cfg.hidden))
        catalog = Catalog(project, Path(cfg.config_dir))
        make_tools = functools.partial(Tools, workspace, shell, mount=cfg.mount, env=cfg.env,
                                       skills=catalog.skills, open_root=confined_dir)
        host = WorkerHost(channel, cfg, providers, make_tools)
        channel.send(protocol.Ready(providers=providers.names()))
        log.info("serving the kernel (%d providers)", len(providers.names()))
        try:
            await host.serve()
        except ProtocolError as exc:
            log.error("kernel sent a bad message, leaving: %s", exc)
        finally:
            with trio.CancelScope(shield=True):
                await providers.aclose()
                await channel.aclose()
            nursery.cancel_scope.cancel()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rnixfs.worker")
    parser.add_argument("--fd", type=int, required=True, help="the socket to the kernel")
    parser.add_argument("--log", default="", help="append to this log (the daemon's)")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    setup_logging(args.log or None, args.log_level, tag=f"[worker {os.getpid()}]")
    # the mount's loop gets the CPU before agent work does (docs/architecture.md)
    os.nice(WORKER_NICE)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C on the daemon's terminal is the daemon's
    daemon = os.getppid()
    if daemon == 1:
        return 1  # the daemon died before we started
    return trio.run(serve, args.fd, daemon)


if __name__ == "__main__":
    sys.exit(main())
