"""Where rnixfs keeps its state and config, and the providers.yaml loader.

The loader is strict (unknown keys and wrong types are errors) so that a typo
in providers.yaml fails loudly at mount time instead of silently falling back
to a default. Secrets come only from the environment and are never shown by
``repr()`` or ``describe()``.
"""
from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

log = logging.getLogger(__name__)

PROVIDERS_FILE = "providers.yaml"
LOCAL_NAME = "local"
LOCAL_MODEL = "SmolLM2-135M-Instruct"
NAME_RE = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
DEFAULT_MAX_REPLY_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_REPLY_TIME = 1800.0
_SUPPORTED = ("openai", "local", "claude-cli", "cursor-cli")
CLI_COMMANDS = {"claude-cli": "claude", "cursor-cli": "cursor-agent"}


class ConfigError(Exception):
    """A config file is unusable; the message is one readable line."""


def default_state_dir() -> Path:
    if v := os.environ.get("RNIXFS_STATE_DIR"):
        return Path(v)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "rnixfs"


def default_config_dir() -> Path:
    if v := os.environ.get("RNIXFS_CONFIG_DIR"):
        return Path(v)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "rnix"


@dataclass
class ProviderConfig:
    """One provider instance from providers.yaml (or the built-in ``local``).

    ``api_key`` and header values may be secrets: ``repr`` and ``describe``
    show only whether they are set.
    """

    name: str
    type: str
    model: str
    base_url: str | None = None
    api_key: str | None = field(default=None, repr=False)
    timeout: float = 60.0
    connect_timeout: float = 10.0
    max_retries: int = 3
    retry_initial: float = 0.5
    retry_max: float = 8.0
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    prices: dict[str, dict[str, float]] = field(default_factory=dict)
    max_tokens: int | None = None
    # Caps on one reply (one agent step, one dev/llm answer): bytes of text
    # and tool calls, and wall-clock seconds however steadily chunks arrive.
    max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES
    max_reply_time: float = DEFAULT_MAX_REPLY_TIME
    # How the model is asked for tool calls: "native" OpenAI function calling,
    # or "schema": a JSON reply constrained by response_format (weak models).
    tool_mode: str = "native"
    # type: claude-cli / cursor-cli only
    command: str | None = None
    args: list[str] = field(default_factory=list)
    # cursor-cli cannot limit its own tools: run it for restricted processes anyway?
    unbounded_tools: bool = False
    # type: local only
    ctx: int = 4096
    parallel: int = 2
    threads: int = 2

    def describe(self) -> dict:
        d: dict = {"name": self.name, "type": self.type, "model": self.model}
        if self.base_url:
            d["base_url"] = self.base_url
        if self.api_key:
            d["api_key"] = "set"
        if self.headers:
            d["headers"] = sorted(self.headers)  # names only: values may be secrets
        d.update(timeout=self.timeout, connect_timeout=self.connect_timeout,
                 max_retries=self.max_retries, max_reply_bytes=self.max_reply_bytes,
                 max_reply_time=self.max_reply_time)
        if self.max_tokens is not None:
            d["max_tokens"] = self.max_tokens
        if self.prices:
            d["prices"] = self.prices
        return d

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.describe().items())
        return f"ProviderConfig({inner})"


