"""Driver for any OpenAI-compatible chat endpoint (llama.cpp, Ollama, vLLM…).

Streams with SSE and retries (stamina) on 429/5xx/connect errors/timeouts, but
only until the first chunk has reached the caller: a reply cannot be replayed
once the kernel has shown part of it. The API key is sent as a Bearer header
and scrubbed from every error text; nothing here logs headers.
"""
from __future__ import annotations

import json
import logging
from contextlib import AsyncExitStack, aclosing
from typing import AsyncIterator

import httpx
import stamina
from httpx_sse import aconnect_sse
from httpx_sse._decoders import SSEDecoder, SSELineDecoder

from rnixfs.config import ProviderConfig, url_credentials
from rnixfs.devices.llm.base import ChatChunk, LLMError, LLMReplyTooLarge, LLMTimeout, Usage
from rnixfs.devices.llm.stack_transport import StackTransport, env_proxy

log = logging.getLogger(__name__)

_MAX_CAUSE = 200
_MAX_AFTER_DONE = 16  # events a server may still send after [DONE]
_MAX_ERROR_BODY = 64 * 1024  # bytes of an error body read for its reason


class _Truncated(LLMError):
    """The body ended before the reply did (no [DONE], no finish_reason)."""


class _Retry(Exception):
    """Internal: a failure worth another attempt (never escapes this module)."""

    def __init__(self, cause: str, *, status: int | None = None,
                 retry_after: float | None = None, timeout: bool = False):
        super().__init__(cause)
        self.cause, self.status = cause, status
        self.retry_after, self.timeout = retry_after, timeout


def _short(text: str, limit: int = _MAX_CAUSE) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


async def _error_body(resp: httpx.Response) -> bytes:
    """The first ``_MAX_ERROR_BODY`` bytes of an error body: a server whose
    error body never ends cannot grow the daemon's memory."""
    body = bytearray()
    async for part in resp.aiter_bytes():
        body += part
        if len(body) >= _MAX_ERROR_BODY:
            break
    return bytes(body[:_MAX_ERROR_BODY])


def _server_message(resp: httpx.Response, raw: bytes, scrub=str) -> str:
    """The error message from an error body ({"error": {"message"}} or text),
    scrubbed before it is shortened."""
    text = raw.decode(resp.encoding or "utf-8", "replace")
    try:
        body = json.loads(text)
    except ValueError:
        return _short(scrub(text or resp.reason_phrase))
    err = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(err, dict):
        err = err.get("message") or err.get("detail") or err
    return _short(scrub(err if isinstance(err, str) else json.dumps(err)))


def _retry_after(resp: httpx.Response) -> float | None:
    try:
        v = float(resp.headers.get("retry-after", ""))
    except ValueError:
        return None  # HTTP-date form: fall back to exponential backoff
    return max(v, 0.0)


def _describe_exc(e: BaseException) -> str:
    msg = str(e)
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


