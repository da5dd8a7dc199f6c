"""A live kernel without a mount: real SQLite store, real providers, one
trio run — shared by the tier-1 and tier-2 tests."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Awaitable, Callable

import trio

from rnixfs.config import parse_providers
from rnixfs.devices.llm.registry import ProviderRegistry
from rnixfs.daemon import Daemon, DaemonConfig, open_daemon
from rnixfs.kernel.kernel import bare_plan
from rnixfs.limits import DEFAULT


def registry(providers_yaml: str, log_dir: Path) -> ProviderRegistry:
    """The daemon's own provider registry, from providers.yaml text."""
    return ProviderRegistry.from_config(parse_providers(providers_yaml), log_dir)


def run_with_kernel(tmp_path: Path, providers_factory, body: Callable[..., Awaitable], *,
                    daemon_id: str = "t", with_nursery: bool = False, setup=None, planner=None,
                    limits=None, linger: float = 600.0, tools=None, with_parts: bool = False):
    """Assemble the daemon as ``rnixfs mount`` does (``open_daemon``), without
    mounting it; run ``body(kernel)`` (or ``body(kernel, nursery)``), then shut
    everything down; returns what ``body`` returned. The store is
    ``tmp_path/rnixfs.db``; without a ``planner`` only the default agent exists.
    Agent loops run inline (``workers: 0``); ``tools`` replaces their tools:
    ``functools.partial(Tools, workspace, shell, …)``."""
    out = {}
    cfg = DaemonConfig(mountpoint=tmp_path / "unmounted", project=tmp_path, state_dir=tmp_path,
                       config_dir=tmp_path / "config", linger=linger)

    async def main():
        async with open_daemon(cfg, daemon=Daemon(cfg, daemon_id=daemon_id),
                               providers=providers_factory(),
                               limits=dataclasses.replace(limits or DEFAULT, workers=0),
                               planner=planner or bare_plan, sandbox_protect=False, tools=tools) as parts:
            if setup is not None:
                setup(parts.kernel)
            with trio.fail_after(60):
                if with_parts:  # the daemon's own Operations, ProcFiles, ...
                    out["v"] = await body(parts)
                else:
                    out["v"] = await (body(parts.kernel, parts.nursery) if with_nursery
                                      else body(parts.kernel))
            await parts.shutdown()

    trio.run(main)
    return out["v"]
