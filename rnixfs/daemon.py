"""The daemon: one trio nursery at the root holding every service.

store writer thread ← kernel (processes) ← FUSE adapter; providers are
closed and the store flushed when the mount goes away.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import signal
import time
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable

import trio
import uuid6

from . import __version__
from .catalog import AgentsTree, Catalog, SkillsTree
from .config import load_providers
from .devices import sandbox, shell
from .limits import SHELL_OUTPUT_BYTES, SHELL_TIMEOUT, Limits, load_limits
from .devices.fs import Workspace
from .fileio import confined_dir
from .devices.llm.redact import install_log_filter, remove_log_filter
from .devices.llm.registry import ProviderRegistry
from .devices.mcp.device import McpDevices
from .fuse import mount as fuse_mount
from .fuse.ops import Operations
from .kernel.procfs import ProcFiles
from .kernel.kernel import Kernel
from .kernel.runner import InlineRunner
from .kernel.tools import Tools
from .statelock import StateLock
from .store import Store, run_all
from .worker.pool import WorkerPool
from .worker.protocol import Configure

log = logging.getLogger(__name__)



@dataclass
class DaemonConfig:
    mountpoint: Path
    project: Path
    state_dir: Path
    config_dir: Path
    linger: float = 600.0
    allow_other: bool = False


class Daemon:
    def __init__(self, cfg: DaemonConfig, *, daemon_id: str | None = None):
        self.cfg = cfg
        self.id = daemon_id or str(uuid6.uuid7())
        self.started = time.time()
        self.kernel: Kernel | None = None
        self.store: Store | None = None
        self.providers: ProviderRegistry | None = None
        self.sandbox: sandbox.Sandbox | None = None
        self.mcp: McpDevices | None = None
        self.runner = None  # kernel Runner: a WorkerPool, or InlineRunner with workers: 0

    def info(self) -> dict:
        """Facts for ``rnixfs status`` and the root's xattr; no secret in them."""
        info = {
            "pid": os.getpid(),
            "daemon_id": self.id,
            "version": __version__,
            "started": self.started,
            "uptime": round(time.time() - self.started, 3),
            "mountpoint": str(self.cfg.mountpoint),
            "project": str(self.cfg.project),
            "state_dir": str(self.cfg.state_dir),
            "config_dir": str(self.cfg.config_dir),
            "linger": self.cfg.linger,
            "processes": self.kernel.counts() if self.kernel else {},
            "providers": self.providers.describe() if self.providers else {},
            "limits": self.kernel.limits.to_json() if self.kernel else {},
            "workers": self.runner.describe() if self.runner else {},
            "mcp": {"servers": self.mcp.names(), "errors": self.mcp.errors} if self.mcp else {},
            "store_error": str(self.store.failed) if self.store and self.store.failed else None,
            "sandbox": self.sandbox.describe() if self.sandbox else None,
            "store_degraded": self.store.degraded if self.store else None,
        }
        return self.providers.redactor.data(info) if self.providers else info

    async def run(self, on_ready=lambda: None) -> None:
        """Assemble everything, mount, serve until unmounted or signalled."""
        async with open_daemon(self.cfg, daemon=self) as parts:
            fuse_mount.init(parts.ops, str(self.cfg.mountpoint), allow_other=self.cfg.allow_other)
            signalled: list[int] = []
            unmounted = False
            try:
                parts.nursery.start_soon(_on_signals, signalled, parts.ops)
                log.info("mounted at %s (pid %d)", self.cfg.mountpoint, os.getpid())
                on_ready()
                await fuse_mount.serve()
                # serve() also returns after terminate(): then we unmount.
                unmounted = not signalled
            finally:
                with trio.CancelScope(shield=True):
                    log.info("shutting down")
                    await parts.shutdown()
                fuse_mount.close(unmount=not unmounted)
        log.info("stopped")


@dataclass
class DaemonParts:
    """What ``open_daemon`` assembled: the adapter's ``Operations`` and the
    services behind it, all alive until the ``async with`` ends."""
    ops: Operations
    kernel: Kernel
    store: Store
    providers: ProviderRegistry
    nursery: trio.Nursery
    mcp: McpDevices
    procfiles: ProcFiles
    shutdown: Callable[[], Awaitable[None]]


