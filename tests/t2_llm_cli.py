"""claude-cli / cursor-cli drivers, driven against a STAND-IN executable.

The stand-in below is not Claude or Cursor: it is a small script that speaks
the documented headless protocol (``-p --output-format json``, prompt on
stdin, one JSON result object on stdout), so the driver's process handling,
parsing and errors are tested for real without the vendors' binaries.
"""
from __future__ import annotations

import json
import os
import stat
import sys
from contextlib import aclosing

import pytest
import trio

from rnixfs.config import parse_providers
from rnixfs.devices.llm.base import LLMError, LLMTimeout
from rnixfs.devices.llm.cli_driver import CLIProvider, render

STAND_IN = """#!{python}
# STAND-IN for the claude / cursor-agent CLI (tests only).
import json, os, sys, time
args = sys.argv[1:]
assert args[:3] == ["-p", "--output-format", "json"], args
prompt = sys.stdin.read()
with open(os.environ["STANDIN_LOG"], "a") as f:
    f.write(json.dumps({{"argv": args, "prompt": prompt}}) + "\\n")
last = prompt.strip().splitlines()[-1]
mode = os.environ.get("STANDIN_MODE", "ok")
if "sleep" in last:
    time.sleep(30)
if "crash" in last:
    print("boom", file=sys.stderr); sys.exit(3)
if "garbage" in last:
    print("not json"); sys.exit(0)
if "refuse" in last:
    print(json.dumps({{"type": "result", "is_error": True, "result": "refused"}})); sys.exit(0)
print(json.dumps({{"type": "result", "is_error": False, "result": "cli: " + last,
                  "usage": {{"input_tokens": len(prompt.split()), "output_tokens": 2}}}}))
"""


