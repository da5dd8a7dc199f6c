"""A live kernel without a mount: real SQLite store, real providers, one
trio run — shared by the tier-1 and tier-2 tests."""
from __future__ import annotations

from pathlib import Path
from typing import Awaitable, Callable

import trio

from rnixfs.config import parse_providers
from rnixfs.devices.llm.registry import ProviderRegistry
from rnixfs.kernel.kernel import Kernel
from rnixfs.kernel.runner import InlineRunner
from rnixfs.store import Store


def registry(providers_yaml: str, log_dir: Path) -> ProviderRegistry:
    """The daemon's own provider registry, from providers.yaml text."""
    return ProviderRegistry.from_config(parse_providers(providers_yaml), log_dir)


def run_with_kernel(tmp_path: Path, providers_factory, body: Callable[..., Awaitable], *,
                    daemon_id: str = "t", with_nursery: bool = False, setup=None, tools=None,
                    **kernel_kw):
    """Start store + kernel, run ``body(kernel)`` (or ``body(kernel, nursery)``),
    then shut everything down; returns what ``body`` returned. ``tools`` makes
    the processes' tools (``InlineRunner``): ``functools.partial(Tools, ws, shell, …)``."""
    out = {}

    async def main():
        store = Store(tmp_path / "rnixfs.db")
        await trio.to_thread.run_sync(store.recover, daemon_id)
        token = trio.lowlevel.current_trio_token()
        store.dispatch = lambda cbs: token.run_sync_soon(lambda: [cb() for cb in cbs])
        store.start()
        providers = providers_factory()
        kernel_kw.setdefault("runner", InlineRunner(tools))
        kernel = Kernel(store, providers, daemon_id=daemon_id, project=tmp_path, **kernel_kw)
        if setup is not None:
            setup(kernel)
        async with trio.open_nursery() as n:
            await n.start(kernel.run)
            with trio.fail_after(60):
                out["v"] = await (body(kernel, n) if with_nursery else body(kernel))
            await kernel.shutdown()
            await providers.aclose()
            n.cancel_scope.cancel()
        await trio.to_thread.run_sync(store.stop)

    trio.run(main)
    return out["v"]
