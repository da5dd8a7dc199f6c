"""Untrusted text made safe for a terminal, and tables that stay aligned.

Names, descriptions, intents, paths and error messages come from SKILL.md
files, agent manifests, models and the file system. Printed raw, an escape
sequence in them can clear the screen, move the cursor or rewrite earlier
lines, ``\\r`` can hide text, a newline can forge a table row and a bidi
override can reorder what the reader sees. Every *human* output of the CLI
passes through :func:`clean` (or :func:`block` for multi-line text); the
``--json`` outputs do not (``json.dumps`` already escapes control
characters, and JSON must stay exact).

Escaped characters are shown as Python-style escapes (``\\x1b``, ``\\r``,
``\\n``, ``\\x9b``, ``\\u202e``): C0 and C1 controls, DEL, the bidi
controls, line/paragraph separators and lone surrogates (undecodable bytes
in file names). A backslash already in the text is left alone: human output
is for reading, ``--json`` is for round trips.

Column widths are display widths (``wcwidth``: East Asian wide characters
count two, combining marks zero). A cell wider than its column is cut with
``...`` so a long name never shifts the columns after it.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from wcwidth import wcwidth

ELLIPSIS = "..."

_NAMED = {"\a": "\\a", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\v": "\\v", "\f": "\\f", "\r": "\\r"}
# C0 controls, DEL and C1 controls; bidi embeddings/overrides/isolates and
# marks (Trojan Source); line and paragraph separators; the byte-order mark;
# lone surrogates (undecodable bytes in file names).
_OTHERS = r"\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff\ud800-\udfff"
_UNSAFE = re.compile(rf"[\x00-\x1f{_OTHERS}]")
_UNSAFE_IN_BLOCK = re.compile(rf"[\x00-\x08\x0b-\x1f{_OTHERS}]")     # keeps \t and \n


def _escape(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    cp = ord(ch)
    return f"\\x{cp:02x}" if cp <= 0xFF else f"\\u{cp:04x}"


def _sub(m: re.Match) -> str:
    return _escape(m.group())


def clean(text: object) -> str:
    """One line of text with every unsafe character escaped (see module doc)."""
    s = text if isinstance(text, str) else str(text)
    return _UNSAFE.sub(_sub, s)


def block(text: object) -> str:
    """Multi-line text (a body, a trace): newlines (CRLF too) and tabs kept, the rest escaped."""
    s = (text if isinstance(text, str) else str(text)).replace("\r\n", "\n")
    return _UNSAFE_IN_BLOCK.sub(_sub, s)


def json_text(encoded: str) -> str:
    """JSON text (from ``json.dumps(..., ensure_ascii=False)``) with the
    characters JSON leaves raw but a terminal acts on (C1 controls, DEL,
    bidi controls, lone surrogates) written as ``\\uXXXX``: the same value
    once parsed, so ``--json`` stays exact."""
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", encoded)


def one_line(text: object) -> str:
    """Whitespace runs (newlines included) folded to one space, then cleaned."""
    s = text if isinstance(text, str) else str(text)
    return clean(" ".join(s.split()))


def width(text: str) -> int:
    """Display width of already-cleaned text (unknown characters count one)."""
    return sum(_cw(c) for c in text)


def _cw(c: str) -> int:
    w = wcwidth(c)
    return 1 if w < 0 else w


def truncate(text: str, limit: int) -> str:
    """Cut cleaned text to ``limit`` display columns, ending in ``...`` if cut."""
    if width(text) <= limit:
        return text
    if limit <= len(ELLIPSIS):
        return ELLIPSIS[:limit]
    out, used, room = [], 0, limit - len(ELLIPSIS)
    for c in text:
        w = _cw(c)
        if used + w > room:
            break
        out.append(c)
        used += w
    return "".join(out) + ELLIPSIS


def pad(text: str, cols: int) -> str:
    return text + " " * max(0, cols - width(text))


@dataclass(frozen=True)
class Column:
    """A table column: header, minimum and maximum display width; ``fold``
    turns whitespace runs into one space (descriptions) instead of escaping
    newlines (names, where a newline is part of the value)."""

    header: str
    min: int = 0
    max: int = 80
    fold: bool = False


def table(columns: Sequence[Column], rows: Iterable[Sequence[object]], *,
          prefix: str = "", sep: str = " ") -> list[str]:
    """Aligned lines: header first, every cell cleaned (one line) and cut to
    its column's maximum; the last column is cut but never padded."""
    cells = [[truncate(one_line(v) if c.fold else clean(v), c.max) for v, c in zip(row, columns)]
             for row in rows]
    cells.insert(0, [c.header for c in columns])
    widths = [max([c.min] + [width(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = []
    for r in cells:
        parts = [pad(v, w) for v, w in zip(r[:-1], widths[:-1])] + [r[-1]]
        line = sep.join(parts).rstrip()
        lines.append(f"{prefix}{sep}{line}" if prefix else line)
    return lines
