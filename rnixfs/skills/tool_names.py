"""allowed-tools: semantic tool names, legacy device paths, unions.

A skill's ``allowed-tools`` (and an agent's ``tools``) name the tools the
model may call: ``Read Write Edit Glob Grep Bash`` ... (the Claude Code
canonical names Rnix adopted). Older skills list device paths
(``/dev/fs /dev/shell``); those are normalized to the tool names the device
exposes. Anything else (unknown names, ``Bash(git:*)`` patterns, unknown
device paths) is kept verbatim: scoped entries are enforced by
``rnixfs.kernel.grants``; an unknown name grants nothing a kernel does not
recognize, but keeps the declaration non-empty, so a skill that restricts
tools can never become unrestricted by a typo (fail closed).

The union of the loaded skills' tools plus the agent's ``tools`` is the
process's allow-list; an empty union means unrestricted.
"""
from __future__ import annotations

from collections.abc import Iterable

# Tool names each legacy device root exposes (Rnix: /dev/fs exposes
# Read/Write/Edit/Grep/Glob, /dev/shell exposes Bash, ...).
DEVICE_TOOLS: dict[str, tuple[str, ...]] = {
    "/dev/fs": ("Read", "Write", "Edit", "Glob", "Grep"),
    "/dev/shell": ("Bash",),
    "/dev/web": ("WebFetch", "WebSearch"),
    "/dev/lsp": ("LSP",),
    "/dev/tty": ("AskUserQuestion",),
    "/dev/tasks": ("TaskCreate", "TaskGet", "TaskList", "TaskUpdate"),
    "/dev/cron": ("CronCreate", "CronDelete", "CronList"),
}

# The semantic vocabulary rnixfs knows (documentation and `skill validate`
# hints; unknown names are still accepted and kept verbatim).
KNOWN_TOOLS: frozenset[str] = frozenset(
    {t for tools in DEVICE_TOOLS.values() for t in tools}
    | {"Agent", "Skill", "ToolSearch"}
)


def split_tools(value) -> list[str]:
    """``allowed-tools`` as written (string or list) -> list of entries."""
    if value is None:
        return []
    if isinstance(value, str):
        return _split_entries(value)
    if isinstance(value, (list, tuple)):
        # A list entry is one tool (it may contain spaces: "Bash(git log:*)").
        return [item.strip() for item in value if isinstance(item, str) and item.strip()]
    raise TypeError("allowed-tools must be a string or a list of strings")


def _split_entries(text: str) -> list[str]:
    """Split at commas and blanks outside parentheses: Claude Code writes
    ``Read, Grep, Bash(git log:*)``; the agentskills form is space-separated."""
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")" and depth:
            depth -= 1
        if depth == 0 and (ch == "," or ch.isspace()):
            if cur:
                out.append("".join(cur))
                cur = []
            continue
        cur.append(ch)
    if cur:
        out.append("".join(cur))
    return out


def normalize_tools(values: Iterable[str]) -> list[str]:
    """Map legacy device paths to tool names; keep order, drop duplicates."""
    out: list[str] = []
    seen: set[str] = set()
    for raw in values:
        value = raw.strip()
        if not value:
            continue
        key = value.rstrip("/") if value.startswith("/dev/") else value
        names = DEVICE_TOOLS.get(key, (value,))
        for name in names:
            if name not in seen:
                seen.add(name)
                out.append(name)
    return out


def union_tools(*groups: Iterable[str]) -> list[str]:
    """Sorted, de-duplicated union of normalized tool lists ([] = unrestricted)."""
    merged: set[str] = set()
    for group in groups:
        merged.update(normalize_tools(group))
    return sorted(merged)
