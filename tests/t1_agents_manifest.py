"""agent.yaml: every field, defaults, lookup, path safety, model selection."""
from __future__ import annotations

import os

import pytest

from rnixfs.agents import (
    AgentError, AgentNotFound, agent_write_scope, list_agents, load_agent, parse_agent_yaml,
    parse_duration, select_model,
)
from rnixfs.agents.manifest import MAX_AGENT_YAML_BYTES, MAX_INSTRUCTIONS_BYTES

FULL = """\
name: full
description: Every field
models:
  provider: deepseek
  preferred: deepseek-v4-flash
  fallback: deepseek-v4-pro
  fallback_provider: local
  reasoning_effort: high
skills: [code-analysis, security-scan]
deferred_skills: [pr-review]
tools: [Read, /dev/shell]
mcp: [playwright]
planning: false
max_steps: 12
max_tokens: 50000
max_cost: 0.25
context_budget: 8192
ctx_size: 4096
step_timeout: 10m
compact_timeout: 60s
loop_threshold: -1
coarse_loop_threshold: 40
sla: {max_tokens: 100}
alternatives: [code-analyst]
language: French
project_doc: false
"""


def make_agent(base, name, yaml_text=None, instructions="You are a test agent.\n"):
    d = base / name
    d.mkdir(parents=True, exist_ok=True)
    if yaml_text is not None:
        (d / "agent.yaml").write_text(yaml_text)
    if instructions is not None:
        (d / "instructions.md").write_text(instructions)
    return d


@pytest.fixture
def dirs(tmp_path):
    project, cfg = tmp_path / "proj", tmp_path / "cfg"
    project.mkdir()
    return project, cfg, project / ".rnix" / "agents", cfg / "agents"


def test_every_field(dirs):
    project, cfg, pbase, _ = dirs
    make_agent(pbase, "full", FULL, "Be thorough.\n")
    m = load_agent("full", project, cfg)
    assert m.name == "full" and m.description == "Every field"
    assert (m.models.provider, m.models.preferred, m.models.fallback, m.models.fallback_provider,
            m.models.reasoning_effort) == ("deepseek", "deepseek-v4-flash", "deepseek-v4-pro", "local", "high")
    assert m.skills == ["code-analysis", "security-scan"] and m.deferred_skills == ["pr-review"]
    assert m.tools == ["Read", "Bash"] and m.mcp == ["playwright"]
    assert m.planning is False and m.project_doc is False
    assert (m.max_steps, m.max_tokens, m.max_cost, m.context_budget, m.ctx_size) == (12, 50000, 0.25, 8192, 4096)
    assert (m.step_timeout, m.step_timeout_s) == ("10m", 600.0)
    assert m.compact_timeout == "60s" and m.loop_threshold == -1 and m.coarse_loop_threshold == 40
    assert m.sla == {"max_tokens": 100} and m.alternatives == ["code-analyst"] and m.language == "French"
    assert m.instructions == "Be thorough.\n" and m.scope == "project"
    # every field read but not acted on is a warning, never silence
    assert m.warnings == [f"{k} is set but rnixfs does not act on it: it has no effect" for k in
                          ("sla", "alternatives", "compact_timeout", "loop_threshold",
                           "coarse_loop_threshold")]
    assert m.path == pbase / "full"
    assert m.to_json()["models"]["preferred"] == "deepseek-v4-flash"


def test_defaults():
    m = parse_agent_yaml("name: bare\n")
    assert m.planning is True and m.project_doc is True
    assert (m.step_timeout, m.step_timeout_s) == ("5m", 300.0)
    assert (m.max_steps, m.max_tokens, m.max_cost, m.context_budget, m.ctx_size) == (0, 0, 0.0, 0, 0)
    assert m.skills == [] and m.tools == [] and m.models.provider == "" and m.language == ""


@pytest.mark.parametrize("value,seconds", [("0", 0.0), (0, 0.0), ("10m", 600.0), ("30s", 30.0),
                                           ("1h", 3600.0), ("500ms", 0.5), (45, 45.0), ("1.5m", 90.0)])
