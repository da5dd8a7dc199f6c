"""Agents and skills as the daemon sees them: spawn plans for the kernel,
and the skills/ and agents/ trees for the mount.

Resolution is cached. A change made through the mount re-resolves only what
it touched (the one skill created, removed or renamed, or whose SKILL.md was
written; nothing at all for other files); edits made directly on disk show
up within a second, when a sweep stats every root and skill again and
parses only the SKILL.md files whose stat changed (docs/skills.md).
"""
from __future__ import annotations

import copy
import json
import os
import logging
import threading
import time
from pathlib import Path
from typing import NamedTuple

from .agents import (
    AgentError, AgentNotFound, agent_write_scope, allowed_tools, build_system_prompt,
    list_agents, load_agent, project_doc, select_model, select_skills,
)
from .devices.fs import FsError, Workspace
from .fileio import ScopeEscape, scope_rel
from .kernel.errors import Code, SyscallError
from .kernel.loop import DEFAULT_SYSTEM_PROMPT
from .devices.mcp.mcp_config import load_servers, parse_servers
from .kernel.plan import SpawnPlan
from .skills import (
    SkillError, SkillInvalid, SkillNotFound, check_name, ensure_builtins, resolve_skills,
    write_scope,
)
from .skills.model import scope_root_of
from .skills.resolve import SkillCache, update_names

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
        self._cache = SkillCache()
        self._dirty: set[str] = set()       # skill names a mount change touched
        self._lock = threading.Lock()       # spawns plan in worker threads
        self.sweeps = 0                     # full re-resolutions (tests, bench)
        self.updates = 0                    # one-name re-resolutions
        # Bumped by every change made through the mount: cached plans made
        # before it are not used again.
        self.generation = 0
        self.plan = PlanCache(self)

    @property
    def parses(self) -> int:
        """SKILL.md files parsed so far (tests and the bench read it)."""
        return self._cache.parses

    def _warn(self, line: str) -> None:
        """Each warning once per daemon, not once per re-resolution.

        A skill that does not load is the user's content, reported where they
        look (``rnixfs skill list``, the xattrs): INFO here. An untrusted
        project loading skills is a security matter: WARNING."""
        if line not in self._warned:
            self._warned.add(line)
            log.log(logging.WARNING if "untrusted project" in line else logging.INFO, "%s", line)

    def install_builtins(self) -> list[str]:
        try:
            return ensure_builtins(self.config_dir)
        except (OSError, SkillError) as exc:
            log.warning("built-in agents and skills not installed: %s", exc)
            return []

    # -- cached views ----------------------------------------------------------------
    def skills(self):
        with self._lock:
            now = time.monotonic()
            if self._skills is None or now - self._skills_at > CACHE_SECONDS:
                self._dirty.clear()
                self._skills = resolve_skills(self.project, self.config_dir, warn=self._warn,
                                              cache=self._cache)
                self._skills_at = now
                self.sweeps += 1
            elif self._dirty:
                names, self._dirty = self._dirty, set()
                self._skills = update_names(self._skills, names, cache=self._cache, warn=self._warn)
                self.updates += 1
            return self._skills

    def agents(self) -> dict:
        with self._lock:
            now = time.monotonic()
            if self._agents is None or now - self._agents_at > CACHE_SECONDS:
                self._agents = {e.name: e for e in list_agents(self.project, self.config_dir)}
                self._agents_at = now
            return self._agents

    def changed(self) -> None:
        """Forget everything (the next look resolves all skills and agents again)."""
        with self._lock:
            self._skills = self._agents = None
            self.generation += 1

    def skill_changed(self, name: str) -> None:
        """Skill ``name`` was created, removed, renamed or its SKILL.md written."""
        with self._lock:
            self._dirty.add(name)
            self.generation += 1

    def agents_changed(self) -> None:
        with self._lock:
            self._agents = None
            self.generation += 1

    def skills_fresh(self, skills) -> bool:
        """Is ``skills`` still the current resolution, with no change pending
        and no sweep due? Never touches the disk (the spawn fast path)."""
        return (skills is self._skills and not self._dirty
                and time.monotonic() - self._skills_at <= CACHE_SECONDS)

    # -- spawning ------------------------------------------------------------------
    def resolve_plan(self, req, *, default_provider: str, driver_models: dict[str, str],
                     cwd: Path) -> SpawnPlan:
        """Resolve agent, skills, model and prompt; SyscallError when a name is bad.

        Every failure is a SyscallError saying why (logged at the FUSE
        boundary), never a bare errno: a file that leads outside its scope
        is PERMISSION, anything else unreadable is INVALID.
        """
        try:
            return self._plan(req, default_provider=default_provider, driver_models=driver_models, cwd=cwd)
        except SyscallError:
            raise
        except ScopeEscape as exc:
            raise SyscallError(Code.PERMISSION, str(exc), syscall="Spawn", device="/proc/new") from None
        except SkillError as exc:
            raise _invalid(str(exc)) from None
        except AgentError as exc:
            raise _invalid(str(exc)) from None
        except OSError as exc:
            raise _invalid(f"cannot read the agent or its skills: {exc.strerror or exc}") from None

    def _plan(self, req, *, default_provider: str, driver_models: dict[str, str], cwd: Path) -> SpawnPlan:
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
        configured, errors = load_servers(self.project, self.config_dir)
        names = []
        for name in spec:
            if not isinstance(name, str) or name not in configured:
                where = ".rnix/mcp.yaml, .mcp.json or mcp.yaml in the config directory"
                why = [e for e in errors if f"server {name!r}" in e]  # defined, but unusable
                raise _not_found(f'agent "{agent.name}": MCP server {name!r} is not configured '
                                 + (f"(its entry is unusable: {why[-1]})" if why else f"({where})"))
            names.append(name)
        return names, {}


