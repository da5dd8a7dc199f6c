"""Tool grants: what a process may call, and on what (see docs/skills.md, "Grants").

A process's allow-list holds entries as Claude Code writes them:

* ``Read`` — the whole tool;
* ``Bash(git:*)`` / ``Bash(npm run test:*)`` — a command whose first words
  are the prefix; ``Bash(git status)`` — exactly that command;
  ``Bash(git log *)`` — a wildcard over the whole command;
* ``Read(src/**)`` / ``Write(docs/*.md)`` — a path pattern, relative to the
  project (gitignore style: ``**`` any depth, ``*`` within one name, a
  pattern without ``/`` matches the name at any depth).

An empty list means unrestricted. A scoped Bash grant allows a command line
only if every simple command in it (split at ``&&``, ``||``, ``;``, ``|``,
``&``, newlines, inside subshells, ``$(…)``, backticks and ``<(…)``)
matches; anything the fail-closed tokenizer below does not understand
(here-documents, ``${…}``, arithmetic, shell keywords, assignments, file
redirections other than ``/dev/null``) is denied.

Protected paths (``.rnix/``, ``.agents/skills/``, ``.mcp.json``, and the
trust marker inside ``.rnix/``) hold an agent's own limits: Write and Edit
refuse them unless a grant names them explicitly (``Write(.rnix/**)``), and
a Bash command that names one is refused unless it only reads.
"""
from __future__ import annotations

import fnmatch
import re
import shlex
from dataclasses import dataclass

NO_TOOLS = "(none)"  # an entry no tool has: the allow-list is restricted to nothing
PROTECTED = (".rnix", ".agents/skills", ".mcp.json")
_PROTECTED_HEADS = (".rnix", ".agents", ".mcp.json")
# Commands that only read: a Bash line naming a protected path may use these.
READ_ONLY_COMMANDS = frozenset({
    "cat", "head", "tail", "ls", "grep", "egrep", "fgrep", "rg", "wc", "stat", "file",
    "diff", "cmp", "md5sum", "sha1sum", "sha256sum", "jq", "less", "more", "tree", "echo",
    "printf", "true", "test", "[", "realpath", "readlink", "basename", "dirname", "pwd",
})
_ENTRY_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_.-]*)\((.*)\)", re.S)


@dataclass(frozen=True)
class Grant:
    tool: str
    pattern: str | None  # None: the whole tool

    def __str__(self) -> str:
        return self.tool if self.pattern is None else f"{self.tool}({self.pattern})"


def parse_grant(entry: str) -> Grant:
    entry = entry.strip()
    m = _ENTRY_RE.fullmatch(entry)
    if not m:
        return Grant(entry, None)
    tool, pattern = m.group(1), m.group(2).strip()
    return Grant(tool, None if pattern in ("*", "**") else pattern)


class Grants:
    """A parsed allow-list ([] = unrestricted)."""

    def __init__(self, entries):
        self.entries = [parse_grant(e) for e in entries or () if isinstance(e, str) and e.strip()]

    @property
    def unrestricted(self) -> bool:
        return not self.entries

    def allows_tool(self, tool: str) -> bool:
        if self.unrestricted or any(g.tool == tool for g in self.entries):
            return True
        # MCP tools: mcp__<server>__<tool>, or a pattern like mcp__<server>__*
        return tool.startswith("mcp__") and any(
            g.tool.startswith("mcp__") and g.pattern is None and fnmatch.fnmatchcase(tool, g.tool)
            for g in self.entries)

    def patterns(self, tool: str) -> list[str] | None:
        """None: every use of ``tool`` is allowed; else the patterns that limit it."""
        if self.unrestricted:
            return None
        mine = [g for g in self.entries if g.tool == tool]
        if any(g.pattern is None for g in mine):
            return None
        return [g.pattern for g in mine]

    def names_protected(self, tool: str, rel: str) -> bool:
        """A grant for ``tool`` names the protected area ``rel`` is in, explicitly."""
        for g in self.entries:
            if g.tool != tool or g.pattern is None:
                continue
            head = _clean(g.pattern).split("/")[0]
            if head in _PROTECTED_HEADS and path_matches(g.pattern, rel):
                return True
        return False

    def check_path(self, tool: str, rel: str) -> str | None:
        """Why ``tool`` may not touch workspace path ``rel`` (None: it may)."""
        pats = self.patterns(tool)
        if pats is not None and not any(path_matches(p, rel) for p in pats):
            return f"{tool} of {rel} is not allowed (granted: {', '.join(f'{tool}({p})' for p in pats)})"
        return None

    def check_command(self, command: str) -> str | None:
        """Why Bash may not run ``command`` (None: it may)."""
        pats = self.patterns("Bash")
        if pats is None:
            return None
        try:
            simple = split_commands(command)
        except Unparsed as exc:
            return f"command not allowed: {exc} (a scoped Bash grant only runs what it can parse)"
        granted = ", ".join(f"Bash({p})" for p in pats)
        for words in simple:
            if not any(command_matches(p, words) for p in pats):
                return f"command {' '.join(words)[:120]!r} is not allowed (granted: {granted})"
        return None


