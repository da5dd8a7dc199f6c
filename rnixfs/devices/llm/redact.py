"""Secrets out of every string that leaves a driver: one Redactor per mount.

Built from providers.yaml (``ProvidersConfig.secret_values``: every
``${ENV}`` value, API keys, header values, ``base_url`` credentials) and
applied at the driver boundary (``guard.GuardedProvider``), to the daemon's
status (xattr, ``rnixfs status``) and to its log handler. A server may quote
the key back in an error, a malformed event, or the reply itself; none of it
reaches the trace, the events, the store or daemon.log.
"""
from __future__ import annotations

import logging
import re
from typing import Iterable

MASK = "***"
MIN_SECRET = 4  # shorter values would mask ordinary words everywhere
_USERINFO = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)[^/?#@\s]+@")


class Redactor:
    """Replaces each configured secret, and any URL's userinfo, by ``***``."""

    def __init__(self, secrets: Iterable[str] = ()):
        self.secrets = sorted({s for s in secrets if s and len(s) >= MIN_SECRET},
                              key=len, reverse=True)
        self._re = re.compile("|".join(map(re.escape, self.secrets))) if self.secrets else None

    @classmethod
    def from_config(cls, cfg) -> "Redactor":
        return cls(cfg.secret_values())

    def __call__(self, text: str) -> str:
        if not isinstance(text, str):
            text = str(text)
        if self._re is not None:
            text = self._re.sub(MASK, text)
        if "@" in text:
            text = _USERINFO.sub(rf"\1{MASK}@", text)
        return text

    def data(self, obj):
        """``obj`` (JSON-like) with every string, key or value, redacted."""
        if isinstance(obj, str):
            return self(obj)
        if isinstance(obj, dict):
            return {self.data(k) if isinstance(k, str) else k: self.data(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self.data(v) for v in obj]
        return obj

    def stream(self) -> "StreamRedactor":
        return StreamRedactor(self)


class StreamRedactor:
    """Redacts text that arrives in pieces: a secret split across two chunks
    is still caught, by holding back a tail that could begin one."""

    def __init__(self, redactor: Redactor):
        self._r = redactor
        self._carry = ""

    def feed(self, text: str) -> str:
        r = self._r
        if r._re is None:
            return text
        buf = self._carry + text
        hold = len(buf) - _prefix_suffix(buf, r.secrets)
        for m in reversed(list(r._re.finditer(buf))):  # a match across the cut waits too
            if m.start() < hold < m.end():
                hold = m.start()
        self._carry = buf[hold:]
        return r._re.sub(MASK, buf[:hold])

    def flush(self) -> str:
        """What is still held back, redacted (the stream ended)."""
        carry, self._carry = self._carry, ""
        return self._r(carry) if carry else ""


def _prefix_suffix(text: str, secrets: list[str]) -> int:
    """Length of the longest end of ``text`` that a secret (longer than that
    end) begins with: it may still grow into a secret."""
    longest = min(len(text), max((len(s) for s in secrets), default=1) - 1)
    for k in range(longest, 0, -1):
        end = text[-k:]
        if any(len(s) > k and s.startswith(end) for s in secrets):
            return k
    return 0


class RedactingFilter(logging.Filter):
    """On a log handler: no record it writes carries a secret (message,
    arguments, or traceback)."""

    def __init__(self, redactor: Redactor):
        super().__init__()
        self.redact = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # a bad format string: keep what we can
            msg = str(record.msg)
        record.msg, record.args = self.redact(msg), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)
        return True


def install_log_filter(redactor: Redactor) -> RedactingFilter:
    """Add the filter to every handler of the root logger; returns it so the
    caller can remove it again."""
    f = RedactingFilter(redactor)
    for h in logging.getLogger().handlers:
        h.addFilter(f)
    return f


def remove_log_filter(f: RedactingFilter) -> None:
    for h in logging.getLogger().handlers:
        h.removeFilter(f)