class _Planned(NamedTuple):
    plan: SpawnPlan
    generation: int
    skills: object        # the skills resolution the plan was made from
    at: float             # time.monotonic() when it was resolved


class PlanCache:
    """``Catalog.plan``: spawn plans remembered by what decides them.

    A burst of spawns of the same agent (the same agent, skills, provider,
    model and cwd) resolves the plan once. ``cached`` answers without
    touching the disk, so the kernel can spawn without a thread hop; a plan
    is used again only while nothing changed through the mount since it was
    made (``Catalog.generation``), its skills resolution is still current,
    and it is younger than ``CACHE_SECONDS`` — the same second within which
    edits made directly on disk show up in skills/ (docs/architecture.md,
    "The path of a spawn").
    """

    MAX_ENTRIES = 256

    def __init__(self, catalog: Catalog):
        self.catalog = catalog
        self._plans: dict[tuple, _Planned] = {}
        self.hits = 0  # spawns planned from the cache (tests, bench)

    @staticmethod
    def _key(req, default_provider: str, driver_models: dict[str, str], cwd: Path) -> tuple:
        return (req.agent or "default", tuple(req.skills), req.provider, req.model, str(cwd),
                default_provider, tuple(sorted(driver_models.items())))

    def __call__(self, req, *, default_provider: str, driver_models: dict[str, str], cwd: Path) -> SpawnPlan:
        """Resolve (reads the disk: call it off the event loop) and remember."""
        catalog = self.catalog
        generation = catalog.generation  # read first: a change during resolution invalidates it
        plan = catalog.resolve_plan(req, default_provider=default_provider, driver_models=driver_models,
                                    cwd=cwd)
        skills = catalog._skills
        if skills is not None:
            if len(self._plans) >= self.MAX_ENTRIES:
                self._plans.clear()
            self._plans[self._key(req, default_provider, driver_models, cwd)] = _Planned(
                plan, generation, skills, time.monotonic())
        return _copy_plan(plan)

    def cached(self, req, *, default_provider: str, driver_models: dict[str, str],
               cwd: Path) -> SpawnPlan | None:
        """The remembered plan for this request if it is still valid, else
        None (then call the cache itself, off the event loop)."""
        entry = self._plans.get(self._key(req, default_provider, driver_models, cwd))
        if (entry is None or entry.generation != self.catalog.generation
                or time.monotonic() - entry.at > CACHE_SECONDS
                or not self.catalog.skills_fresh(entry.skills)):
            return None
        self.hits += 1
        return _copy_plan(entry.plan)


def _copy_plan(plan: SpawnPlan) -> SpawnPlan:
    """Each spawn gets its own plan: the kernel narrows a child's tools in it."""
    out = copy.copy(plan)
    for name in ("skills", "allowed_tools", "warnings", "mcp_servers"):
        setattr(out, name, list(getattr(plan, name)))
    out.budget, out.mcp_inline = dict(plan.budget), dict(plan.mcp_inline)
    if plan.usable_skills is not None:
        out.usable_skills = list(plan.usable_skills)
    return out


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