class OpenAIProvider:
    """``type: openai`` — one shared ``httpx.AsyncClient`` per provider."""

    def __init__(self, cfg: ProviderConfig):
        self.cfg = cfg
        self.name = cfg.name
        self.default_model = cfg.model
        headers = {"Accept": "text/event-stream", **cfg.headers}
        if cfg.api_key:
            headers["Authorization"] = f"Bearer {cfg.api_key}"
        # Many agents share one client: keep enough idle connections for them
        # (httpx keeps 20), and let a request wait for a connection as long as
        # the step allows (step_timeout governs, not the pool). The transport
        # costs the same per request however many connections are open
        # (pool.py); httpx's own pool scans them all on every request.
        # httpx ignores proxy variables once it is given a transport: with a
        # proxy configured in the environment, its own pool serves instead.
        timeout = httpx.Timeout(cfg.timeout, connect=cfg.connect_timeout, pool=None)
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=128)
        transport = None if env_proxy() else StackTransport(max_connections=256, max_idle=128)
        self._client = httpx.AsyncClient(headers=headers, timeout=timeout, limits=limits,
                                         transport=transport)
        self._url: httpx.URL | str = f"{cfg.base_url}/chat/completions"
        try:
            self._url = httpx.URL(self._url)  # parsed once, not on every request
        except (httpx.InvalidURL, TypeError, ValueError):
            pass  # each request then fails with the reason, as before
        # Longest first; scrubbed before any text is shortened, so a cut never
        # falls inside a secret and keeps its first characters.
        found = {cfg.api_key, *cfg.headers.values(), *url_credentials(cfg.base_url or "")}
        self._secrets = sorted((s for s in found if s and len(s) >= 4), key=len, reverse=True)

    def describe(self) -> dict:
        return {"type": "openai", "model": self.default_model,
                "base_url": self.cfg.base_url,
                **({"api_key": "set"} if self.cfg.api_key else {})}

    async def aclose(self) -> None:
        await self._client.aclose()

    # -- errors -----------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        for s in self._secrets:
            text = text.replace(s, "***")
        return text

    def _error(self, cause: str, cls=LLMError, **kw) -> LLMError:
        return cls(self._scrub(cause), **kw)

    def _backoff(self, exc: Exception) -> bool | float:
        """stamina hook: retry only our _Retry; honour Retry-After (capped)."""
        if not isinstance(exc, _Retry):
            return False
        if exc.retry_after is not None:
            return min(exc.retry_after, self.cfg.retry_max)
        return True

    # -- streaming --------------------------------------------------------------

    async def stream_chat(self, messages: list[dict], *, model: str | None = None,
                          max_tokens: int | None = None,
                          extra: dict | None = None) -> AsyncIterator[ChatChunk]:
        body: dict = {"model": model or self.default_model, "messages": messages,
                      "stream": True, "stream_options": {"include_usage": True}}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        body.update(extra or {})
        attempts = self.cfg.max_retries + 1
        async with AsyncExitStack() as outer:
            try:
                # The first attempt runs without the retry machinery (its
                # set-up was ~5 % of the daemon's time per request); a failure
                # is handed to stamina as its first attempt, so backoff and
                # Retry-After work exactly as if stamina had made it.
                failed: _Retry | None = None
                try:
                    chunks, pending = await self._open(body, outer)
                except _Retry as e:
                    failed = e
                if failed is not None:
                    async for attempt in stamina.retry_context(
                            on=self._backoff, attempts=attempts, timeout=None,
                            wait_initial=self.cfg.retry_initial, wait_max=self.cfg.retry_max,
                            wait_jitter=min(self.cfg.retry_initial, 1.0)):
                        with attempt:
                            try:
                                if failed is not None:
                                    e, failed = failed, None
                                    raise e
                                chunks, pending = await self._open(body, outer)
                            except _Retry as e:
                                if attempt.num < attempts:
                                    log.info("%s: attempt %d/%d failed (%s); retrying",
                                             self.name, attempt.num, attempts, e.cause)
                                raise
            except _Retry as e:
                cls = LLMTimeout if e.timeout else LLMError
                raise self._error(f"gave up after {attempts} attempt(s): {e.cause}",
                                  cls, status=e.status, retryable=True) from None
            for c in pending:
                yield c
            try:
                async for c in chunks:
                    yield c
            except httpx.TimeoutException as e:
                raise self._error(f"stream interrupted: no data for {self.cfg.timeout:g}s ({_describe_exc(e)})",
                                  LLMTimeout) from None
            except httpx.HTTPError as e:
                raise self._error(f"stream interrupted: {_describe_exc(e)}") from None
            except LLMError as e:
                if e.cause.startswith("stream interrupted"):
                    raise
                raise self._error(f"stream interrupted: {e.cause}", type(e), status=e.status) from None

    async def _open(self, body: dict, outer: AsyncExitStack):
        """One attempt: connect, check status, read up to the first chunk.

        Returns (iterator over the remaining chunks, chunks already read).
        On success the response is handed to ``outer``; on failure it is closed.
        """
        async with AsyncExitStack() as stack:
            try:
                es = await stack.enter_async_context(
                    aconnect_sse(self._client, "POST", self._url, json=body))
                resp = es.response
                if resp.status_code != 200:
                    self._raise_status(resp, await _error_body(resp))
                ctype = resp.headers.get("content-type", "")
                if "text/event-stream" not in ctype:
                    raise LLMError(f"expected an event stream, got {ctype or 'no content type'!r}",
                                   status=resp.status_code)
                chunks = await stack.enter_async_context(aclosing(self._chunks(es)))
                pending = []
                async for c in chunks:
                    pending.append(c)
                    if c.text or c.tool_calls or c.usage or c.finish_reason:
                        break
            except httpx.TimeoutException as e:
                raise _Retry(self._scrub(_describe_exc(e)), timeout=True) from None
            except httpx.TransportError as e:
                raise _Retry(self._scrub(f"{_describe_exc(e)} ({self.cfg.base_url})")) from None
            except _Truncated as e:
                raise _Retry(e.cause) from None
            outer.push_async_exit(stack.pop_all())
            return chunks, pending

    def _raise_status(self, resp: httpx.Response, raw: bytes):
        status = resp.status_code
        msg = self._scrub(f"HTTP {status}: {_server_message(resp, raw, self._scrub)}")
        if status == 429 or status >= 500:
            raise _Retry(msg, status=status,
                         retry_after=_retry_after(resp) if status == 429 else None)
        raise self._error(msg, status=status, retryable=False)

    async def _chunks(self, es) -> AsyncIterator[ChatChunk]:
        """Turn SSE events into ChatChunks; the last one carries usage/finish."""
        usage: Usage | None = None
        finish: str | None = None
        done = False
        after = 0  # events read past [DONE]
        async for ev in self._events(es.response):
            data = ev.data.strip()
            if done:
                after += 1
                if after > _MAX_AFTER_DONE:
                    break  # a body that goes on after [DONE]: drop the connection
                continue  # read the body to its end so the connection is reused
            if not data:
                continue
            if data == "[DONE]":
                done = True
                continue
            try:
                chunk, u, f = _parse_event(data, self._scrub)
            except (ValueError, TypeError, AttributeError, OverflowError, RecursionError):
                raise LLMError(f"malformed event from server: {_short(self._scrub(data), 80)!r}") from None
            usage, finish = u or usage, f or finish
            if chunk is not None:
                yield chunk
        if not done and finish is None:
            raise _Truncated("stream interrupted: connection closed before the end of the reply")
        yield ChatChunk(usage=usage, finish_reason=finish)

    async def _events(self, resp: httpx.Response):
        """SSE events of ``resp``, refusing one event (or line) so large that
        buffering it would exceed the reply cap: a server that never sends a
        newline cannot grow the daemon's memory either."""
        limit = 2 * self.cfg.max_reply_bytes + 65536
        lines, decoder = SSELineDecoder(), SSEDecoder()
        pending = 0  # characters held for the event being assembled
        async for text in resp.aiter_text():
            pending += len(text)
            if pending > limit:
                raise LLMReplyTooLarge(f"one server event is larger than {limit} bytes; stopped")
            for line in lines.decode(text):
                ev = decoder.decode(line.rstrip("\n"))
                if ev is not None:
                    yield ev
                    pending = sum(map(len, lines.buffer))
        for line in lines.flush():
            ev = decoder.decode(line.rstrip("\n"))
            if ev is not None:
                yield ev


def _parse_event(data: str, scrub=str) -> tuple[ChatChunk | None, Usage | None, str | None]:
    """One chat.completion.chunk → (content chunk, usage, finish_reason).

    Raises ValueError/TypeError/AttributeError on a malformed event, LLMError
    on an error event.
    """
    obj = json.loads(data)
    if not isinstance(obj, dict):
        raise ValueError("event is not an object")
    if "error" in obj:
        err = obj["error"]
        msg = err.get("message", err) if isinstance(err, dict) else err
        raise LLMError(f"server error in stream: {_short(scrub(str(msg)))}")
    usage = None
    if u := obj.get("usage"):
        usage = Usage.from_server(u.get("prompt_tokens"), u.get("completion_tokens"))
    text, calls, finish = "", [], None
    for choice in obj.get("choices") or ():
        if choice.get("index", 0) != 0:
            continue  # only the first choice is streamed
        delta = choice.get("delta") or {}
        text += delta.get("content") or ""
        calls.extend(delta.get("tool_calls") or ())
        finish = choice.get("finish_reason") or finish
    if not isinstance(text, str):
        raise TypeError("content is not a string")
    chunk = ChatChunk(text=text, tool_calls=list(calls)) if text or calls else None
    return chunk, usage, finish
