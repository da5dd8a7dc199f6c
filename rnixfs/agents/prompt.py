"""The system prompt of a process: instructions, AGENTS.md, skills.

Order (Rnix): agent instructions, then the project document (the nearest
AGENTS.md), then skills: each loaded skill's body after a
``Base directory for this skill: <dir>`` line, then the ``[Skill Synergy]``
block, then the list of other available skills by metadata (name,
description, location; the agentskills.io ``<available_skills>`` form),
capped by a token budget (``RNIXFS_SKILL_CATALOG_TOKENS``, default 8000;
tokens estimated as UTF-8 bytes / 4): what does not fit is counted and the
model is told to find it with the Skill tool (docs/skills.md, "Progressive
loading"). Skills with ``disable-model-invocation: true`` are never listed.
``build_system_prompt`` is a pure function of its inputs, so a prompt built
once at spawn from frozen inputs is byte-identical at every step.
"""
from __future__ import annotations

import html
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..fileio import NotRegularFile, ScopeEscape, read_in_scope
from ..skills.model import Skill, SkillNotFound
from ..skills.tool_names import union_tools
from .manifest import AgentManifest

log = logging.getLogger(__name__)

AGENTS_MD = "AGENTS.md"
PROJECT_DOC_BUDGET = 64 * 1024
PROJECT_DOC_HEADER = "# Project Instructions (AGENTS.md)"
SYNERGY_HEADER = "[Skill Synergy]"
CATALOG_TOKENS = 8000
CATALOG_ENV = "RNIXFS_SKILL_CATALOG_TOKENS"
CATALOG_DESCRIPTION_CUT = 250   # characters of a description once the catalog is over budget
CATALOG_INTRO = ("The following skills are available. To use one, call the Skill tool with its "
                 "name (or read its SKILL.md at the location given); its other files are readable "
                 "under the same directory.")


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def project_doc(cwd: Path, project_root: Path, budget: int = PROJECT_DOC_BUDGET) -> str | None:
    """The nearest AGENTS.md from ``cwd`` up to ``project_root`` (inclusive).

    Never looks above the project root, nor outside it (a ``cwd`` outside the
    project, or an AGENTS.md symlink leading out, gives None). Each candidate
    is read with the fd-relative walk from the project root (rnixfs.fileio
    ``read_in_scope``), so a directory swapped for a symlink between the
    check and the read cannot put an outside file into a prompt. Only the
    name ``AGENTS.md`` counts. Text above ``budget`` bytes is cut on a UTF-8
    boundary and ends with ``[truncated: AGENTS.md exceeded <budget> bytes]``.
    Unreadable files degrade to None (the spawn goes on without).
    """
    root = os.path.abspath(project_root)
    d = os.path.abspath(cwd)
    if not _within(d, root):
        try:  # a cwd spelled through a symlink; realpath may race (EINVAL): give up then
            root, d = os.path.realpath(project_root), os.path.realpath(cwd)
        except OSError:
            return None
        if not _within(d, root):
            return None
    while True:
        candidate = os.path.join(d, AGENTS_MD)
        try:
            data, _ = read_in_scope(root, candidate, budget, head=True)  # over budget: cut below
        except ScopeEscape:
            log.warning("[project_doc] %s leaves the project; ignored", candidate)
            return None
        except (FileNotFoundError, NotRegularFile):
            data = None
        except OSError as exc:
            log.warning("[project_doc] %s unreadable (%s); ignored", candidate, exc.strerror or exc)
            return None
        if data is not None:
            return _decode_doc(candidate, data, budget)
        if d == root:
            return None
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


def _decode_doc(path: str, data: bytes, budget: int) -> str:
    if len(data) <= budget:
        return data.decode("utf-8", errors="replace")
    cut = data[:budget]
    cut = cut[: len(cut) - _partial_tail(cut)]   # never split a multi-byte character
    log.warning("[project_doc] %s exceeded soft cap %d bytes, truncated", path, budget)
    return cut.decode("utf-8", errors="replace") + f"\n\n[truncated: AGENTS.md exceeded {budget} bytes]"


def _partial_tail(b: bytes) -> int:
    """How many bytes at the end of ``b`` are an incomplete UTF-8 sequence."""
    for i in range(1, min(4, len(b)) + 1):
        c = b[-i]
        if c & 0xC0 == 0x80:        # continuation byte: keep looking for the lead byte
            continue
        if c & 0x80 == 0:
            return 0
        need = 2 if c & 0xE0 == 0xC0 else 3 if c & 0xF0 == 0xE0 else 4 if c & 0xF8 == 0xF0 else 1
        return i if i < need else 0
    return 0


def select_skills(agent: AgentManifest | None, resolution, requested: Sequence[str] = (),
                  *, list_available: bool = True) -> tuple[list[Skill], list[Skill]]:
    """(loaded, available) skills for a spawn.

    Loaded: the agent's ``skills`` then the request's, in order, without
    repeats; an unknown or invalid name raises SkillNotFound/SkillInvalid.
    Available: the agent's ``deferred_skills`` if it declares any (unknown
    ones raise too), else every other loadable skill; sorted by name.
    """
    names: list[str] = []
    for n in list(agent.skills if agent else []) + list(requested):
        if n not in names:
            names.append(n)
    loaded: list[Skill] = []
    for n in names:     # a frontmatter name and a directory name may be one skill
        s = resolution.require(n)
        if s not in loaded:
            loaded.append(s)
    if not list_available:
        return loaded, []
    if agent is not None and agent.deferred_skills:
        avail = [resolution.require(n) for n in agent.deferred_skills if n not in names]
        avail = [s for i, s in enumerate(avail) if s not in loaded and s not in avail[:i]]
    else:
        avail = [s for s in resolution.skills.values() if s not in loaded]
    # the model never sees (nor activates) a skill that says only a user may load it
    avail = [s for s in avail if not getattr(s, "disable_model_invocation", False)]
    return loaded, sorted(avail, key=lambda s: s.name)