def make_entry(scope_root: Path, path: Path) -> tuple[Path, str]:
    """Create directory ``path`` (and its missing parents) below ``scope_root``
    through the fd-relative walker: a `.rnix` or `skills` symlink leading out
    of the scope makes it fail with EACCES instead of writing elsewhere.
    Returns (scope root, path relative to it)."""
    rel = scope_rel(scope_root, path)
    try:
        with Workspace(scope_root) as ws:
            parts = rel.split("/")
            for i in range(1, len(parts)):
                try:
                    ws.mkdir("/".join(parts[:i]))
                except FsError as exc:
                    if exc.errno != 17:  # EEXIST: already there (a symlink inside is followed)
                        raise
            ws.mkdir(rel)
    except FsError as exc:
        if exc.code is Code.PERMISSION:
            log.warning("refused to create %s: %s", path, exc.cause)
        raise OSError(exc.errno, exc.cause) from None
    return scope_root, rel


def _tree_rest(rest: str, files: tuple[str, ...]) -> bool:
    """Does a change at ``rest`` inside an entry touch what resolution reads?"""
    return not rest or rest.split("/", 1)[0] in files


class SkillsTree:
    """skills/<name>/ → the winning copy, valid or not (a bad SKILL.md is kept)."""

    def __init__(self, catalog: Catalog):
        self.catalog = catalog

    def names(self) -> list[str]:
        return list(self.catalog.skills().winners)

    def locate(self, name: str) -> tuple[Path, str] | None:
        """(scope root, path of the skill below it): the mount walks from there."""
        skill = self.catalog.skills().winners.get(name)
        if skill is None:
            return None
        root = skill.scope_root
        return root, scope_rel(root, skill.path)

    def create(self, name: str) -> tuple[Path, str]:
        problems = check_name(name)
        if problems:
            raise OSError(22, problems[0])
        scope = write_scope(self.catalog.project, self.catalog.config_dir, "skills")
        out = make_entry(scope_root_of(scope.path, scope.scope), Path(scope.path) / name)
        self.catalog.skill_changed(name)
        return out

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

    def root_xattrs(self) -> dict[str, bytes]:
        """``user.rnix.resolver`` on skills/: how much resolving was done
        (full sweeps, one-skill updates, SKILL.md parses, spawn plans reused
        from the cache), for tests and bench."""
        c = self.catalog
        return {"user.rnix.resolver": _encode({"sweeps": c.sweeps, "updates": c.updates,
                                               "parses": c.parses, "plans_reused": c.plan.hits})}

    def changed(self, name: str | None = None, rest: str = "") -> None:
        """Only the skill entry itself and its SKILL.md matter to resolution."""
        if name is None:
            self.catalog.changed()
        elif _tree_rest(rest, ("SKILL.md",)):
            self.catalog.skill_changed(name)


class AgentsTree:
    """agents/<name>/ → the winning agent directory."""

    def __init__(self, catalog: Catalog):
        self.catalog = catalog

    def names(self) -> list[str]:
        return list(self.catalog.agents())

    def locate(self, name: str) -> tuple[Path, str] | None:
        from .agents.manifest import agent_scope_root

        entry = self.catalog.agents().get(name)
        if entry is None:
            return None
        root = agent_scope_root(entry.scope, self.catalog.project, self.catalog.config_dir)
        return root, scope_rel(root, entry.path)

    def create(self, name: str) -> tuple[Path, str]:
        from .agents.manifest import agent_scope_root, check_agent_name

        try:
            check_agent_name(name)
        except AgentError as exc:
            raise OSError(22, str(exc)) from None
        scope = agent_write_scope(self.catalog.project, self.catalog.config_dir)
        root = agent_scope_root(scope.scope, self.catalog.project, self.catalog.config_dir)
        out = make_entry(root, Path(scope.path) / name)
        self.catalog.agents_changed()
        return out

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

    def changed(self, name: str | None = None, rest: str = "") -> None:
        if name is None or _tree_rest(rest, ("agent.yaml", "instructions.md")):
            self.catalog.agents_changed()
