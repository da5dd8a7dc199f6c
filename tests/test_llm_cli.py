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
from rnixfs.devices.llm.cli import CLIProvider, render

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


@pytest.mark.parametrize("kind,effort,flag", [
    ("claude-cli", "high", ["--effort", "high"]),
    ("claude-cli", "minimal", ["--effort", "low"]),   # claude has no "minimal"
    ("cursor-cli", "high", []),                      # cursor-agent has no such flag
])
def test_reasoning_effort_becomes_the_cli_flag(standin, kind, effort, flag):
    ask(provider(kind, model="m1"), "think", extra={"reasoning_effort": effort})
    call = json.loads(standin.read_text().splitlines()[-1])
    assert call["argv"] == ["-p", "--output-format", "json", "--model", "m1", *flag]