@asynccontextmanager
async def open_daemon(cfg: DaemonConfig, *, daemon: Daemon | None = None,
                      providers: ProviderRegistry | None = None, limits: Limits | None = None,
                      planner=None, sandbox_protect: bool = True, tools=None) -> AsyncIterator[DaemonParts]:
    """The one place the daemon is wired (docs/architecture.md, "Assembly").

    An AsyncExitStack holds every service in the order it must be undone:
    state lock, store writer, provider clients, log redaction, the root
    nursery with the kernel, MCP sessions. ``rnixfs mount`` serves the
    yielded ``ops`` over FUSE; tests call them directly. ``providers``,
    ``limits`` and ``planner`` replace what the config directory says, and
    ``tools`` (``Tools`` without its kernel ports) the agents' tools of
    inline loops (tests).
    """
    daemon = daemon or Daemon(cfg)
    async with AsyncExitStack() as stack:
        cfg.state_dir.mkdir(parents=True, exist_ok=True)
        lock = StateLock(cfg.state_dir)
        lock.acquire(mountpoint=cfg.mountpoint)  # before the store is touched
        stack.callback(lock.release)
        providers_cfg = load_providers(cfg.config_dir)
        if sandbox_protect:
            # agents' commands must not read our environment or memory (docs/devices.md)
            sandbox.protect_daemon()
        daemon.sandbox = await trio.to_thread.run_sync(lambda: shell.configure(writable=[cfg.project]))
        if not daemon.sandbox.active:
            log.warning("commands run without a sandbox (%s): %s", daemon.sandbox.policy,
                        daemon.sandbox.reason)
        limits = limits or load_limits(cfg.config_dir)
        store = daemon.store = Store(cfg.state_dir / "rnixfs.db")
        recovered = await trio.to_thread.run_sync(store.recover, daemon.id)
        if recovered:
            log.info("marked %d processes of an earlier daemon as dead", recovered)
        token = trio.lowlevel.current_trio_token()
        store.dispatch = lambda callbacks: token.run_sync_soon(run_all, callbacks)
        store.start()

        async def stop_store():
            store.put_audit(daemon.id, "umount", {"mountpoint": str(cfg.mountpoint)})
            await trio.to_thread.run_sync(store.stop)
        stack.push_async_callback(stop_store)
        daemon.providers = providers or ProviderRegistry.from_config(providers_cfg, cfg.state_dir)
        stack.push_async_callback(daemon.providers.aclose)
        log_filter = install_log_filter(daemon.providers.redactor)  # no key in daemon.log
        stack.callback(remove_log_filter, log_filter)
        catalog = Catalog(cfg.project, cfg.config_dir)
        await trio.to_thread.run_sync(catalog.install_builtins)
        procfiles = ProcFiles()  # proc/ bytes, re-rendered on the kernel's on_change
        store.put_audit(daemon.id, "mount", {"mountpoint": str(cfg.mountpoint), "pid": os.getpid()})
        nursery = await stack.enter_async_context(trio.open_nursery())
        stack.callback(nursery.cancel_scope.cancel)  # runs first: after shutdown, end the services
        workspace = Workspace(cfg.project, hidden=_inside(cfg.mountpoint, cfg.project))
        child_env = providers_cfg.child_env()  # no provider keys for agents' commands
        mcp = daemon.mcp = McpDevices.load(cfg.project, cfg.config_dir, nursery, cwd=cfg.project)
        tools = tools or functools.partial(Tools, workspace, shell, mount=str(cfg.mountpoint), env=child_env,
                                           skills=catalog.skills, open_root=confined_dir, mcp=mcp)
        runner = daemon.runner = await _runner(cfg, nursery, limits, child_env, mcp, tools)
        kernel = daemon.kernel = Kernel(
            store, daemon.providers, daemon_id=daemon.id, linger=cfg.linger, project=cfg.project,
            planner=planner or catalog.plan, limits=limits, runner=runner, on_change=procfiles.changed,
        )
        await nursery.start(kernel.run)
        shell_env = {**child_env, "RNIXFS_MOUNT": str(cfg.mountpoint)}

        def shell_session():
            return shell.ShellSession(nursery, cwd=cfg.project, env=shell_env,
                                      timeout=SHELL_TIMEOUT, output_limit=SHELL_OUTPUT_BYTES)

        ops = Operations(kernel, daemon.providers, nursery, daemon_info=daemon.info,
                         max_blocking=fuse_mount.MAX_BLOCKING,
                         trees={"skills": SkillsTree(catalog), "agents": AgentsTree(catalog)},
                         workspace=workspace, shell_session=shell_session, mcp=mcp,
                         procfiles=procfiles)
        done = False

        async def shutdown() -> None:
            """Kill what runs and close sessions; idempotent (also run on the way out)."""
            nonlocal done
            if not done:
                done = True
                await kernel.shutdown()
                if isinstance(runner, WorkerPool):
                    await runner.aclose()  # workers ended and reaped: no orphan
                await mcp.aclose()

        async def shielded_shutdown():
            with trio.CancelScope(shield=True):
                await shutdown()
        stack.push_async_callback(shielded_shutdown)
        yield DaemonParts(ops=ops, kernel=kernel, store=store, providers=daemon.providers,
                          nursery=nursery, mcp=mcp, procfiles=procfiles,
                          shutdown=shutdown)


async def _runner(cfg: DaemonConfig, nursery, limits: Limits, child_env: dict, mcp, tools):
    """Agent loops run in worker processes (``workers:`` in limits.yaml, one
    per core by default); ``workers: 0`` runs them on this loop with
    ``tools`` (docs/architecture.md, "Workers and the kernel protocol")."""
    count = limits.worker_count()
    if not count:
        return InlineRunner(tools)
    root = logging.getLogger()
    log_path = next((h.baseFilename for h in root.handlers if isinstance(h, logging.FileHandler)), "")
    pool = WorkerPool(count, Configure(
        project=str(cfg.project), mount=str(cfg.mountpoint), config_dir=str(cfg.config_dir),
        state_dir=str(cfg.state_dir), env=child_env, limits=limits.to_json(),
        hidden=list(_inside(cfg.mountpoint, cfg.project))),
        mcp=mcp, log_path=log_path, log_level=logging.getLevelName(root.level))
    await nursery.start(pool.run_service)
    return pool


def _inside(mountpoint: Path, project: Path) -> tuple[str, ...]:
    """The mount point relative to the project when it lies inside it: dev/fs
    and the agents' tools must never stat it (that waits on this daemon)."""
    mp, root = os.path.realpath(mountpoint), os.path.realpath(project)
    rel = os.path.relpath(mp, root)
    if rel == "." or rel == ".." or rel.startswith("../"):
        return ()
    return (rel,)


async def _on_signals(signalled: list[int], ops: Operations) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            log.info("signal %d: unmounting", signum)
            signalled.append(signum)
            ops.interrupt_all()  # the FUSE loop waits for its handlers
            fuse_mount.terminate()
            return


def dump_info(info: dict) -> str:
    return json.dumps(info, indent=2)
