"""dev/llm/<provider>: one open handle is one conversation.

A write is a message (plain text, or a JSON chat request); the reply
streams into the handle's buffer in the background and reads drain it,
reaching EOF when the reply ends. The next write continues the same
conversation. Kept free of pyfuse3: the adapter only moves bytes.
"""
from __future__ import annotations

import json
import logging
from contextlib import aclosing

import trio

from ...kernel.errors import Code, SyscallError
from .base import LLMError, LLMReplyTooLarge, LLMTimeout, TextAccumulator

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 * 1024
REQUEST_KEYS = {"messages", "model", "max_tokens", "temperature", "top_p", "stop",
                "response_format", "seed"}
ROLES = {"system", "user", "assistant"}


class Conversation:
    def __init__(self, provider, nursery: trio.Nursery, device: str):
        self.provider = provider
        self.device = device
        self._nursery = nursery
        self.messages: list[dict] = []
        self.buffer = bytearray()
        self.cursor = 0
        self.streaming = False
        self.error: SyscallError | None = None
        self.changed = trio.Event()
        self._scope: trio.CancelScope | None = None
        self.closed = False

    def _invalid(self, msg: str) -> SyscallError:
        return SyscallError(Code.INVALID, msg, syscall="Write", device=self.device)

    def send(self, data: bytes) -> None:
        """Queue one message and start streaming the reply."""
        if self.streaming:
            raise SyscallError(Code.BUSY, "a reply is still streaming; read it to the end first",
                               syscall="Write", device=self.device)
        if len(data) > MAX_MESSAGE_BYTES:
            raise SyscallError(Code.TOO_BIG, f"message is {len(data)} bytes; the cap is {MAX_MESSAGE_BYTES}",
                               syscall="Write", device=self.device)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise self._invalid("message is not UTF-8") from None
        if not text.strip():
            raise self._invalid("empty message")
        new, options = self._parse(text)
        self.messages.extend(new)
        self.streaming = True
        self.error = None
        self._nursery.start_soon(self._stream, options)

    def _parse(self, text: str) -> tuple[list[dict], dict]:
        stripped = text.strip()
        if not stripped.startswith("{"):
            return [{"role": "user", "content": stripped}], {}
        try:
            obj = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise self._invalid(f"bad JSON: {exc.msg} at column {exc.colno}") from None
        except RecursionError:
            raise self._invalid("bad JSON: nested too deeply") from None
        if not isinstance(obj, dict):
            raise self._invalid("a JSON message must be an object")
        if "messages" in obj:
            unknown = sorted(set(obj) - REQUEST_KEYS)
            if unknown:
                raise self._invalid(f"unknown request key {unknown[0]!r}")
            msgs = obj["messages"]
            if not isinstance(msgs, list) or not msgs:
                raise self._invalid("messages must be a non-empty list")
            options = {k: v for k, v in obj.items() if k != "messages"}
        else:
            msgs, options = [obj], {}
        for m in msgs:
            if (not isinstance(m, dict) or m.get("role") not in ROLES
                    or not isinstance(m.get("content"), str)):
                raise self._invalid('each message needs "role" (system|user|assistant) and text "content"')
        return [{"role": m["role"], "content": m["content"]} for m in msgs], options

    async def _stream(self, options: dict) -> None:
        model = options.pop("model", None)
        max_tokens = options.pop("max_tokens", None)
        parts = TextAccumulator()
        with trio.CancelScope() as scope:
            self._scope = scope
            if self.closed:  # the handle went away before the stream started
                scope.cancel()
            try:
                stream = self.provider.stream_chat(
                    list(self.messages), model=model, max_tokens=max_tokens, extra=options or None)
                async with aclosing(stream):
                    async for chunk in stream:
                        if chunk.text:
                            parts.append(chunk.text)
                            self.buffer += chunk.text.encode()
                            self._notify()
                self.messages.append({"role": "assistant", "content": parts.text()})
                if parts and not parts.endswith("\n"):
                    self.buffer += b"\n"
            except LLMTimeout as exc:
                self.error = SyscallError(Code.TIMEOUT, exc.cause, syscall="Read", device=self.device)
            except LLMReplyTooLarge as exc:
                self.error = SyscallError(Code.TOO_BIG, exc.cause, syscall="Read", device=self.device)
            except LLMError as exc:
                self.error = SyscallError(Code.DRIVER, exc.cause, syscall="Read", device=self.device)
            except Exception as exc:  # never take the daemon down for one conversation
                log.exception("conversation on %s failed", self.device)
                self.error = SyscallError(Code.INTERNAL, repr(exc)[:200], syscall="Read", device=self.device)
            finally:
                if self.error is not None:
                    log.warning("%s", self.error)
                    self.messages.pop()  # the unanswered message leaves the conversation
                    parts.clear()  # a capped or killed reply's text is not kept
                self.streaming = False
                self._notify()

    def _notify(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    def ready(self) -> bool:
        """True when a read can answer without waiting."""
        return self.cursor < len(self.buffer) or not self.streaming

    def take(self, size: int) -> bytes:
        """Drain up to ``size`` bytes; b"" is EOF; a failed reply raises once."""
        if self.cursor < len(self.buffer):
            data = bytes(self.buffer[self.cursor:self.cursor + size])
            self.cursor += len(data)
            if self.cursor >= 65536 and self.cursor * 2 >= len(self.buffer):
                del self.buffer[:self.cursor]  # what was read is not kept
                self.cursor = 0
            return data
        if self.error is not None:
            err, self.error = self.error, None
            raise err
        return b""

    def close(self) -> None:
        self.closed = True
        self.buffer = bytearray()  # the handle is gone: so are its bytes
        self.cursor = 0
        if self._scope is not None:
            self._scope.cancel()
