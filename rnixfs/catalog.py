"""Agents and skills as the daemon sees them: spawn plans for the kernel,
and the skills/ and agents/ trees for the mount.

Resolution is cached for a second (and dropped at once after a change made
through the mount), so edits made directly on disk show up within a second.
"""
from __future__ import annotations

import json
import os
import logging
import time
from pathlib import Path

from .agents import (
    AgentError, AgentNotFound, agent_write_scope, allowed_tools, build_system_prompt,
    list_agents, load_agent, project_doc, select_model, select_skills,
)
from .kernel.errors import Code, SyscallError
from .kernel.loop import DEFAULT_SYSTEM_PROMPT
from .devices.mcp.config import load_servers, parse_servers
from .kernel.plan import SpawnPlan
from .skills import (
    SkillError, SkillInvalid, SkillNotFound, check_name, ensure_builtins, resolve_skills,
    write_scope,
)

log = logging.getLogger(__name__)

CACHE_SECONDS = 1.0


def _not_found(msg: str) -> SyscallError:
    return SyscallError(Code.NOT_FOUND, msg, syscall="Spawn", device="/proc/new")


def _invalid(msg: str) -> SyscallError:
    return SyscallError(Code.INVALID, msg, syscall="Spawn", device="/proc/new")


class Catalog:
    def __init__(self, project: Path | None, config_dir: Path):
        self.project = project
        self.config_dir = config_dir
        self._skills = None
        self._skills_at = 0.0
        self._agents = None
        self._agents_at = 0.0
        self._warned: set[str] = set()

    def _warn(self, line: str) -> None:
        """Each warning once per daemon, not once per re-resolution."""
        if line not in self._warned:
            self._warned.add(line)
            log.warning("%s", line)

    def install_builtins(self) -> list[str]:
        try:
            return ensure_builtins(self.config_dir)
        except (OSError, SkillError) as exc:
            log.warning("built-in agents and skills not installed: %s", exc)
            return []

    # -- cached views ----------------------------------------------------------------
    def skills(self):
        now = time.monotonic()
        if self._skills is None or now - self._skills_at > CACHE_SECONDS:
            self._skills = resolve_skills(self.project, self.config_dir, warn=self._warn)
            self._skills_at = now
        return self._skills

    def agents(self) -> dict:
        now = time.monotonic()
        if self._agents is None or now - self._agents_at > CACHE_SECONDS:
            self._agents = {e.name: e for e in list_agents(self.project, self.config_dir)}
            self._agents_at = now
        return self._agents

    def changed(self) -> None:
        self._skills = self._agents = None

    # -- spawning ------------------------------------------------------------------
    def plan(self, req, *, default_provider: str, driver_models: dict[str, str], cwd: Path) -> SpawnPlan:
        """Resolve agent, skills, model and prompt; SyscallError when a name is bad."""
        agent = None
        if req.agent and req.agent != "default":
            try:
                agent = load_agent(req.agent, self.project, self.config_dir)
            except AgentNotFound:
                raise _not_found(f'agent "{req.agent}" not found') from None
            except AgentError as exc:
                raise _invalid(f'agent "{req.agent}": {exc}') from None
        try:
            loaded, available = select_skills(agent, self.skills(), req.skills)
        except SkillNotFound as exc:
            raise _not_found(str(exc)) from None
        except SkillInvalid as exc:
            raise _invalid(str(exc)) from None
        choice = select_model(agent, default_provider=default_provider,
                              request_provider=req.provider, request_model=req.model,
                              driver_default=driver_models)
        doc = None
        if (agent is None or agent.project_doc) and self.project is not None:
            doc = project_doc(cwd, self.project)
        prompt = build_system_prompt(agent, doc, loaded, available,
                                     default_instructions=DEFAULT_SYSTEM_PROMPT)
        budget = {}
        if agent is not None:
            budget = {"max_steps": agent.max_steps or None, "max_tokens": agent.max_tokens or None,
                      "max_cost": agent.max_cost or None, "step_timeout": agent.step_timeout_s,
                      "context_budget": agent.context_budget or None, "max_time": agent.max_time_s,
                      "ctx_size": agent.ctx_size or None}
        deferred = agent is not None and bool(agent.deferred_skills)
        mcp_servers, mcp_inline = self._mcp(agent)
        return SpawnPlan(agent=agent.name if agent else "default", provider=choice.provider,
                         model=choice.model, skills=[s.ref_name for s in loaded],
                         allowed_tools=allowed_tools(agent, loaded, skill_catalog=bool(available)),
                         system_prompt=prompt,
                         budget=budget, fallback_model=choice.fallback or None,
                         fallback_provider=choice.fallback_provider or None,
                         # grants policy and skill reach: docs/skills.md, "Grants"
                         usable_skills=[s.name for s in available] if deferred else None,
                         skill_grants=agent is None or not agent.tools,
                         reasoning_effort=choice.reasoning_effort,
                         planning=agent.planning if agent else False,
                         warnings=_spawn_warnings(agent, choice, default_provider),
                         mcp_servers=mcp_servers, mcp_inline=mcp_inline)

    def _mcp(self, agent) -> tuple[list[str], dict]:
        """The agent's MCP servers: names of configured ones (``mcp: [git]``)
        or inline definitions (``mcp: {servers: {…}}``). A name that
        resolves to nothing fails the spawn (docs/devices.md, "dev/mcp")."""
        spec = agent.mcp if agent is not None else []
        if not spec:
            return [], {}
        if isinstance(spec, dict):
            raw = spec.get("servers", spec) if isinstance(spec.get("servers"), dict) else spec
            inline, errors = parse_servers(raw, f"agent {agent.name!r} mcp")
            if errors:
                raise _invalid(errors[0])
            return sorted(inline), inline
        configured, _ = load_servers(self.project, self.config_dir)
        names = []
        for name in spec:
            if not isinstance(name, str) or name not in configured:
                where = ".rnix/mcp.yaml, .mcp.json or mcp.yaml in the config directory"
                raise _not_found(f'agent "{agent.name}": MCP server {name!r} is not configured ({where})')
            names.append(name)
        return names, {}


