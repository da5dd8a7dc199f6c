"""The daemon: one trio nursery at the root holding every service.

store writer thread ← kernel (processes) ← FUSE adapter; providers are
closed and the store flushed when the mount goes away.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import trio
import uuid6

from . import __version__
from .catalog import AgentsTree, Catalog, SkillsTree
from .config import load_providers
from .devices import sandbox, shell
from .limits import load_limits
from .devices.fs import Workspace
from .fileio import confined_dir
from .devices.llm.redact import install_log_filter, remove_log_filter
from .devices.llm.registry import ProviderRegistry
from .devices.mcp.device import McpDevices
from .fuse import mount as fuse_mount
from .fuse.ops import Operations
from .kernel.procfs import ProcFiles
from .kernel.kernel import Kernel
from .kernel.tools import Tools
from .statelock import StateLock
from .store import Store, run_all

log = logging.getLogger(__name__)

SHELL_TIMEOUT = 600.0  # seconds a dev/shell command may run
SHELL_OUTPUT = 1024 * 1024  # bytes of its output kept (head and tail)


@dataclass
class DaemonConfig:
    mountpoint: Path
    project: Path
    state_dir: Path
    config_dir: Path
    linger: float = 600.0
    allow_other: bool = False


class Daemon:
    def __init__(self, cfg: DaemonConfig):
        self.cfg = cfg
        self.id = str(uuid6.uuid7())
        self.started = time.time()
        self.kernel: Kernel | None = None
        self.store: Store | None = None
        self.providers: ProviderRegistry | None = None
        self.sandbox: sandbox.Sandbox | None = None
        self.mcp: McpDevices | None = None

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
            "mcp": {"servers": self.mcp.names(), "errors": self.mcp.errors} if self.mcp else {},
            "store_error": str(self.store.failed) if self.store and self.store.failed else None,
            "sandbox": self.sandbox.describe() if self.sandbox else None,
            "store_degraded": self.store.degraded if self.store else None,
        }
        return self.providers.redactor.data(info) if self.providers else info

    async def run(self, on_ready=lambda: None) -> None:
        cfg = self.cfg
        cfg.state_dir.mkdir(parents=True, exist_ok=True)
        lock = StateLock(cfg.state_dir)
        lock.acquire(mountpoint=cfg.mountpoint)  # before the store is touched
        try:
            await self._run_locked(on_ready)
        finally:
            lock.release()

    async def _run_locked(self, on_ready) -> None:
        cfg = self.cfg
        providers_cfg = load_providers(cfg.config_dir)
        # agents' commands must not read our environment or memory (docs/devices.md)
        sandbox.protect_daemon()
        self.sandbox = await trio.to_thread.run_sync(
            lambda: shell.configure(writable=[cfg.project]))
        if not self.sandbox.active:
            log.warning("commands run without a sandbox (%s): %s", self.sandbox.policy, self.sandbox.reason)
        limits = load_limits(cfg.config_dir)
        store = self.store = Store(cfg.state_dir / "rnixfs.db")
        recovered = await trio.to_thread.run_sync(store.recover, self.id)
        if recovered:
            log.info("marked %d processes of an earlier daemon as dead", recovered)
        token = trio.lowlevel.current_trio_token()
        store.dispatch = lambda callbacks: token.run_sync_soon(run_all, callbacks)
        store.start()
        self.providers = ProviderRegistry.from_config(providers_cfg, cfg.state_dir)
        log_filter = install_log_filter(self.providers.redactor)  # no key in daemon.log
        catalog = Catalog(cfg.project, cfg.config_dir)
        await trio.to_thread.run_sync(catalog.install_builtins)
        procfiles = ProcFiles()  # proc/ bytes, re-rendered on the kernel's on_change
        self.kernel = Kernel(
            store, self.providers, daemon_id=self.id, linger=cfg.linger, project=cfg.project,
            planner=catalog.plan, limits=limits, on_change=procfiles.changed,
        )
        store.put_audit(self.id, "mount", {"mountpoint": str(cfg.mountpoint), "pid": os.getpid()})
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.kernel.run)
                workspace = Workspace(cfg.project, hidden=_inside(cfg.mountpoint, cfg.project))
                child_env = providers_cfg.child_env()  # no provider keys for agents' commands
                mcp = self.mcp = McpDevices.load(cfg.project, cfg.config_dir, nursery, cwd=cfg.project)
                self.kernel.tools = Tools(self.kernel, workspace, shell, mount=str(cfg.mountpoint),
                                          env=child_env, skills=catalog.skills, open_root=confined_dir,
                                          mcp=mcp)
                shell_env = {**child_env, "RNIXFS_MOUNT": str(cfg.mountpoint)}

                def shell_session():
                    return shell.ShellSession(nursery, cwd=cfg.project, env=shell_env,
                                              timeout=SHELL_TIMEOUT, output_limit=SHELL_OUTPUT)

                ops = Operations(self.kernel, self.providers, nursery, daemon_info=self.info,
                                 max_blocking=fuse_mount.MAX_BLOCKING,
                                 trees={"skills": SkillsTree(catalog), "agents": AgentsTree(catalog)},
                                 workspace=workspace, shell_session=shell_session, mcp=mcp,
                                 procfiles=procfiles)
                fuse_mount.init(ops, str(cfg.mountpoint), allow_other=cfg.allow_other)
                signalled: list[int] = []
                unmounted = False
                try:
                    nursery.start_soon(_on_signals, signalled, ops)
                    log.info("mounted at %s (pid %d)", cfg.mountpoint, os.getpid())
                    on_ready()
                    await fuse_mount.serve()
                    # serve() also returns after terminate(): then we unmount.
                    unmounted = not signalled
                finally:
                    with trio.CancelScope(shield=True):
                        log.info("shutting down")
                        await self.kernel.shutdown()
                        await mcp.aclose()
                        await self.providers.aclose()
                    fuse_mount.close(unmount=not unmounted)
                nursery.cancel_scope.cancel()
        finally:
            store.put_audit(self.id, "umount", {"mountpoint": str(cfg.mountpoint)})
            await trio.to_thread.run_sync(store.stop)
        log.info("stopped")
        remove_log_filter(log_filter)


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


def setup_logging(path: Path | None, level: str = "INFO") -> None:
    handler: logging.Handler
    if path is None:
        handler = logging.StreamHandler()
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.WARNING)


def dump_info(info: dict) -> str:
    return json.dumps(info, indent=2)