def test_step_timeout_values(value, seconds):
    m = parse_agent_yaml(f"name: a\nstep_timeout: {value!r}\n" if isinstance(value, str) else
                         f"name: a\nstep_timeout: {value}\n")
    assert m.step_timeout_s == seconds
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("text,msg", [
    ("name: a\nstep_timeout: soon\n", "step_timeout must be a duration"),
    ("name: a\nstep_timeout: 8d\n", "step_timeout must be a duration"),
    ("name: a\nstep_timeout: 9999999\n", "between 0 and 7 days"),
    ("name: a\nstep_timeout: true\n", "step_timeout must be a duration"),
    ("name: a\nmax_steps: -1\n", "max_steps must be a non-negative whole number"),
    ("name: a\nmax_steps: ten\n", "max_steps must be a non-negative whole number"),
    ("name: a\nmax_tokens: 1.5\n", "max_tokens must be a non-negative whole number"),
    ("name: a\nmax_cost: -2\n", "max_cost must be a non-negative number"),
    ("name: a\nplanning: maybe\n", "planning must be true or false"),
    ("name: a\nproject_doc: 'no'\n", "project_doc must be true or false"),
    ("name: a\nskills: code-analysis\n", "skills must be a list of names"),
    ("name: a\nskills: [1, '']\n", "skills must be a list of names"),
    ("name: a\nmodels: deepseek\n", "models must be a mapping"),
    ("name: a\nmodels: {preferred: [x]}\n", "models.preferred must be text"),
    ("name: a\ntools: {Read: yes}\n", "tools must be a list"),
    ("name: a\nmcp: 3\n", "mcp must be"),
    ("name: a\nsla: fast\n", "sla must be a mapping"),
    ("description: no name\n", "missing required field: name"),
    ("- a\n- b\n", "top level must be a mapping"),
    ("name: [unclosed\n", "invalid YAML"),
    ("name: a\nb: *nope\n", "invalid YAML"),
    ("name: &n a\nsla: {x: *n}\n", "aliases (*name) are not allowed"),
    ("name: a\nname: b\n", "found duplicate key 'name'"),
])
def test_bad_manifests(text, msg):
    with pytest.raises(AgentError) as e:
        parse_agent_yaml(text)
    assert msg in str(e.value) and str(e.value).startswith("agent.yaml: ")
    assert "\n" not in str(e.value)


def test_unknown_keys_and_name_mismatch_are_warnings():
    m = parse_agent_yaml("name: other\nmax_step: 3\nmodels: {prefered: x}\n", "dir-name")
    assert "unknown key 'max_step' ignored" in m.warnings
    assert "unknown key 'models.prefered' ignored" in m.warnings
    assert "name 'other' differs from its directory 'dir-name'" in m.warnings


def test_project_over_user(dirs):
    project, cfg, pbase, ubase = dirs
    make_agent(ubase, "a", "name: a\ndescription: user\n")
    assert load_agent("a", project, cfg).scope == "user"
    make_agent(pbase, "a", "name: a\ndescription: project\n")
    m = load_agent("a", project, cfg)
    assert (m.scope, m.description) == ("project", "project")
    assert load_agent("a", None, cfg).description == "user"


def test_unknown_agent(dirs):
    project, cfg, *_ = dirs
    with pytest.raises(AgentNotFound, match='agent "ghost" not found'):
        load_agent("ghost", project, cfg)


@pytest.mark.parametrize("name", ["../x", "..", ".", "a/b", "/etc", "a\\b", "", ".hidden", "x" * 65,
                                  "a\x00b", "-x", "a..b", "../../cfg/agents/a"])
def test_names_cannot_escape(dirs, name):
    project, cfg, pbase, ubase = dirs
    make_agent(ubase, "a", "name: a\n")
    make_agent(pbase.parent, "x", "name: x\n")      # .rnix/x: one level up from agents/
    with pytest.raises(AgentError, match="invalid agent name"):
        load_agent(name, project, cfg)


def test_missing_and_broken_files(dirs):
    project, cfg, pbase, _ = dirs
    make_agent(pbase, "noyaml", None)
    make_agent(pbase, "noinstr", "name: noinstr\n", instructions=None)
    make_agent(pbase, "badyaml", "name: [x\n")
    d = make_agent(pbase, "dirfile", "name: dirfile\n", instructions=None)
    (d / "instructions.md").mkdir()
    d = make_agent(pbase, "latin", "name: latin\n")
    (d / "instructions.md").write_bytes(b"caf\xe9\n")
    for name, msg in [("noyaml", "missing agent.yaml"), ("noinstr", "missing instructions.md"),
                      ("badyaml", "invalid YAML"), ("dirfile", "instructions.md is not a regular file"),
                      ("latin", "not valid UTF-8")]:
        with pytest.raises(AgentError) as e:
            load_agent(name, project, cfg)
        assert msg in str(e.value) and f'agent "{name}"' in str(e.value)


def test_huge_files_refused(dirs):
    project, cfg, pbase, _ = dirs
    d = make_agent(pbase, "huge", "name: huge\n")
    with open(d / "instructions.md", "wb") as f:
        f.truncate(MAX_INSTRUCTIONS_BYTES + 1)
    with pytest.raises(AgentError, match="the cap is"):
        load_agent("huge", project, cfg)
    d = make_agent(pbase, "hugeyaml", None)
    (d / "agent.yaml").write_text("name: hugeyaml\n#" + "x" * MAX_AGENT_YAML_BYTES)
    with pytest.raises(AgentError, match="the cap is"):
        load_agent("hugeyaml", project, cfg)


