"""Creating agents and editing their skill lists without losing a byte of intent.

``agent.yaml`` is edited with ruamel.yaml's round-trip mode, so comments,
key order and quoting survive ``agent skill add|remove``; the new file is
written beside the old one and renamed into place (atomic). A new agent is
created by claiming its directory with ``mkdir`` (one of N concurrent
creators wins).
"""
from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from .manifest import AGENT_FILE, INSTRUCTIONS_FILE, MAX_AGENT_YAML_BYTES, AgentError, check_agent_name

INSTRUCTIONS_TEMPLATE = "# {name}\n\nDescribe how this agent works: its goal, its steps, what it reports.\n"


def _yaml() -> YAML:
    y = YAML(typ="rt")
    y.preserve_quotes = True
    y.indent(mapping=2, sequence=4, offset=2)
    y.width = 4096
    return y


def create_agent(name: str, base: Path, *, skills: list[str] | None = None, model: str = "",
                 provider: str = "", description: str = "") -> Path:
    check_agent_name(name)
    base = Path(base)
    base.mkdir(parents=True, exist_ok=True)
    target = base / name
    try:
        os.mkdir(target, 0o755)
    except FileExistsError:
        raise AgentError(f'agent "{name}" already exists at {target}') from None
    data = CommentedMap()
    data["name"] = name
    data["description"] = description or f"The {name} agent"
    models = CommentedMap()
    models["provider"] = provider
    models["preferred"] = model
    data["models"] = models
    data.yaml_add_eol_comment("empty: the default provider and model", "models")
    seq = CommentedSeq(list(skills or []))
    data["skills"] = seq
    try:
        _write(target / AGENT_FILE, data)
        with open(target / INSTRUCTIONS_FILE, "x", encoding="utf-8") as f:
            f.write(INSTRUCTIONS_TEMPLATE.format(name=name))
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    return target


def _write(path: Path, data) -> None:
    buf = io.StringIO()
    _yaml().dump(data, buf)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(buf.getvalue())
    os.replace(tmp, path)


def _load(path: Path):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise AgentError(f"{path}: no such agent.yaml") from None
    except OSError as exc:
        raise AgentError(f"{path}: {exc.strerror}") from None
    with os.fdopen(fd, "r", encoding="utf-8") as f:
        text = f.read(MAX_AGENT_YAML_BYTES + 1)
    if len(text) > MAX_AGENT_YAML_BYTES:
        raise AgentError(f"{path}: larger than {MAX_AGENT_YAML_BYTES} bytes")
    try:
        data = _yaml().load(text)
    except Exception as exc:      # ruamel raises many types; all mean "not valid YAML"
        raise AgentError(f"{path}: invalid YAML ({str(exc).splitlines()[0]})") from None
    if data is None:
        data = CommentedMap()
    if not isinstance(data, CommentedMap):
        raise AgentError(f"{path}: agent.yaml must be a mapping")
    return data


def edit_skills(agent_yaml: Path, *, add: list[str] = (), remove: list[str] = ()) -> list[str]:
    """Add/remove skill names in ``skills:`` keeping comments and order; returns the new list."""
    data = _load(agent_yaml)
    seq = data.get("skills")
    if seq is None:
        seq = CommentedSeq()
        data["skills"] = seq
    if not isinstance(seq, list) or not all(isinstance(s, str) for s in seq):
        raise AgentError(f"{agent_yaml}: skills must be a list of names")
    missing = [s for s in remove if s not in seq]
    if missing:
        raise AgentError(f"{agent_yaml}: skill {missing[0]!r} is not in the agent's skills")
    for s in remove:
        while s in seq:
            del seq[seq.index(s)]
    for s in add:
        if s not in seq:
            seq.append(s)
    _write(agent_yaml, data)
    return list(seq)


def read_skills(agent_yaml: Path) -> list[str]:
    seq = _load(agent_yaml).get("skills") or []
    return [str(s) for s in seq] if isinstance(seq, list) else []
