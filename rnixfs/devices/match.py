"""Linear-time matching for Grep and Glob.

A model chooses Grep's regex and Glob's pattern. Python's ``re`` backtracks:
``(a*)*b`` on 34 ``a``\\ s takes hours, and ``_sre`` holds the GIL all that
time, so a match running in a worker thread still freezes the daemon's trio
thread (every FUSE operation, ``kill`` included). Every pattern that comes
from a tool is therefore compiled with RE2 (the ``google-re2`` wheel), whose
matching time is linear in the text whatever the pattern: no input can stall
the daemon for longer than one pass over the bytes it reads.

RE2 is Python's ``re`` syntax minus what needs backtracking: backreferences
(``\\1``), lookaround (``(?=…)``, ``(?<!…)``), possessive or atomic groups
and ``\\Z`` (RE2 spells it ``\\z``; we translate a trailing ``\\Z``). Such a
pattern is refused as INVALID with a reason saying so. ``\\d``, ``\\w``,
``\\s`` and ``\\b`` are ASCII in RE2. See docs/devices.md.

Globs are translated to RE2 regexes (``*`` = ``[^/]*``); matching a whole
name or path is one linear pass as well.
"""
from __future__ import annotations

import re

import re2

MAX_PATTERN = 4096         # characters of a Grep regex or a Glob pattern
MAX_MEM = 16 << 20         # RE2's compiled-program budget; a bigger pattern is refused

_OPTIONS_CACHE: dict[bool, "re2.Options"] = {}


class PatternError(ValueError):
    """The pattern is not one we can match in linear time; ``str()`` says why."""


def _options(ignore_case: bool) -> "re2.Options":
    opts = _OPTIONS_CACHE.get(ignore_case)
    if opts is None:
        opts = re2.Options()
        opts.log_errors = False          # RE2 would print every refusal to stderr
        opts.max_mem = MAX_MEM
        opts.case_sensitive = not ignore_case
        _OPTIONS_CACHE[ignore_case] = opts
    return opts


def _reason(exc: Exception) -> str:
    msg = exc.args[0] if exc.args else exc
    if isinstance(msg, bytes):
        msg = msg.decode("utf-8", "replace")
    return str(msg)


# Python spellings RE2 lacks, after an even number of backslashes: \uXXXX,
# \UXXXXXXXX and \Z become \x{…} and \z.
_PY_ESCAPES = re.compile(r"(?<!\\)((?:\\\\)*)\\(u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|Z)")


def _translate(m: re.Match) -> str:
    esc = m.group(2)
    return m.group(1) + ("\\z" if esc == "Z" else "\\x{%s}" % esc[1:])


_UNSUPPORTED = re.compile(r"\\[1-9]|\(\?[=!]|\(\?<[=!]|\(\?>|\(\?P=|[*+?}][+]")


def compile_regex(pattern: str, *, ignore_case: bool = False):
    """A compiled RE2 regex (``.search(str)``) for a tool's pattern, or PatternError."""
    if not isinstance(pattern, str):
        raise PatternError(f"pattern must be text, not {type(pattern).__name__}")
    if len(pattern) > MAX_PATTERN:
        raise PatternError(f"pattern is {len(pattern)} characters; the cap is {MAX_PATTERN}")
    if "\0" in pattern:
        raise PatternError("NUL character in pattern")
    text = _PY_ESCAPES.sub(_translate, pattern)
    try:
        return re2.compile(text, _options(ignore_case))
    except re2.error as exc:
        why = _reason(exc)
        if _UNSUPPORTED.search(pattern):
            why += (" (backreferences, lookaround and possessive or atomic groups are not"
                    " supported: patterns are matched in linear time by RE2)")
        raise PatternError(why) from None
    except (TypeError, ValueError, OverflowError, MemoryError) as exc:
        raise PatternError(str(exc)) from None


def compile_full(regex: str):
    """A compiled RE2 regex for a glob translation, used with ``.fullmatch``."""
    try:
        return re2.compile(regex, _options(False))
    except re2.error as exc:
        raise PatternError(_reason(exc)) from None


def matchable(name: str) -> str:
    """``name`` as RE2 can take it: a file name that is not UTF-8 (os.listdir's
    surrogate escapes) has each undecodable byte replaced by U+FFFD, which
    ``?``, ``*`` and ``.`` match like any other character."""
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