# -- paths ---------------------------------------------------------------------------------

def _clean(pattern: str) -> str:
    p = pattern.strip()
    while p.startswith("./"):
        p = p[2:]
    return p.lstrip("/")


def _glob_regex(pattern: str) -> str:
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = pattern.find("]", i + 1)
            if j < 0:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1:j].replace("\\", "\\\\")
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append(f"(?!/)[{body}]")
                i = j
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def path_matches(pattern: str, rel: str) -> bool:
    """gitignore-style match of a workspace-relative path."""
    p = _clean(pattern)
    rel = rel.strip("/")
    if not p:
        return False
    if p.endswith("/"):
        p += "**"
    rx = _glob_regex(p)
    if "/" not in p:
        rx = "(?:.*/)?" + rx  # a bare name matches at any depth
    try:
        return re.fullmatch(rx + "(?:/.*)?" if not p.endswith("**") else rx, rel) is not None
    except re.error:
        return False


def protected(rel: str) -> bool:
    """Is a canonical workspace-relative path one of an agent's own limits?"""
    rel = rel.strip("/")
    return any(rel == p or rel.startswith(p + "/") for p in PROTECTED)


_DOT_GLOB = re.compile(r"(?:^|[\s/'\"=])\.[^\s/]*[*?\[]")
_PROBES = {".rnix": ".rnix/x", ".agents": ".agents/skills/x", ".mcp.json": ".mcp.json"}


def check_bash_protected(command: str, grants: Grants | None = None) -> str | None:
    """Best effort: a command naming a protected path may only read it,
    unless a Write grant names every protected area it mentions."""
    if _DOT_GLOB.search(command):   # `.*`, `.r?ix`: may expand to any of them
        mentioned = list(_PROBES.values())
    else:
        mentioned = [probe for head, probe in _PROBES.items() if head in command]
    if not mentioned:
        return None
    if grants is not None and all(grants.names_protected("Write", p) for p in mentioned):
        return None
    why = ("commands that name .rnix/, .agents/skills/ or .mcp.json may only read them "
           "(an agent may not change its own limits)")
    try:
        simple = split_commands(command, allow_redirects=False)
    except Unparsed:
        return why
    for words in simple:
        if words[0].rsplit("/", 1)[-1] not in READ_ONLY_COMMANDS:
            return why
    return None


# -- commands ------------------------------------------------------------------------------

class Unparsed(Exception):
    """The command line uses shell syntax the grant checker does not follow."""


_KEYWORDS = frozenset({"if", "then", "else", "elif", "fi", "for", "while", "until", "do", "done",
                       "case", "esac", "select", "function", "{", "}", "!", "[[", "]]", "time",
                       "coproc", "eval", "exec", "source", ".", "alias", "builtin", "command"})
_ASSIGN_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?=")
_REDIRECT_RE = re.compile(r"(\d*)(&>>?|>&|<&|<<|<>|>\||>>|>|<)")


