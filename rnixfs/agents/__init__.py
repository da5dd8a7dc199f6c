"""Agents: agent.yaml manifests, lookup, model selection, the system prompt.

API (for the kernel; no pyfuse3, no trio)::

    load_agent(name: str, project: Path | None, config_dir: Path) -> AgentManifest
        project .rnix/agents/<name>/ over <config_dir>/agents/<name>/;
        raises AgentNotFound (unknown name) or AgentError (bad name such as "../x",
        path escape, unreadable/invalid agent.yaml or instructions.md); one-line messages
    list_agents(project, config_dir) -> list[AgentEntry]   (name, scope, path, description,
                                                            source, error, shadowed)
    parse_agent_yaml(text, dir_name="") -> AgentManifest
    parse_duration("10m") -> 600.0                          ("0" = off)

    AgentManifest: name, description, models (provider, preferred, fallback,
        fallback_provider, reasoning_effort), skills, deferred_skills, tools (normalized),
        mcp, planning (default True), max_steps, max_tokens, max_cost, context_budget,
        ctx_size, step_timeout ("5m" default; "0" off) + step_timeout_s (300.0; 0.0 = off),
        max_time ("" = the daemon's default) + max_time_s (None = default; 0.0 = off),
        compact_timeout, loop_threshold, coarse_loop_threshold, sla, alternatives,
        language, project_doc (default True), instructions, path, scope, source, warnings

    select_model(agent | None, *, default_provider, request_provider=None,
                 request_model=None, driver_default: dict[provider, model] | None = None)
        -> ModelChoice(provider, model | None, fallback, fallback_provider,
                       reasoning_effort, provider_from, model_from)
        request > manifest (models.provider / models.preferred) > driver default

    project_doc(cwd: Path, project_root: Path, budget=64 KiB) -> str | None
        nearest AGENTS.md from cwd up to the project root (never past it);
        UTF-8-safe truncation + "[truncated: AGENTS.md exceeded <budget> bytes]"
    select_skills(agent | None, resolution, requested=(), *, list_available=True)
        -> (loaded: list[Skill], available: list[Skill])   raises SkillNotFound/SkillInvalid
    build_system_prompt(agent | None, project_doc: str | None, skills_loaded, skills_available=(),
                        *, default_instructions="", catalog_tokens=<RNIXFS_SKILL_CATALOG_TOKENS or 8000>) -> str
        instructions, "# Project Instructions (AGENTS.md)", skill bodies
        ("Base directory for this skill: <dir>"), "[Skill Synergy]", <available_skills>
        (capped at catalog_tokens, bytes / 4; None = uncapped);
        deterministic: build it once at spawn, reuse it at every step
    allowed_tools(agent | None, loaded_skills, *, skill_catalog=False) -> list[str]
        sorted union of skills' allowed-tools and the agent's tools; [] = unrestricted;
        a restricted list also gets "Skill" when a catalog is shown
    agent_write_scope(project | None, config_dir) -> ScopePath
        where a new agent goes: project .rnix/agents when a project is given, else user

Typical spawn (kernel side)::

    agent = load_agent(req.agent, project, config_dir)          # frozen for the process
    res = resolve_skills(project, config_dir)
    loaded, available = select_skills(agent, res, req.skills)
    doc = project_doc(cwd, project) if agent.project_doc else None
    prompt = build_system_prompt(agent, doc, loaded, available)
    tools = allowed_tools(agent, loaded)
    choice = select_model(agent, default_provider=providers.default,
                          request_provider=req.provider, request_model=req.model)
"""
from pathlib import Path

from ..skills.resolve import ScopePath, write_scope
from .manifest import (
    AGENT_FILE, DEFAULT_STEP_TIMEOUT, INSTRUCTIONS_FILE, AgentEntry, AgentError, AgentManifest,
    AgentModels, AgentNotFound, ModelChoice, check_agent_name, list_agents, load_agent,
    parse_agent_yaml, parse_duration, select_model,
)
from .prompt import (
    PROJECT_DOC_BUDGET, allowed_tools, available_skills_block, build_system_prompt,
    detect_synergies, project_doc, select_skills,
)


def agent_write_scope(project: Path | None, config_dir: Path) -> ScopePath:
    """Where a new agent goes: project native when a project is given, else user."""
    return write_scope(project, config_dir, "agents")


__all__ = [
    "AGENT_FILE", "DEFAULT_STEP_TIMEOUT", "INSTRUCTIONS_FILE", "PROJECT_DOC_BUDGET", "AgentEntry",
    "AgentError", "AgentManifest", "AgentModels", "AgentNotFound", "ModelChoice",
    "agent_write_scope", "allowed_tools", "available_skills_block", "build_system_prompt",
    "check_agent_name", "detect_synergies", "list_agents", "load_agent", "parse_agent_yaml",
    "parse_duration", "project_doc", "select_model", "select_skills",
]