@dataclass
class ProvidersConfig:
    default: str
    providers: dict[str, ProviderConfig]
    path: Path | None = None
    # Environment variables providers.yaml reads (keys): never handed to the
    # commands agents run, so a prompt-injected agent cannot print them.
    secret_env: frozenset = frozenset()

    def child_env(self, base: dict | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        for name in self.secret_env:
            env.pop(name, None)
        return env

    def secret_values(self) -> set[str]:
        """Every string that must never leave the driver: each ``${ENV}``
        value providers.yaml expands, API keys, header values, and the
        credentials of a ``base_url`` (as written, decoded, and as the Basic
        auth header carries them)."""
        out = {os.environ[n] for n in self.secret_env if os.environ.get(n)}
        for p in self.providers.values():
            out.update(v for v in (p.api_key, *p.headers.values()) if v)
            out.update(url_credentials(p.base_url or ""))
        return out

    def describe(self) -> dict:
        return {"default": self.default,
                "providers": {n: p.describe() for n, p in self.providers.items()}}


def url_credentials(url: str) -> set[str]:
    """The secret forms of a URL's userinfo (``user:pass@``): raw, decoded,
    each part, and base64 of ``user:pass`` (the Basic auth header)."""
    import base64
    from urllib.parse import unquote, urlsplit

    try:
        parts = urlsplit(url)
    except ValueError:
        return set()
    if "@" not in parts.netloc:
        return set()
    info = parts.netloc.rpartition("@")[0]
    user, _, password = info.partition(":")
    out = {info, unquote(info), password, unquote(password)}
    if password:  # a bare user name is not a secret on its own
        out.add(base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode())
    return {s for s in out if s}


def builtin_local() -> ProviderConfig:
    """The embedded model: no config, no network, no key."""
    return ProviderConfig(name=LOCAL_NAME, type="local", model=LOCAL_MODEL,
                          timeout=120.0, max_retries=2, retry_initial=0.2,
                          retry_max=2.0, max_tokens=256, tool_mode="schema")


# --- validation helpers -------------------------------------------------------

_NUM = {"timeout", "connect_timeout", "retry_initial", "retry_max", "max_reply_time"}
_INT = {"max_retries", "max_tokens", "ctx", "parallel", "threads", "max_reply_bytes"}
_STR = {"type", "model", "base_url", "api_key", "tool_mode", "command"}
_COMMON = {"type", "model", "timeout", "connect_timeout", "max_retries",
           "retry_initial", "retry_max", "prices", "max_tokens", "tool_mode",
           "max_reply_bytes", "max_reply_time"}
TOOL_MODES = ("native", "schema")
_ALLOWED = {
    "openai": _COMMON | {"base_url", "api_key", "headers"},
    "local": _COMMON | {"ctx", "parallel", "threads"},
    "claude-cli": (_COMMON - {"max_tokens"}) | {"command", "args", "unbounded_tools"},
    "cursor-cli": (_COMMON - {"max_tokens"}) | {"command", "args", "unbounded_tools"},
}


def _expand(value: str, where: str) -> str:
    def sub(m: re.Match) -> str:
        var = m.group(1)
        if var not in os.environ:
            raise ValueError(f"{where}: environment variable {var} is not set")
        return os.environ[var]
    return _ENV_RE.sub(sub, value)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _provider(name: str, raw) -> ProviderConfig:
    """Validate one provider entry; raises ValueError with a short reason."""
    where = f"provider {name!r}"
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise ValueError(f"bad provider name {name!r} (want [a-z0-9][a-z0-9_.-]{{0,63}})")
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: must be a mapping, got {type(raw).__name__}")
    ptype = raw.get("type")
    if ptype not in _SUPPORTED:
        raise ValueError(f"{where}: type must be one of {', '.join(_SUPPORTED)}, got {ptype!r}")
    unknown = sorted(set(map(str, raw)) - _ALLOWED[ptype])
    if unknown:
        raise ValueError(f"{where}: unknown key(s) for type {ptype}: {', '.join(unknown)}")
    kw: dict = {}
    for key, v in raw.items():
        kwhere = f"{where}: {key}"
        if key in _STR:
            if not isinstance(v, str):
                raise ValueError(f"{kwhere}: must be a string, got {type(v).__name__}")
            kw[key] = _expand(v, kwhere)
        elif key in _NUM:
            if not _is_num(v) or v <= 0:
                raise ValueError(f"{kwhere}: must be a positive number, got {v!r}")
            kw[key] = float(v)
        elif key in _INT:
            if not isinstance(v, int) or isinstance(v, bool) or v < (0 if key == "max_retries" else 1):
                raise ValueError(f"{kwhere}: must be a {'non-negative' if key == 'max_retries' else 'positive'} integer, got {v!r}")
            kw[key] = v
        elif key == "headers":
            if not isinstance(v, dict) or not all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()):
                raise ValueError(f"{kwhere}: must be a mapping of strings to strings")
            kw[key] = {k: _expand(x, f"{kwhere}.{k}") for k, x in v.items()}
        elif key == "prices":
            kw[key] = _prices(v, kwhere)
        elif key == "unbounded_tools":
            if not isinstance(v, bool):
                raise ValueError(f"{kwhere}: must be true or false, got {v!r}")
            kw[key] = v
        elif key == "args":
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise ValueError(f"{kwhere}: must be a list of strings")
            kw[key] = [_expand(x, kwhere) for x in v]
    if kw.get("tool_mode", "native") not in TOOL_MODES:
        raise ValueError(f"{where}: tool_mode must be one of {', '.join(TOOL_MODES)}, got {kw['tool_mode']!r}")
    if ptype in CLI_COMMANDS:
        kw.setdefault("command", CLI_COMMANDS[ptype])
        kw.setdefault("model", "")
        kw.setdefault("tool_mode", "schema")
        kw.setdefault("timeout", 600.0)
        return ProviderConfig(name=name, **kw)
    if ptype == "openai":
        for req in ("base_url", "model"):
            if not kw.get(req):
                raise ValueError(f"{where}: {req} is required for type openai")
        if not re.match(r"https?://", kw["base_url"]):
            raise ValueError(f"{where}: base_url must start with http:// or https://")
        kw["base_url"] = kw["base_url"].rstrip("/")
        kw["api_key"] = kw.get("api_key") or None
        return ProviderConfig(name=name, **kw)
    base = builtin_local()
    for k, v in kw.items():
        setattr(base, k, v)
    base.name = name
    return base


