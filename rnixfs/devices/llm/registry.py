"""The set of configured providers, built once per mount.

Providers are cheap to build (no I/O until first use; ``local`` starts its
model lazily), so every configured one exists from the start and ``get``
never blocks.
"""
from __future__ import annotations

import logging
from pathlib import Path

import trio

from rnixfs.config import ProviderConfig, ProvidersConfig
from rnixfs.devices.llm.base import Provider, Usage
from rnixfs.devices.llm.reply_guard import GuardedProvider
from rnixfs.devices.llm.redact import Redactor

log = logging.getLogger(__name__)


def build_provider(cfg: ProviderConfig, log_dir: Path) -> Provider:
    if cfg.type == "openai":
        from rnixfs.devices.llm.openai import OpenAIProvider
        return OpenAIProvider(cfg)
    if cfg.type == "local":
        from rnixfs.devices.llm.local import LocalProvider
        return LocalProvider(cfg, log_dir)
    if cfg.type in ("claude-cli", "cursor-cli"):
        from rnixfs.devices.llm.cli_driver import CLIProvider
        return CLIProvider(cfg)
    raise ValueError(f"provider {cfg.name!r}: unsupported type {cfg.type!r}")


def build_providers(cfg: ProvidersConfig, log_dir: Path) -> dict[str, Provider]:
    return {name: build_provider(p, log_dir) for name, p in cfg.providers.items()}


class ProviderRegistry:
    """Name → Provider. ``get`` raises KeyError for unknown names (→ ENOENT).

    Every provider is handed out wrapped in a GuardedProvider: reply caps,
    usage checks and redaction with ``redactor`` (the mount's secrets)."""

    def __init__(self, providers: dict[str, Provider], default_name: str,
                 prices: dict[str, dict[str, dict[str, float]]] | None = None,
                 redactor: Redactor | None = None):
        if default_name not in providers:
            raise KeyError(default_name)
        self.redactor = redactor or Redactor()
        self._providers = {n: GuardedProvider(p, self.redactor) for n, p in providers.items()}
        self.default_name = default_name
        self._prices = prices or {}

    @classmethod
    def from_config(cls, cfg: ProvidersConfig, log_dir: Path) -> "ProviderRegistry":
        return cls(build_providers(cfg, log_dir), cfg.default,
                   {n: p.prices for n, p in cfg.providers.items() if p.prices},
                   redactor=Redactor.from_config(cfg))

    def price(self, provider: str, model: str | None, usage: Usage | None) -> float:
        """USD for ``usage`` from providers.yaml ``prices`` (per 1M tokens).

        0.0 when the provider or model has no price (local models are free).
        """
        if usage is None:
            return 0.0
        if model is None and provider in self._providers:
            model = self._providers[provider].default_model
        p = self._prices.get(provider, {}).get(model or "")
        if not p:
            return 0.0
        return (usage.prompt_tokens * p.get("input", 0.0)
                + usage.completion_tokens * p.get("output", 0.0)) / 1_000_000

    def get(self, name: str | None = None) -> Provider:
        """The named provider, or the default one when ``name`` is None."""
        return self._providers[self.default_name if name is None else name]

    def __contains__(self, name: str) -> bool:
        return name in self._providers

    @property
    def default(self) -> Provider:
        return self._providers[self.default_name]

    def names(self) -> list[str]:
        return sorted(self._providers)

    def describe(self) -> dict:
        return {"default": self.default_name,
                "providers": {n: p.describe() for n, p in sorted(self._providers.items())}}

    async def aclose(self) -> None:
        """Close every provider (stops the local model); errors are logged, not raised."""
        with trio.CancelScope(shield=True):
            for name, p in self._providers.items():
                try:
                    await p.aclose()
                except Exception:
                    log.exception("closing provider %s failed", name)