def test_fifo_does_not_block(dirs):
    project, cfg, pbase, _ = dirs
    d = make_agent(pbase, "fifo", None)
    os.mkfifo(d / "agent.yaml")
    with pytest.raises(AgentError, match="not a regular file"):
        load_agent("fifo", project, cfg)


def test_project_symlinks_out_of_the_tree_are_refused(dirs, tmp_path):
    project, cfg, pbase, _ = dirs
    outside = make_agent(tmp_path / "elsewhere", "evil", "name: evil\n")
    pbase.mkdir(parents=True)
    os.symlink(outside, pbase / "evil")
    with pytest.raises(AgentError, match="leaves the project"):
        load_agent("evil", project, cfg)
    d = make_agent(pbase, "leak", "name: leak\n", instructions=None)
    secret = tmp_path / "secret.md"
    secret.write_text("secret instructions")
    os.symlink(secret, d / "instructions.md")
    with pytest.raises(AgentError, match="instructions.md is a symlink that leaves the project"):
        load_agent("leak", project, cfg)


def test_user_scope_symlinks_are_followed_inside_the_config_dir(dirs, tmp_path):
    project, cfg, _, ubase = dirs
    real = make_agent(cfg / "store", "mine", "name: mine\n")
    ubase.mkdir(parents=True)
    os.symlink(real, ubase / "mine")
    assert load_agent("mine", project, cfg).name == "mine"
    outside = make_agent(tmp_path / "store", "theirs", "name: theirs\n")
    os.symlink(outside, ubase / "theirs")
    with pytest.raises(AgentError, match="leaves its scope"):
        load_agent("theirs", project, cfg)


def test_list_agents(dirs):
    project, cfg, pbase, ubase = dirs
    make_agent(ubase, "shared", "name: shared\ndescription: user copy\n")
    make_agent(pbase, "shared", "name: shared\ndescription: project copy\n")
    make_agent(ubase, "broken", "name: [\n")
    make_agent(ubase, ".hidden", "name: hidden\n")
    (ubase / "file").write_text("x")
    entries = {e.name: e for e in list_agents(project, cfg)}
    assert list(entries) == ["broken", "shared"]
    assert entries["shared"].scope == "project" and entries["shared"].description == "project copy"
    assert entries["shared"].shadowed == [ubase / "shared"]
    assert "invalid YAML" in entries["broken"].error
    assert [e.name for e in list_agents(project / "missing", cfg)] == ["broken", "shared"]
    assert [e.scope for e in list_agents(None, cfg)] == ["user", "user"]


def test_agent_write_scope(dirs):
    project, cfg, *_ = dirs
    assert agent_write_scope(project, cfg).path == project / ".rnix" / "agents"
    assert agent_write_scope(None, cfg).path == cfg / "agents"


# --- model selection -------------------------------------------------------------------


def agent_with(provider="", preferred="", fallback="", fallback_provider="", effort=""):
    m = parse_agent_yaml("name: a\n")
    m.models.provider, m.models.preferred, m.models.fallback = provider, preferred, fallback
    m.models.fallback_provider, m.models.reasoning_effort = fallback_provider, effort
    return m


def test_model_priority_request_over_manifest_over_driver():
    a = agent_with("deepseek", "flash", "pro", "local", "high")
    drivers = {"deepseek": "deepseek-chat", "local": "SmolLM2", "groq": "llama"}
    c = select_model(a, default_provider="local", driver_default=drivers)
    assert (c.provider, c.model, c.provider_from, c.model_from) == ("deepseek", "flash", "agent", "agent")
    assert (c.fallback, c.fallback_provider, c.reasoning_effort) == ("pro", "local", "high")
    c = select_model(a, default_provider="local", request_model="big", driver_default=drivers)
    assert (c.provider, c.model, c.model_from) == ("deepseek", "big", "request")
    c = select_model(a, default_provider="local", request_provider="groq", driver_default=drivers)
    assert (c.provider, c.model, c.provider_from, c.model_from) == ("groq", "llama", "request", "driver")
    assert c.fallback == ""                       # the manifest's fallback belongs to deepseek
    c = select_model(None, default_provider="local", driver_default=drivers)
    assert (c.provider, c.model, c.provider_from) == ("local", "SmolLM2", "default")
    c = select_model(agent_with(preferred="tiny"), default_provider="local")
    assert (c.provider, c.model) == ("local", "tiny")     # no provider: preferred is for the default
    c = select_model(agent_with(), default_provider="local")
    assert c.model is None and c.model_from == "driver"
