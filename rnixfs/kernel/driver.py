"""The contract between the agent loop and every model driver: the chunks a
reply streams, the usage it reports, the errors it raises, and the
``ModelDriver`` Protocol (docs/architecture.md, "Layers").

It lives in the kernel because the loop depends on it; the drivers under
rnixfs/devices/llm implement it (they import this module, never the reverse).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import AsyncIterator, Protocol


@dataclass(frozen=True)
class Usage:
    """Token counts as reported by the server (never estimated from turns)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def from_server(cls, prompt, completion) -> "Usage":
        """Checked counts from a server's reply; LLMError (a driver error, so
        fallbacks apply) for anything but a whole number in [0, MAX_USAGE_TOKENS]."""
        return cls(_count("prompt_tokens", prompt), _count("completion_tokens", completion))

    def check(self) -> "Usage":
        """Raise LLMError unless both counts are sane (see ``from_server``)."""
        return Usage.from_server(self.prompt_tokens, self.completion_tokens)


# No model reads or writes this many tokens in one reply; a larger count is a
# broken or hostile server, and would overflow or defeat the token budgets.
MAX_USAGE_TOKENS = 100_000_000


def _count(name: str, value) -> int:
    if value is None:
        return 0
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_USAGE_TOKENS:
        shown = repr(value) if isinstance(value, (int, float)) else type(value).__name__
        raise LLMError(f"server reported an invalid usage: {name}={shown[:40]} "
                       f"(want a whole number from 0 to {MAX_USAGE_TOKENS})")
    return value


@dataclass(frozen=True)
class ChatChunk:
    """One piece of a streamed reply.

    ``text`` is a content delta (may be empty). The final chunk of a stream
    carries ``usage`` (when the server reports it) and ``finish_reason``.
    ``tool_calls`` is reserved for the agent runtime (OpenAI delta format).
    """

    text: str = ""
    usage: Usage | None = None
    finish_reason: str | None = None
    tool_calls: list[dict] = field(default_factory=list)


class LLMError(Exception):
    """A driver failed: bad status, broken stream, malformed reply.

    ``retryable`` says whether the driver already considered a retry
    (it has, by the time the kernel sees this). ``status`` is the HTTP
    status when there was one.
    """

    def __init__(self, cause: str, *, status: int | None = None, retryable: bool = False):
        super().__init__(cause)
        self.cause = cause
        self.status = status
        self.retryable = retryable


class LLMTimeout(LLMError):
    """The model did not answer in time (connect, read or overall deadline)."""


class LLMReplyTooLarge(LLMError):
    """One reply went past the provider's ``max_reply_bytes``."""


class TextAccumulator:
    """Reply text gathered piece by piece, stored compactly: a reply of
    one-character deltas would otherwise keep one Python string (~50 bytes)
    per character until the step ends. Pieces are joined in blocks, so the
    cost stays linear in the reply."""

    _BLOCK = 512

    def __init__(self):
        self._blocks: list[str] = []
        self._pieces: list[str] = []

    def append(self, piece: str) -> None:
        self._pieces.append(piece)
        if len(self._pieces) >= self._BLOCK:
            self._blocks.append("".join(self._pieces))
            self._pieces.clear()

    def __bool__(self) -> bool:
        return bool(self._blocks or self._pieces)

    def endswith(self, suffix: str) -> bool:
        last = self._pieces[-1] if self._pieces else (self._blocks[-1] if self._blocks else "")
        return last.endswith(suffix)

    def text(self) -> str:
        return "".join(self._blocks) + "".join(self._pieces)

    def clear(self) -> None:
        self._blocks.clear()
        self._pieces.clear()


class ModelDriver(Protocol):
    """What the loop and dev/llm need from a model driver."""

    name: str
    default_model: str

    def stream_chat(
        self,
        messages: list[dict],
        *,
        model: str | None = None,
        max_tokens: int | None = None,
        extra: dict | None = None,
    ) -> AsyncIterator[ChatChunk]:
        """Stream one assistant reply to ``messages`` (OpenAI chat format)."""
        ...

    async def aclose(self) -> None: ...

    def describe(self) -> dict:
        """Public facts for status (type, model, base_url) — never a key."""
        ...
