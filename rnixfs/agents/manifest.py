"""agent.yaml + instructions.md: parsing, lookup, listing, model selection.

An agent is a directory ``<base>/<name>/`` holding ``agent.yaml`` (identity,
models, skills, budgets) and ``instructions.md`` (its system prompt). Bases in
priority order: ``<project>/.rnix/agents/`` then ``<config_dir>/agents/``;
the first directory named ``<name>`` wins whole.

Names are plain directory names (``[A-Za-z0-9][A-Za-z0-9_.-]{0,63}``, no
``..``); a name never escapes its base directory, and an agent whose
directory or files lead out of its scope root (the project, or the config
directory) is refused: files are read by the fd-relative walk from the scope
root (rnixfs.fileio ``read_in_scope``, docs/skills.md).
Unknown keys in agent.yaml are kept as warnings (Rnix carries fields
rnixfs does not use yet); wrong types are errors with one readable line.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .. import limits
from ..fileio import NotRegularFile, ScopeEscape, read_in_scope

AGENT_FILE = "agent.yaml"
INSTRUCTIONS_FILE = "instructions.md"
MAX_AGENT_YAML_BYTES = 256 << 10
MAX_INSTRUCTIONS_BYTES = 1 << 20
DEFAULT_STEP_TIMEOUT = "5m"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class _AgentLoader(yaml.SafeLoader):
    """safe_load without aliases (no billion-laughs through a shared agent.yaml)."""

    def compose_node(self, parent, index):  # noqa: D401 - PyYAML hook
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, "aliases (*name) are not allowed in agent.yaml", event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else id(key_node)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"found duplicate key {key!r}", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


class AgentError(Exception):
    """An agent cannot be used; ``str()`` is one readable line."""


class AgentNotFound(AgentError):
    pass


@dataclass
class AgentModels:
    provider: str = ""
    preferred: str = ""
    fallback: str = ""
    fallback_provider: str = ""
    reasoning_effort: str = ""


@dataclass
class AgentManifest:
    """Every field of Rnix's agent.yaml, with rnixfs's defaults applied."""

    name: str
    description: str = ""
    models: AgentModels = field(default_factory=AgentModels)
    skills: list[str] = field(default_factory=list)
    deferred_skills: list[str] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)
    mcp: list | dict = field(default_factory=list)
    planning: bool = True                     # unset = true
    max_steps: int = 0                        # 0 = the daemon's default (rnixfs/limits.py)
    max_tokens: int = 0                       # 0 = the daemon's default
    max_cost: float = 0.0                     # USD; 0 = the daemon's default
    context_budget: int = 0                   # tokens; 0 = the daemon's default
    ctx_size: int = 0                         # message slots kept; 0 = all
    step_timeout: str = DEFAULT_STEP_TIMEOUT  # as written; "0" = off
    step_timeout_s: float = 300.0             # seconds; 0.0 = off
    max_time: str = ""                        # wall clock; "" = the daemon's default, "0" = off
    max_time_s: float | None = None           # seconds; None = the daemon's default
    compact_timeout: str = ""
    loop_threshold: int = 0
    coarse_loop_threshold: int = 0
    sla: dict = field(default_factory=dict)
    alternatives: list[str] = field(default_factory=list)
    language: str = ""
    project_doc: bool = True                  # unset = true
    instructions: str = ""
    # where it came from
    dir_name: str = ""
    path: Path | None = None
    scope: str = ""                           # "project" | "user"
    source: str = ""                          # "builtin" when extracted from the package
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k not in ("models", "path", "instructions")}
        d["models"] = dict(self.models.__dict__)
        d["path"] = str(self.path) if self.path else None
        return d


# --- field parsing --------------------------------------------------------------


def parse_duration(value, what: str = "step_timeout") -> float:
    """Seconds from ``"10m"``/``"30s"``/``"1h"``/``"500ms"``/a number; ``"0"`` = off
    (``rnixfs.limits.parse_duration``, raising AgentError)."""
    try:
        return limits.parse_duration(value, what)
    except limits.DurationError as exc:
        raise AgentError(str(exc)) from None


def _str(v, key: str) -> str:
    if v is None:
        return ""
    if isinstance(v, bool) or not isinstance(v, (str, int, float)):
        raise AgentError(f"{key} must be text, got {type(v).__name__}")
    return str(v)


def _int(v, key: str) -> int:
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise AgentError(f"{key} must be a non-negative whole number, got {v!r}"[:200])
    return v


def _signed_int(v, key: str) -> int:
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int):
        raise AgentError(f"{key} must be a whole number, got {v!r}"[:200])
    return v


def _num(v, key: str) -> float:
    if v is None:
        return 0.0
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
        raise AgentError(f"{key} must be a non-negative number, got {v!r}"[:200])
    return float(v)


def _bool(v, key: str, default: bool) -> bool:
    if v is None:
        return default
    if not isinstance(v, bool):
        raise AgentError(f"{key} must be true or false, got {v!r}"[:200])
    return v


def _names(v, key: str) -> list[str]:
    if v is None:
        return []
    if not isinstance(v, list):
        raise AgentError(f"{key} must be a list of names")
    out = []
    for item in v:
        if not isinstance(item, str) or not item.strip():
            raise AgentError(f"{key} must be a list of names, got {item!r}"[:200])
        out.append(item.strip())
    return out


def _tools(v) -> list[str]:
    from ..skills.tool_names import normalize_tools, split_tools

    if v is None:
        return []
    try:
        return normalize_tools(split_tools(v))
    except TypeError:
        raise AgentError("tools must be a list of tool names (or a space-separated string)") from None


_MODEL_KEYS = ("provider", "preferred", "fallback", "fallback_provider", "reasoning_effort")
_KNOWN = {
    "name", "description", "models", "skills", "deferred_skills", "tools", "mcp", "planning",
    "max_steps", "max_tokens", "max_cost", "context_budget", "ctx_size", "step_timeout",
    "compact_timeout", "loop_threshold", "coarse_loop_threshold", "sla", "alternatives",
    "language", "project_doc", "max_time",
}
# Read and kept, but the daemon does nothing with them: a set one is a warning
# in `agent show` and in the spawn's trace, never silence.
NOT_ACTED_ON = ("sla", "alternatives", "compact_timeout", "loop_threshold",
                "coarse_loop_threshold")
# OpenAI's reasoning_effort names and claude's --effort levels
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")


def parse_agent_yaml(text: str, dir_name: str = "") -> AgentManifest:
    """Parse agent.yaml text into a manifest (no instructions). Raises AgentError."""
    try:
        data = yaml.load(text, Loader=_AgentLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.YAMLError as exc:
        from ..skills.parse import yaml_reason
        raise AgentError(f"agent.yaml: invalid YAML: {yaml_reason(exc)}") from None
    except RecursionError:
        raise AgentError("agent.yaml: invalid YAML: nesting too deep") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise AgentError(f"agent.yaml: top level must be a mapping, got {type(data).__name__}")
    try:
        return _build(data, dir_name)
    except AgentError as exc:
        raise AgentError(f"agent.yaml: {exc}") from None


def _build(data: dict, dir_name: str) -> AgentManifest:
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise AgentError("missing required field: name")
    m = AgentManifest(name=name.strip(), dir_name=dir_name)
    m.warnings = [f"unknown key {str(k)!r} ignored" for k in sorted(map(str, data)) if k not in _KNOWN]
    if dir_name and m.name != dir_name:
        m.warnings.append(f"name {m.name!r} differs from its directory {dir_name!r}")
    m.description = _str(data.get("description"), "description")
    models = data.get("models")
    if models is not None:
        if not isinstance(models, dict):
            raise AgentError("models must be a mapping (provider, preferred, fallback, ...)")
        unknown = sorted(str(k) for k in models if k not in _MODEL_KEYS)
        m.warnings += [f"unknown key 'models.{k}' ignored" for k in unknown]
        m.models = AgentModels(**{k: _str(models.get(k), f"models.{k}").strip() for k in _MODEL_KEYS})
        effort = m.models.reasoning_effort
        if effort and effort not in REASONING_EFFORTS:
            raise AgentError(f"models.reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}, "
                             f"got {effort!r}"[:200])
    m.skills = _names(data.get("skills"), "skills")
    m.deferred_skills = _names(data.get("deferred_skills"), "deferred_skills")
    m.alternatives = _names(data.get("alternatives"), "alternatives")
    m.tools = _tools(data.get("tools"))
    mcp = data.get("mcp")
    if mcp is not None and not isinstance(mcp, (list, dict)):
        raise AgentError("mcp must be a list of server names or a mapping")
    m.mcp = mcp if mcp is not None else []
    m.planning = _bool(data.get("planning"), "planning", True)
    m.project_doc = _bool(data.get("project_doc"), "project_doc", True)
    m.max_steps = _int(data.get("max_steps"), "max_steps")
    m.max_tokens = _int(data.get("max_tokens"), "max_tokens")
    m.max_cost = _num(data.get("max_cost"), "max_cost")
    m.context_budget = _int(data.get("context_budget"), "context_budget")
    m.ctx_size = _int(data.get("ctx_size"), "ctx_size")
    st = data.get("step_timeout")
    if st is None or st == "":
        m.step_timeout, m.step_timeout_s = DEFAULT_STEP_TIMEOUT, parse_duration(DEFAULT_STEP_TIMEOUT)
    else:
        m.step_timeout_s = parse_duration(st, "step_timeout")
        m.step_timeout = str(st)
    ct = data.get("compact_timeout")
    if ct not in (None, ""):
        parse_duration(ct, "compact_timeout")
        m.compact_timeout = str(ct)
    m.loop_threshold = _signed_int(data.get("loop_threshold"), "loop_threshold")
    m.coarse_loop_threshold = _signed_int(data.get("coarse_loop_threshold"), "coarse_loop_threshold")
    mt = data.get("max_time")
    if mt not in (None, ""):
        m.max_time_s = parse_duration(mt, "max_time")
        m.max_time = str(mt)
    sla = data.get("sla")
    if sla is not None and not isinstance(sla, dict):
        raise AgentError("sla must be a mapping")
    m.sla = sla or {}
    m.language = _str(data.get("language"), "language").strip()
    m.warnings += [f"{key} is set but rnixfs does not act on it: it has no effect"
                   for key in NOT_ACTED_ON if getattr(m, key)]
    return m


# --- lookup -------------------------------------------------------------------------


def check_agent_name(name) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name) or ".." in name:
        raise AgentError(f"invalid agent name {str(name)[:80]!r}: use letters, digits, . _ - "
                         "(no path separators, no ..)")
    return name


def agent_bases(project: Path | None, config_dir: Path) -> list[tuple[Path, str]]:
    """``[(base dir, scope), ...]`` in priority order."""
    bases = []
    if project is not None:
        bases.append((Path(os.path.abspath(project)) / ".rnix" / "agents", "project"))
    bases.append((Path(os.path.abspath(config_dir)) / "agents", "user"))
    return bases


def agent_scope_root(scope: str, project: Path | None, config_dir: Path) -> Path:
    """What an agent directory and its files may not leave (docs/skills.md):
    the project for project agents, the config directory for user agents."""
    if scope == "project" and project is not None:
        return Path(os.path.abspath(project))
    return Path(os.path.abspath(config_dir))


def _read_capped(path: Path, cap: int, what: str, scope_root: Path, leaves: str) -> str:
    """Read one agent file, walked fd-relative from the scope root (race-free:
    a directory swapped for a symlink between two steps cannot lead out)."""
    try:
        data, size = read_in_scope(scope_root, path, cap)
    except ScopeEscape:
        raise AgentError(f"{what} is a symlink that leaves {leaves}") from None
    except FileNotFoundError:
        raise AgentError(f"missing {what}") from None
    except NotRegularFile:
        raise AgentError(f"{what} is not a regular file") from None
    except OSError as exc:
        raise AgentError(f"cannot read {what}: {exc.strerror}") from None
    if size > cap:
        raise AgentError(f"{what} is {size} bytes; the cap is {cap}")
    if len(data) > cap:
        raise AgentError(f"{what} is more than {cap} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise AgentError(f"{what} is not valid UTF-8 (byte {exc.start})") from None


def find_agent_dir(name: str, project: Path | None, config_dir: Path) -> tuple[Path, str, list[Path]]:
    """The winning directory for ``name``, its scope, and the shadowed copies."""
    check_agent_name(name)
    found: list[tuple[Path, str]] = []
    for base, scope in agent_bases(project, config_dir):
        d = base / name
        if d.is_dir():
            found.append((d, scope))
    if not found:
        searched = ", ".join(str(b) for b, _ in agent_bases(project, config_dir))
        raise AgentNotFound(f'agent "{name}" not found (searched {searched})')
    return found[0][0], found[0][1], [d for d, _ in found[1:]]


def _dir_leaves(scope_root: Path, d: Path) -> bool:
    """Does directory ``d`` lead outside ``scope_root`` (checked by the walker)?"""
    try:
        read_in_scope(scope_root, d, 0)
    except ScopeEscape:
        return True
    except OSError:
        pass
    return False


def _load_dir(d: Path, scope: str, project: Path | None, config_dir: Path) -> AgentManifest:
    root = agent_scope_root(scope, project, config_dir)
    leaves = "the project" if scope == "project" and project is not None else f"its scope ({root})"
    if _dir_leaves(root, d):
        raise AgentError(f'agent "{d.name}": its directory is a symlink that leaves {leaves}')
    try:
        m = parse_agent_yaml(_read_capped(d / AGENT_FILE, MAX_AGENT_YAML_BYTES, AGENT_FILE, root, leaves),
                             d.name)
        m.instructions = _read_capped(d / INSTRUCTIONS_FILE, MAX_INSTRUCTIONS_BYTES, INSTRUCTIONS_FILE,
                                      root, leaves)
    except AgentError as exc:
        raise AgentError(f'agent "{d.name}" ({d}): {exc}') from None
    m.path, m.scope = d, scope
    if scope == "user":
        from ..skills.builtins import builtin_agent_dirs
        if d.name in builtin_agent_dirs(config_dir):
            m.source = "builtin"
    return m


def load_agent(name: str, project: Path | None, config_dir: Path) -> AgentManifest:
    """Load agent ``name``: project ``.rnix/agents/`` over ``<config_dir>/agents/``.

    Raises AgentNotFound for unknown names and AgentError (one line) for bad
    names, path escapes, unreadable or invalid files.
    """
    d, scope, _ = find_agent_dir(name, project, config_dir)
    return _load_dir(d, scope, project, config_dir)


@dataclass
class AgentEntry:
    name: str
    scope: str
    path: Path
    description: str = ""
    source: str = ""
    error: str | None = None
    shadowed: list[Path] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"name": self.name, "scope": self.scope, "path": str(self.path),
                "description": self.description, "source": self.source, "error": self.error,
                "shadowed": [str(p) for p in self.shadowed]}


def list_agents(project: Path | None, config_dir: Path) -> list[AgentEntry]:
    """Every agent name with its winning copy (invalid ones carry ``error``)."""
    winners: dict[str, AgentEntry] = {}
    for base, scope in agent_bases(project, config_dir):
        try:
            names = sorted(e.name for e in os.scandir(base)
                           if not e.name.startswith(".") and e.is_dir())
        except OSError:
            continue
        for name in names:
            if name in winners:
                winners[name].shadowed.append(base / name)
                continue
            entry = AgentEntry(name, scope, base / name)
            try:
                check_agent_name(name)
                m = _load_dir(base / name, scope, project, config_dir)
                entry.description, entry.source = m.description, m.source
            except AgentError as exc:
                entry.error = str(exc)
            winners[name] = entry
    return [winners[n] for n in sorted(winners)]


# --- model selection ----------------------------------------------------------------


@dataclass(frozen=True)
class ModelChoice:
    provider: str
    model: str | None          # None: let the driver use its default model
    fallback: str = ""
    fallback_provider: str = ""
    reasoning_effort: str = ""
    provider_from: str = ""    # "request" | "agent" | "default"
    model_from: str = ""       # "request" | "agent" | "driver"


def select_model(agent: AgentManifest | None, *, default_provider: str,
                 request_provider: str | None = None, request_model: str | None = None,
                 driver_default: dict[str, str] | None = None) -> ModelChoice:
    """Provider and model for a spawn: request > agent manifest > default.

    The manifest's ``preferred`` model belongs to the manifest's provider: it
    applies only when that provider is the one chosen (a request that picks
    another provider gets that provider's default model, not a model name
    the other provider may not know).
    """
    models = agent.models if agent is not None else AgentModels()
    if request_provider:
        provider, pfrom = request_provider, "request"
    elif models.provider:
        provider, pfrom = models.provider, "agent"
    else:
        provider, pfrom = default_provider, "default"
    manifest_provider = models.provider or default_provider
    if request_model:
        model, mfrom = request_model, "request"
    elif models.preferred and provider == manifest_provider:
        model, mfrom = models.preferred, "agent"
    else:
        model, mfrom = (driver_default or {}).get(provider), "driver"
    same = provider == manifest_provider
    return ModelChoice(provider=provider, model=model,
                       fallback=models.fallback if same else "",
                       fallback_provider=models.fallback_provider if same else "",
                       reasoning_effort=models.reasoning_effort,
                       provider_from=pfrom, model_from=mfrom)