class _Scanner:
    """A small fail-closed reader of bash syntax: enough to find every
    simple command, never enough to be fooled (unknown syntax raises)."""

    def __init__(self, text: str, allow_redirects: bool):
        self.s = text
        self.i = 0
        self.allow_redirects = allow_redirects
        self.commands: list[list[str]] = []

    def peek(self, n: int = 1) -> str:
        return self.s[self.i:self.i + n]

    def parse_list(self, close: str | None) -> None:
        words: list[str] = []
        expect_command = True   # after an operator a command must follow (no `a && && b`)
        while True:
            if self.i >= len(self.s):
                if close is not None:
                    raise Unparsed(f"missing {close!r}")
                break
            c = self.s[self.i]
            if close is not None and c == close:
                self.i += 1
                break
            if c in " \t":
                self.i += 1
            elif c == "\\" and self.peek(2) == "\\\n":
                self.i += 2
            elif c == "#" and not words:
                while self.i < len(self.s) and self.s[self.i] != "\n":
                    self.i += 1
            elif c in ";&|\n" and not self.s.startswith("&>", self.i):
                op = c
                self.i += 1
                if self.peek() in "&|" and self.peek() and c in "&|":
                    op += self.s[self.i]
                    self.i += 1
                if op in (";;", ";&", "|&&"):
                    raise Unparsed(f"operator {op!r}")
                if words:
                    self._finish(words)
                    words = []
                elif expect_command and op != "\n" and (op not in (";", "&") or self.commands or close):
                    raise Unparsed(f"empty command before {op!r}")
                expect_command = op not in (";", "&", "\n")
            elif c == "(":
                if words:
                    raise Unparsed("'(' inside a command")
                if self.peek(2) == "((":
                    raise Unparsed("arithmetic")
                self.i += 1
                self.parse_list(")")
                expect_command = False
                while self.i < len(self.s) and self.s[self.i] in " \t":
                    self.i += 1
                if self.i < len(self.s) and self.s[self.i] not in ";&|\n)":
                    raise Unparsed("text after a subshell")
            elif c == ")":
                raise Unparsed("unbalanced ')'")
            elif c in "<>" or s_redirect(self.s, self.i):
                self._redirect()
            else:
                word = self._word()
                if word is not None:
                    if not words and _ASSIGN_RE.match(word):
                        raise Unparsed("variable assignment before a command")
                    words.append(word)
                    expect_command = False
        if words:
            self._finish(words)
        elif expect_command and self.commands and close is None:
            raise Unparsed("line ends with an operator")

    def _finish(self, words: list[str]) -> None:
        if words[0] in _KEYWORDS:
            raise Unparsed(f"shell keyword {words[0]!r}")
        self.commands.append(words)

    def _redirect(self) -> None:
        s = self.s
        m = _REDIRECT_RE.match(s, self.i)
        if m is None:
            raise Unparsed("redirection")
        fd, op = m.group(1), m.group(2)
        if op == "<<":
            raise Unparsed("here-document")
        if op in ("<", ">") and not fd and s[m.end():m.end() + 1] == "(":
            self.i = m.end() + 1          # process substitution: its commands count too
            self.parse_list(")")
            return
        self.i = m.end()
        while self.i < len(s) and s[self.i] in " \t":
            self.i += 1
        target = self._word(redirect_ok=False) or ""
        if not target:
            raise Unparsed("redirection without a target")
        if target == "/dev/null" or (op in (">&", "<&") and re.fullmatch(r"\d+|-", target)):
            return
        if self.allow_redirects and op in ("<",):
            return
        raise Unparsed(f"redirection {m.group(0)}{target}")

    def _word(self, redirect_ok: bool = True) -> str | None:
        out: list[str] = []
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c in " \t\n;&|()<>":
                # a digit just before < or > is a redirection's fd, handled by the caller
                break
            if c == "\\":
                if self.i + 1 >= len(s):
                    raise Unparsed("trailing backslash")
                out.append(s[self.i + 1])
                self.i += 2
            elif c == "'":
                j = s.find("'", self.i + 1)
                if j < 0:
                    raise Unparsed("unterminated quote")
                out.append(s[self.i + 1:j])
                self.i = j + 1
            elif c == '"':
                self.i += 1
                while True:
                    if self.i >= len(s):
                        raise Unparsed("unterminated quote")
                    d = s[self.i]
                    if d == '"':
                        self.i += 1
                        break
                    if d == "\\" and self.i + 1 < len(s):
                        out.append(s[self.i + 1])
                        self.i += 2
                    elif d in "$`":
                        out.append(self._expansion())
                    else:
                        out.append(d)
                        self.i += 1
            elif c in "$`":
                out.append(self._expansion())
            else:
                out.append(c)
                self.i += 1
        return "".join(out)

    def _expansion(self) -> str:
        s = self.s
        if s[self.i] == "`":
            j = s.find("`", self.i + 1)
            if j < 0 or "\\" in s[self.i + 1:j]:
                raise Unparsed("backtick substitution")
            inner = _Scanner(s[self.i + 1:j], self.allow_redirects)
            inner.parse_list(None)
            self.commands.extend(inner.commands)
            self.i = j + 1
            return "`…`"
        nxt = s[self.i + 1:self.i + 2]
        if nxt == "(":
            if s[self.i + 2:self.i + 3] == "(":
                raise Unparsed("arithmetic expansion")
            self.i += 2
            self.parse_list(")")
            return "$(…)"
        if nxt in ("{", "["):
            raise Unparsed("parameter expansion ${…}")
        m = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*|[0-9#?$!@*-])?").match(s, self.i)
        self.i = m.end()
        return m.group(0)


def s_redirect(s: str, i: int) -> bool:
    """A redirection starts at ``i`` (``2>``, ``&>``) rather than a word or operator."""
    return re.compile(r"\d+[<>]|&>").match(s, i) is not None


def split_commands(command: str, *, allow_redirects: bool = True) -> list[list[str]]:
    """Every simple command of a bash line as its words; Unparsed otherwise."""
    if "\0" in command:
        raise Unparsed("NUL byte")
    sc = _Scanner(command, allow_redirects)
    sc.parse_list(None)
    if not sc.commands:
        raise Unparsed("no command")
    return sc.commands


def command_matches(pattern: str, words: list[str]) -> bool:
    """Does one simple command match a Bash grant's pattern?"""
    if any("$" in w or "`" in w for w in words[:1]):
        return False  # the command name must be literal
    p = pattern.strip()
    try:
        if p.endswith(":*"):
            prefix = shlex.split(p[:-2])
            return bool(prefix) and words[:len(prefix)] == prefix
        if "*" in p:
            return fnmatch.fnmatchcase(" ".join(words), p)
        return words == shlex.split(p)
    except ValueError:
        return False


def intersect(child: list[str], parent: list[str]) -> list[str]:
    """A child's grants within its parent's ([] = unrestricted on either side)."""
    if not parent:
        return sorted(set(child))
    if not child:
        return sorted(set(parent))
    c, p = Grants(child), Grants(parent)
    out: set[str] = set()
    for tool in {g.tool for g in c.entries} & {g.tool for g in p.entries}:
        cp, pp = c.patterns(tool), p.patterns(tool)
        if cp is None and pp is None:
            out.add(tool)
        elif cp is None:
            out.update(f"{tool}({x})" for x in pp)
        elif pp is None:
            out.update(f"{tool}({x})" for x in cp)
        else:
            out.update(f"{tool}({x})" for x in set(cp) & set(pp))  # fail closed
    return sorted(out)


def union(*groups: list[str]) -> list[str]:
    """Sorted union of allow-lists, without the no-tools marker."""
    return sorted({e for g in groups for e in g if e != NO_TOOLS})


def tool_names(entries: list[str]) -> set[str]:
    return {g.tool for g in Grants(entries).entries}