def _prices(v, where: str) -> dict[str, dict[str, float]]:
    if not isinstance(v, dict):
        raise ValueError(f"{where}: must be a mapping of model to {{input, output}}")
    out = {}
    for model, p in v.items():
        if not isinstance(p, dict) or set(p) - {"input", "output"} or not all(_is_num(x) and x >= 0 for x in p.values()):
            raise ValueError(f"{where}.{model}: must be {{input: USD/1M, output: USD/1M}}")
        out[str(model)] = {k: float(x) for k, x in p.items()}
    return out


def _yaml_reason(e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    return f"invalid YAML{at}: {problem}"


def parse_providers(text: str, path: Path | None = None) -> ProvidersConfig:
    """Parse providers.yaml text; ``path`` is only used in error messages."""
    label = str(path) if path else PROVIDERS_FILE
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{label}: {_yaml_reason(e)}") from None
    try:
        cfg = _build(data, path)
    except ValueError as e:
        raise ConfigError(f"{label}: {e}") from None
    cfg.secret_env = frozenset(_ENV_RE.findall(text))
    return cfg


def _build(data, path: Path | None) -> ProvidersConfig:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"top level must be a mapping, got {type(data).__name__}")
    unknown = sorted(set(map(str, data)) - {"default", "providers"})
    if unknown:
        raise ValueError(f"unknown top-level key(s): {', '.join(unknown)}")
    raw = data.get("providers") or {}
    if not isinstance(raw, dict):
        raise ValueError("providers: must be a mapping of name to provider")
    providers = {LOCAL_NAME: builtin_local()}
    for name, entry in raw.items():
        providers[name] = _provider(name, entry)
    default = data.get("default", LOCAL_NAME)
    if not isinstance(default, str):
        raise ValueError(f"default: must be a provider name, got {default!r}")
    if default not in providers:
        raise ValueError(f"default: no provider named {default!r}")
    return ProvidersConfig(default=default, providers=providers, path=path)


def load_providers(config_dir: Path) -> ProvidersConfig:
    """Load ``config_dir/providers.yaml``; a missing file means only ``local``."""
    path = Path(config_dir) / PROVIDERS_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        log.debug("no %s; using the built-in local provider only", path)
        return ProvidersConfig(default=LOCAL_NAME,
                               providers={LOCAL_NAME: builtin_local()}, path=None)
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read: {e}") from None
    return parse_providers(text, path)