def detect_synergies(skills: Iterable[Skill]) -> list[str]:
    """Instructions of synergy declarations whose partner is loaded; sorted, unique."""
    skills = list(skills)
    loaded = {s.name for s in skills} | {s.declared_name for s in skills if s.declared_name}
    out = {d["instruction"].strip() for s in skills for d in s.synergy
           if d.get("with") in loaded and (d.get("instruction") or "").strip()}
    return sorted(out)


def catalog_budget() -> int:
    """The catalog's token budget: ``RNIXFS_SKILL_CATALOG_TOKENS`` or 8000."""
    raw = os.environ.get(CATALOG_ENV, "").strip()
    if raw:
        try:
            value = int(raw)
            if value >= 0:
                return value
        except ValueError:
            pass
        log.warning("[catalog] %s=%r is not a whole number >= 0; using %d", CATALOG_ENV, raw, CATALOG_TOKENS)
    return CATALOG_TOKENS


def estimate_tokens(text: str) -> int:
    """Cheap and tokenizer-free: a quarter of the UTF-8 bytes (rounded up)."""
    return (len(text.encode()) + 3) // 4


def _entry(s: Skill, cut: int | None) -> str:
    desc = s.description
    if cut is not None and len(desc) > cut:
        desc = desc[:cut].rstrip() + "…"
    return "\n".join(["<skill>", "<name>", html.escape(s.name), "</name>",
                      "<description>", html.escape(desc), "</description>",
                      "<location>", str(s.skill_md), "</location>", "</skill>"])


def available_skills_block(skills: Sequence[Skill], budget: int | None = None) -> str:
    return catalog(skills, budget)[0]


def catalog(skills: Sequence[Skill], budget: int | None = None) -> tuple[str, int]:
    """(``<available_skills>`` block, how many skills were left out).

    All skills when they fit ``budget`` tokens (None: no cap); else, in name
    order, descriptions cut to 250 characters, as many as fit."""
    ordered = sorted(skills, key=lambda s: s.name)
    full = [_entry(s, None) for s in ordered]
    if budget is None or estimate_tokens("\n".join(full)) <= budget:
        kept = full
    else:
        kept, used = [], 0
        for s in ordered:
            e = _entry(s, CATALOG_DESCRIPTION_CUT)
            need = estimate_tokens(e + "\n")
            if used + need > budget:
                break
            kept.append(e)
            used += need
    block = "\n".join(["<available_skills>", *kept, "</available_skills>"])
    return block, len(ordered) - len(kept)


def build_system_prompt(agent: AgentManifest | None, project_doc: str | None,
                        skills_loaded: Sequence[Skill], skills_available: Sequence[Skill] = (),
                        *, default_instructions: str = "", catalog_tokens: int | None = -1) -> str:
    """Assemble the system prompt (deterministic; see the module docstring).

    ``agent=None`` uses ``default_instructions``. An agent with
    ``project_doc: false`` never gets the project document. Loaded skills
    must be loadable (their bodies are read on first use and then frozen).
    ``catalog_tokens``: the catalog's budget (default: ``catalog_budget()``;
    None: uncapped).
    """
    if catalog_tokens == -1:
        catalog_tokens = catalog_budget()
    sections: list[str] = []
    instructions = agent.instructions if agent is not None else default_instructions
    if instructions.strip():
        sections.append(instructions.strip())
    if project_doc and project_doc.strip() and (agent is None or agent.project_doc):
        sections.append(f"{PROJECT_DOC_HEADER}\n\n{project_doc.strip()}")
    seen: set[str] = set()
    loaded: list[Skill] = []
    for s in skills_loaded:
        if s.name not in seen:
            seen.add(s.name)
            loaded.append(s)
    for s in loaded:
        body = s.body()
        if body:
            sections.append(f"Base directory for this skill: {s.path}\n\n{body}")
    synergies = detect_synergies(loaded)
    if synergies:
        sections.append(f"{SYNERGY_HEADER}\n\n" + "\n".join(synergies))
    available = [s for s in skills_available if s.name not in seen]
    if available:
        block, left_out = catalog(available, catalog_tokens)
        note = ""
        if left_out:
            note = (f"\n\n{left_out} more skills are not listed (the catalog is capped at about "
                    f"{catalog_tokens} tokens). Find them with the Skill tool: "
                    '{"query": "<words>"} searches names and descriptions, {"name": "<name>"} loads one.')
        sections.append(f"{CATALOG_INTRO}\n\n{block}{note}")
    if agent is not None and agent.language:
        sections.append(f"Always respond in {agent.language}.")
    return "\n\n".join(sections)


def allowed_tools(agent: AgentManifest | None, loaded_skills: Iterable[Skill],
                  *, skill_catalog: bool = False) -> list[str]:
    """Union of the loaded skills' allowed-tools and the agent's tools.

    Legacy device paths are normalized to tool names; the result is sorted.
    An empty list means unrestricted. A restricted process that is shown a
    skill catalog (``skill_catalog``) also gets ``Skill``: activating a skill
    only reads text the process may see anyway (docs/skills.md).
    """
    groups = [s.allowed_tools for s in loaded_skills]
    if agent is not None:
        groups.append(agent.tools)
    tools = union_tools(*groups)
    if tools and skill_catalog and "Skill" not in tools:
        tools = sorted([*tools, "Skill"])
    return tools


__all__ = ["project_doc", "build_system_prompt", "allowed_tools", "select_skills",
           "detect_synergies", "available_skills_block", "catalog", "catalog_budget",
           "estimate_tokens", "SkillNotFound"]
