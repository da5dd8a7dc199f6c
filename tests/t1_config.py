"""providers.yaml loading: strict, readable errors, secrets never shown."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from rnixfs.config import (ConfigError, default_config_dir, default_state_dir,
                           load_providers)

SECRET = "sk-test-very-secret-0123456789"

GOOD = """\
default: scripted
providers:
  scripted:
    type: openai
    base_url: http://127.0.0.1:8080/v1/
    api_key: ${RNIXFS_TEST_KEY}
    model: gpt-4o-mini
    timeout: 60
    connect_timeout: 10
    max_retries: 3
    retry_initial: 0.5
    retry_max: 8
    headers: {X-Org: acme}
    prices: {gpt-4o-mini: {input: 0.15, output: 0.6}}
  ollama:
    type: openai
    base_url: http://localhost:11434/v1
    model: llama3
"""


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "providers.yaml").write_text(textwrap.dedent(text))
    return tmp_path


def load_err(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as ei:
        load_providers(write(tmp_path, text))
    msg = str(ei.value)
    assert "\n" not in msg
    assert str(tmp_path / "providers.yaml") in msg
    return msg


def test_missing_file_gives_builtin_local(tmp_path):
    cfg = load_providers(tmp_path)
    assert cfg.default == "local"
    assert list(cfg.providers) == ["local"]
    assert cfg.providers["local"].type == "local"


def test_good_file(tmp_path, monkeypatch):
    monkeypatch.setenv("RNIXFS_TEST_KEY", SECRET)
    cfg = load_providers(write(tmp_path, GOOD))
    assert cfg.default == "scripted"
    assert set(cfg.providers) == {"local", "scripted", "ollama"}
    p = cfg.providers["scripted"]
    assert p.api_key == SECRET
    assert p.base_url == "http://127.0.0.1:8080/v1"
    assert (p.model, p.timeout, p.connect_timeout, p.max_retries) == ("gpt-4o-mini", 60, 10, 3)
    assert (p.retry_initial, p.retry_max) == (0.5, 8)
    assert p.headers == {"X-Org": "acme"}
    assert p.prices == {"gpt-4o-mini": {"input": 0.15, "output": 0.6}}
    assert cfg.providers["ollama"].api_key is None


def test_local_can_be_overridden_and_tuned(tmp_path):
    cfg = load_providers(write(tmp_path, """\
        providers:
          local: {type: openai, base_url: "http://127.0.0.1:11434/v1", model: qwen}
          tiny: {type: local, ctx: 2048, threads: 4, max_tokens: 64}
        """))
    assert cfg.default == "local"
    assert cfg.providers["local"].type == "openai"
    tiny = cfg.providers["tiny"]
    assert (tiny.type, tiny.ctx, tiny.threads, tiny.max_tokens) == ("local", 2048, 4, 64)


def test_env_expansion_in_strings(tmp_path, monkeypatch):
    monkeypatch.setenv("RNIXFS_TEST_HOST", "10.1.2.3")
    monkeypatch.setenv("RNIXFS_TEST_KEY", SECRET)
    cfg = load_providers(write(tmp_path, """\
        providers:
          remote:
            type: openai
            base_url: http://${RNIXFS_TEST_HOST}:8000/v1
            model: m
            headers: {X-Api-Key: "${RNIXFS_TEST_KEY}"}
        """))
    p = cfg.providers["remote"]
    assert p.base_url == "http://10.1.2.3:8000/v1"
    assert p.headers["X-Api-Key"] == SECRET
    assert SECRET not in repr(p) and SECRET not in str(p.describe())


def test_missing_env_var_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv("RNIXFS_TEST_NOPE", raising=False)
    msg = load_err(tmp_path, """\
        providers:
          x: {type: openai, base_url: "http://h/v1", model: m, api_key: "${RNIXFS_TEST_NOPE}"}
        """)
    assert "RNIXFS_TEST_NOPE" in msg and "api_key" in msg and "'x'" in msg


def test_bad_yaml(tmp_path):
    msg = load_err(tmp_path, "providers:\n  x: {type: openai\n  y: [\n")
    assert "invalid YAML" in msg and "line" in msg


@pytest.mark.parametrize("entry, words", [
    ("{type: openai, base_url: http://h/v1, model: m, timeout: fast}", "timeout"),
    ("{type: openai, base_url: http://h/v1, model: m, max_retries: 1.5}", "max_retries"),
    ("{type: openai, base_url: http://h/v1, model: m, max_retries: true}", "max_retries"),
    ("{type: openai, base_url: http://h/v1, model: m, headers: [a]}", "headers"),
    ("{type: openai, base_url: 8080, model: m}", "base_url"),
    ("{type: openai, base_url: ftp://h, model: m}", "base_url"),
    ("{type: openai, model: m}", "base_url is required"),
    ("{type: openai, base_url: http://h/v1, model: m, prices: {m: {input: x}}}", "prices"),
    ("{type: openai, base_url: http://h/v1, model: m, colour: red}", "unknown key"),
    ("{type: local, base_url: http://h/v1}", "unknown key"),
    ("[not, a, mapping]", "mapping"),
])
def test_bad_types(tmp_path, entry, words):
    msg = load_err(tmp_path, f"providers:\n  x: {entry}\n")
    assert words in msg


def test_bad_top_level(tmp_path):
    assert "unknown top-level" in load_err(tmp_path, "provider: {}\n")
    assert "no provider named 'nope'" in load_err(tmp_path, "default: nope\n")
    assert "mapping" in load_err(tmp_path, "- a\n- b\n")


def test_unknown_type(tmp_path):
    assert "type must be one of" in load_err(tmp_path, "providers:\n  x: {type: grpc}\n")
    msg = load_err(tmp_path, "providers:\n  x: {type: claude-cli, base_url: http://x}\n")
    assert "unknown key(s) for type claude-cli: base_url" in msg


def test_cli_types_default_to_their_command(tmp_path):
    cfg = load_providers(write(tmp_path, "providers:\n  c: {type: cursor-cli}\n  k: {type: claude-cli}\n"))
    assert cfg.providers["c"].command == "cursor-agent" and cfg.providers["k"].command == "claude"
    assert cfg.providers["k"].tool_mode == "schema"


@pytest.mark.parametrize("name", ["Upper", "-dash", "sp ace", "a" * 65, "ü"])
def test_bad_name(tmp_path, name):
    msg = load_err(tmp_path, f'providers:\n  "{name}": {{type: local}}\n')
    assert "bad provider name" in msg


def test_key_never_in_repr_or_describe(tmp_path, monkeypatch):
    monkeypatch.setenv("RNIXFS_TEST_KEY", SECRET)
    cfg = load_providers(write(tmp_path, GOOD))
    p = cfg.providers["scripted"]
    for text in (repr(p), str(p), str(p.describe()), repr(cfg), str(cfg.describe())):
        assert SECRET not in text
    assert p.describe()["api_key"] == "set"
    assert "api_key" not in cfg.providers["ollama"].describe()


def test_default_dirs(monkeypatch, tmp_path):
    monkeypatch.setenv("RNIXFS_STATE_DIR", str(tmp_path / "s"))
    monkeypatch.setenv("RNIXFS_CONFIG_DIR", str(tmp_path / "c"))
    assert default_state_dir() == tmp_path / "s"
    assert default_config_dir() == tmp_path / "c"
    monkeypatch.delenv("RNIXFS_STATE_DIR")
    monkeypatch.delenv("RNIXFS_CONFIG_DIR")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xs"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xc"))
    assert default_state_dir() == tmp_path / "xs" / "rnixfs"
    assert default_config_dir() == tmp_path / "xc" / "rnix"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_state_dir() == tmp_path / ".local" / "state" / "rnixfs"
    assert default_config_dir() == tmp_path / ".config" / "rnix"