@pytest.fixture
def standin(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("claude", "cursor-agent"):
        exe = bindir / name
        exe.write_text(STAND_IN.format(python=sys.executable))
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("STANDIN_LOG", str(tmp_path / "calls.jsonl"))
    return tmp_path / "calls.jsonl"


def provider(kind="claude-cli", **extra) -> CLIProvider:
    lines = ["providers:", "  c:", f"    type: {kind}", "    timeout: 2"]
    lines += [f"    {k}: {json.dumps(v)}" for k, v in extra.items()]
    return CLIProvider(parse_providers("\n".join(lines) + "\n").providers["c"])


def ask(p: CLIProvider, text: str, **kw):
    async def main():
        out = []
        async with aclosing(p.stream_chat([{"role": "system", "content": "sys"},
                                           {"role": "user", "content": text}], **kw)) as s:
            async for c in s:
                out.append(c)
        return out

    return trio.run(main)


@pytest.mark.parametrize("kind", ["claude-cli", "cursor-cli"])
def test_answer_and_usage(standin, kind):
    chunks = ask(provider(kind, model="m1", args=["--x"]), "hello there")
    assert chunks[0].text == "cli: hello there" and chunks[-1].usage.completion_tokens == 2
    call = json.loads(standin.read_text().splitlines()[-1])
    assert call["argv"] == ["-p", "--output-format", "json", "--model", "m1", "--x"]
    assert call["prompt"].startswith("sys\n\n[user]\nhello there")


@pytest.mark.parametrize("text,cls,words", [
    ("crash", LLMError, "exited 3: boom"),
    ("garbage", LLMError, "printed no JSON"),
    ("refuse", LLMError, "reported an error: refused"),
    ("sleep", LLMTimeout, "no answer within 2s"),
])
def test_failures(standin, text, cls, words):
    with pytest.raises(cls) as exc:
        ask(provider(), text)
    assert words in str(exc.value)


def test_missing_command():
    with pytest.raises(LLMError) as exc:
        ask(provider(command="no-such-cli-xyz"), "hi")
    assert "not found on PATH" in str(exc.value)


def test_render_keeps_roles():
    text = render([{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                   {"role": "assistant", "content": "A"}, {"role": "tool", "content": "T"}])
    assert text == "S\n\n[user]\nU\n\n[assistant]\nA\n\n[tool result]\nT\n"


# -- the CLI's own tools are bounded by the process's grants (docs/devices.md) -------------

def argv_of(log) -> list[str]:
    return json.loads(log.read_text().splitlines()[-1])["argv"]


def flag(argv: list[str], name: str) -> list[str]:
    return argv[argv.index(name) + 1].split(",") if name in argv else []


def test_claude_unrestricted_process_gets_no_tool_flags(standin):
    ask(provider("claude-cli"), "hi", grants=[])
    argv = argv_of(standin)
    assert "--allowedTools" not in argv and "--disallowedTools" not in argv


def test_claude_gets_allowed_and_disallowed_tools_from_the_grants(standin):
    ask(provider("claude-cli", args=["--verbose"]), "hi", grants=["Bash(git:*)", "Read", "Skill"])
    argv = argv_of(standin)
    allowed, denied = flag(argv, "--allowedTools"), flag(argv, "--disallowedTools")
    assert "Bash(git:*)" in allowed and "Read" in allowed and "NotebookRead" in allowed
    for tool in ("Write", "Edit", "MultiEdit", "WebFetch", "Glob", "Grep", "Task", "Bash"):
        assert tool not in allowed
    for tool in ("Write", "Edit", "MultiEdit", "NotebookEdit", "WebFetch", "WebSearch", "Task", "LS"):
        assert tool in denied
    assert "Bash" not in denied and "Read" not in denied  # a scoped Bash is left to claude's own rules
    assert argv.index("--verbose") < argv.index("--allowedTools")  # after the user's args


def test_claude_with_no_tools_at_all_disallows_every_tool(standin):
    ask(provider("claude-cli"), "hi", grants=["(none)"])
    argv = argv_of(standin)
    assert "--allowedTools" not in argv and {"Bash", "Read", "Write", "Edit"} <= set(flag(argv, "--disallowedTools"))


def test_claude_that_skips_permissions_is_refused_for_a_restricted_process(standin):
    with pytest.raises(LLMError, match="cannot be limited.*permission checks off.*unbounded_tools: true"):
        ask(provider("claude-cli", args=["--dangerously-skip-permissions"]), "hi", grants=["Read"])
    assert not standin.exists()  # nothing ran


def test_cursor_cannot_be_bounded_so_restricted_processes_are_refused(standin):
    with pytest.raises(LLMError, match=r"provider c \(cursor-cli\) cannot be limited .*\(Read, Grep\).*unbounded_tools: true"):
        ask(provider("cursor-cli"), "hi", grants=["Read", "Grep"])
    assert not standin.exists()
    ask(provider("cursor-cli"), "hi", grants=[])                 # unrestricted: runs
    chunks = ask(provider("cursor-cli", unbounded_tools=True), "hi", grants=["Read"])  # opted in
    assert chunks[0].text == "cli: hi"


def test_unbounded_tools_must_be_a_boolean():
    from rnixfs.config import ConfigError
    with pytest.raises(ConfigError, match="unbounded_tools: must be true or false"):
        provider("cursor-cli", unbounded_tools="yes")


def test_the_loop_passes_a_processes_grants_to_the_cli(tmp_path, standin):
    from rnixfs.kernel.plan import SpawnPlan
    from rnixfs.kernel.request import parse
    from tests.kernelutil import registry, run_with_kernel

    yaml = "default: c\nproviders:\n  c: {type: claude-cli, timeout: 20}\n  k: {type: cursor-cli, timeout: 20}\n"

    def plan(req, *, default_provider, driver_models, cwd):
        return SpawnPlan(agent="default", provider=req.provider or default_provider, model=None,
                         skills=[], allowed_tools=["Read", "Bash(git:*)"], system_prompt="SYS")

    async def body(k):
        out = []
        for prov in ("c", "k"):
            p = await k.spawn(parse(json.dumps({"intent": "go", "provider": prov}).encode()))
            await p.exited_event.wait()
            out.append(p)
        return out

    claude, cursor = run_with_kernel(tmp_path, lambda: registry(yaml, tmp_path), body, planner=plan)
    assert claude.exit_code == 0 and claude.result == "cli: go"
    argv = argv_of(standin)
    assert "Bash(git:*)" in flag(argv, "--allowedTools") and "Write" in flag(argv, "--disallowedTools")
    assert cursor.exit_code != 0 and "cannot be limited" in cursor.error["cause"]
    assert "unbounded_tools" in cursor.trace.decode()

@pytest.mark.parametrize("kind,effort,flag", [
    ("claude-cli", "high", ["--effort", "high"]),
    ("claude-cli", "minimal", ["--effort", "low"]),   # claude has no "minimal"
    ("cursor-cli", "high", []),                      # cursor-agent has no such flag
])
def test_reasoning_effort_becomes_the_cli_flag(standin, kind, effort, flag):
    ask(provider(kind, model="m1"), "think", extra={"reasoning_effort": effort})
    call = json.loads(standin.read_text().splitlines()[-1])
    assert call["argv"] == ["-p", "--output-format", "json", "--model", "m1", *flag]
