"""The driver boundary: what every provider's reply must satisfy.

The registry wraps each driver (openai, local, CLI) in a GuardedProvider, so
agent steps and dev/llm conversations get the same rules, in one place:
- a reply is capped in bytes (``max_reply_bytes``) and in wall-clock time
  (``max_reply_time``), whatever the server streams and however steadily;
- server-reported usage must be sane (``Usage.check``), else a driver error;
- every string that leaves the driver (reply text, tool calls, error
  causes, ``describe()``) goes through the mount's Redactor;
- any other failure of a driver becomes an LLMError (a driver error the
  fallbacks handle), never an internal error carrying raw text.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import gc
import logging
from contextlib import aclosing
from typing import AsyncIterator

import trio

from rnixfs.config import DEFAULT_MAX_REPLY_BYTES, DEFAULT_MAX_REPLY_TIME
from rnixfs.devices.llm.base import ChatChunk, LLMError, LLMReplyTooLarge, LLMTimeout
from rnixfs.devices.llm.redact import Redactor

log = logging.getLogger(__name__)


MAX_CAUSE = 500  # characters of a driver error kept in traces and status


class GuardedProvider:
    """A Provider that enforces the caps and redaction around ``inner``."""

    def __init__(self, inner, redactor: Redactor | None = None):
        self.inner = inner
        self.redact = redactor or Redactor()
        cfg = getattr(inner, "cfg", None)
        self.max_bytes = getattr(cfg, "max_reply_bytes", DEFAULT_MAX_REPLY_BYTES)
        self.max_time = getattr(cfg, "max_reply_time", DEFAULT_MAX_REPLY_TIME)

    def __getattr__(self, name):  # name, default_model, cfg, ...
        return getattr(self.inner, name)

    def describe(self) -> dict:
        return self.redact.data(self.inner.describe())

    async def aclose(self) -> None:
        await self.inner.aclose()

    def _error(self, exc: LLMError) -> LLMError:
        """The same error class and facts, with a redacted cause, shortened
        only after the redaction (a key cut in two would leave a part)."""
        cause = self.redact(exc.cause)
        if len(cause) > MAX_CAUSE:
            cause = cause[:MAX_CAUSE] + "…"
        if cause == exc.cause:
            return exc
        return type(exc)(cause, status=exc.status, retryable=exc.retryable)

    async def stream_chat(self, messages: list[dict], **kw) -> AsyncIterator[ChatChunk]:
        # One generator between the driver and the caller (each layer costs
        # every chunk an extra resumption), one deadline for the whole reply.
        # Each wait for a chunk still runs under it: a server that keeps the
        # connection busy without sending a chunk (SSE comments, empty
        # events) must not outlast max_reply_time.
        deadline = trio.current_time() + self.max_time
        max_bytes = self.max_bytes
        text_r = self.redact.stream()
        args_r: dict[int, object] = {}  # tool-call index → its arguments' StreamRedactor
        size = 0  # bytes of this reply so far
        stream = self.inner.stream_chat(messages, **kw)
        try:
            async with aclosing(stream):
                while True:
                    try:
                        with trio.CancelScope(deadline=deadline) as scope:
                            chunk = await stream.__anext__()
                    except StopAsyncIteration:
                        break
                    except LLMError as exc:
                        raise self._error(exc) from None
                    except Exception as exc:  # a driver bug or an unexpected reply
                        log.warning("%s: driver failed: %s", getattr(self.inner, "name", "?"),
                                    self.redact(repr(exc)))
                        raise LLMError(self.redact(f"driver failed: {type(exc).__name__}: {exc}")[:300]) from None
                    if scope.cancelled_caught:
                        raise LLMTimeout(f"reply still streaming after max_reply_time of "
                                         f"{self.max_time:g}s; stopped")
                    text = chunk.text
                    size += len(text) if text.isascii() else len(text.encode())
                    if chunk.tool_calls:
                        size += sum(_call_size(c) for c in chunk.tool_calls)
                    if size > max_bytes:
                        raise LLMReplyTooLarge(f"reply larger than max_reply_bytes of {max_bytes} "
                                               f"bytes; stopped")
                    if chunk.usage is not None:
                        try:
                            chunk.usage.check()
                        except LLMError as exc:
                            raise self._error(exc) from None
                    yield self._redacted(chunk, text_r, args_r)
            rest = text_r.flush()
            calls = [{"index": i, "function": {"arguments": tail}}
                     for i, r in args_r.items() if (tail := r.flush())]
            if rest or calls:
                yield ChatChunk(text=rest, tool_calls=calls)
        finally:
            if size >= RELEASE_AFTER:
                release_memory_soon()

    def _redacted(self, chunk: ChatChunk, text_r, args_r: dict) -> ChatChunk:
        if not self.redact.secrets:
            return chunk  # nothing configured: user-info masking is for error texts
        calls = []
        for d in chunk.tool_calls:
            d = dict(d)
            if isinstance(d.get("id"), str):
                d["id"] = self.redact(d["id"])
            fn = d.get("function")
            if isinstance(fn, dict):
                fn = dict(fn)
                if isinstance(fn.get("name"), str):
                    fn["name"] = self.redact(fn["name"])
                if isinstance(fn.get("arguments"), str):
                    i = d.get("index", 0)
                    r = args_r.setdefault(i, self.redact.stream())
                    fn["arguments"] = r.feed(fn["arguments"])
                d["function"] = fn
            calls.append(d)
        return dataclasses.replace(chunk, text=text_r.feed(chunk.text), tool_calls=calls)


RELEASE_AFTER = 1024 * 1024  # bytes of one reply worth giving back to the OS
_release_pending = False


def release_memory_soon(delay: float = 1.0) -> None:
    """After a large reply is dropped (done, capped or killed), give its
    memory back to the OS: a few MiB of small strings leave the C heap
    fragmented, and glibc keeps freed pages unless asked (malloc_trim)."""
    global _release_pending
    if _release_pending:
        return
    _release_pending = True

    async def release():
        global _release_pending
        try:
            await trio.sleep(delay)  # the process's frames are gone by then
            gc.collect()
            await trio.to_thread.run_sync(_malloc_trim)
        finally:
            _release_pending = False

    try:
        trio.lowlevel.spawn_system_task(release)
    except RuntimeError:  # no trio run (a test's own loop ended)
        _release_pending = False


def _malloc_trim() -> None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the allocator decides
        pass


def _call_size(delta) -> int:
    """Bytes a tool-call delta adds to the reply (name, id and arguments, and
    a little for the delta itself: empty deltas cannot stream for free)."""
    if not isinstance(delta, dict) or not isinstance(delta.get("index", 0), int):
        raise LLMError("malformed tool call from server: not an object with an integer index")
    fn = delta.get("function")
    fn = fn if isinstance(fn, dict) else {}
    return 16 + sum(len(v.encode()) for v in (delta.get("id"), fn.get("name"), fn.get("arguments"))
                    if isinstance(v, str))