def _spawn_warnings(agent, choice, default_provider: str) -> list[str]:
    """The manifest's warnings, plus model preferences this spawn cannot use."""
    if agent is None:
        return []
    out = list(agent.warnings)
    if choice.provider != (agent.models.provider or default_provider):
        out += [f"models.{k} is not used: the request chose provider {choice.provider}"
                for k in ("preferred", "fallback", "fallback_provider") if getattr(agent.models, k)]
    return out


def _encode(value) -> bytes:
    if isinstance(value, str):
        return os.fsencode(value)  # paths may hold undecodable bytes
    return json.dumps(value, ensure_ascii=False).encode()


def confined_new_dir(root: Path, name: str, catalog: Catalog) -> Path:
    """A new skill or agent directory must stay inside its scope: a `.rnix`
    symlink leading out of the project must not make mkdir write elsewhere."""
    base = catalog.project if str(root).startswith(str(catalog.project or "\0")) else catalog.config_dir
    real_base = os.path.realpath(base)
    real = os.path.realpath(root / name)
    if not (real == real_base or real.startswith(real_base.rstrip("/") + "/")):
        raise OSError(13, f"{root / name} leads outside {base}")
    return root / name


class SkillsTree:
    """skills/<name>/ → the winning copy, valid or not (a bad SKILL.md is kept)."""

    def __init__(self, catalog: Catalog):
        self.catalog = catalog

    def names(self) -> list[str]:
        return list(self.catalog.skills().winners)

    def locate(self, name: str) -> Path | None:
        skill = self.catalog.skills().winners.get(name)
        return skill.path if skill else None

    def create(self, name: str) -> Path:
        problems = check_name(name)
        if problems:
            raise OSError(22, problems[0])
        root = write_scope(self.catalog.project, self.catalog.config_dir, "skills").path
        path = confined_new_dir(Path(root), name, self.catalog)
        path.mkdir(parents=True)
        self.catalog.changed()
        return path

    def xattrs(self, name: str) -> dict[str, bytes]:
        d = self.catalog.skills().describe_dir(name)
        if d is None:
            return {}
        keys = ("scope", "namespace", "source", "version", "shadowed", "trust", "diagnostics",
                "name", "directory")   # name: the frontmatter name skills are referred to by
        out = {f"user.rnix.{k}": _encode(d.get(k) if d.get(k) is not None else "") for k in keys}
        out["user.rnix.path"] = _encode(d.get("path", ""))
        out["user.rnix.valid"] = b"false" if d.get("diagnostics") and any(
            x.startswith("skipped:") for x in d["diagnostics"]) else b"true"
        return out

    def changed(self) -> None:
        self.catalog.changed()


class AgentsTree:
    """agents/<name>/ → the winning agent directory."""

    def __init__(self, catalog: Catalog):
        self.catalog = catalog

    def names(self) -> list[str]:
        return list(self.catalog.agents())

    def locate(self, name: str) -> Path | None:
        entry = self.catalog.agents().get(name)
        return Path(entry.path) if entry else None

    def create(self, name: str) -> Path:
        from .agents.manifest import check_agent_name

        try:
            check_agent_name(name)
        except AgentError as exc:
            raise OSError(22, str(exc)) from None
        root = agent_write_scope(self.catalog.project, self.catalog.config_dir).path
        path = confined_new_dir(Path(root), name, self.catalog)
        path.mkdir(parents=True)
        self.catalog.changed()
        return path

    def xattrs(self, name: str) -> dict[str, bytes]:
        entry = self.catalog.agents().get(name)
        if entry is None:
            return {}
        return {
            "user.rnix.scope": _encode(entry.scope),
            "user.rnix.source": _encode(entry.source or ""),
            "user.rnix.path": _encode(str(entry.path)),
            "user.rnix.shadowed": _encode([str(p) for p in entry.shadowed]),
            "user.rnix.diagnostics": _encode([entry.error] if entry.error else []),
        }

    def changed(self) -> None:
        self.catalog.changed()
