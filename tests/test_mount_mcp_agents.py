"""Tier 3: agents calling MCP tools as mcp__<server>__<tool>, driven by the
scripted OpenAI server, against the scripted MCP server of
tests/mcp_server.py (docs/devices.md, "dev/mcp")."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.mountutil import do_mount, cleanup, needs_fuse, scripted_providers, sh, wait_for

pytestmark = [needs_fuse, pytest.mark.mount]

SCRIPTED = str(Path(__file__).with_name("mcp_server.py"))
SERVER = {"command": sys.executable, "args": [SCRIPTED], "timeout": "20s"}


def call(name, args, cid):
    return {"id": cid, "function": {"name": name, "arguments": json.dumps(args)}}


@pytest.fixture
def world(tmp_path, scripted_server):
    project = tmp_path / "project"
    (project / ".rnix").mkdir(parents=True)
    (project / ".rnix" / "mcp.yaml").write_text(json.dumps({"servers": {"t": SERVER}}))
    m = do_mount(tmp_path, scripted_providers(scripted_server.url, timeout=60))
    yield m, scripted_server
    cleanup(m)


def agent(m, name: str, yaml: str) -> None:
    d = m.project / ".rnix/agents" / name
    d.mkdir(parents=True)
    (d / "agent.yaml").write_text(yaml)
    (d / "instructions.md").write_text(f"You are {name}.\n")


def tool_results(m, pid) -> list[str]:
    ctx = [json.loads(line) for line in open(m.p(f"proc/{pid}/context")) if line.strip()]
    return [msg["content"] for msg in ctx if msg["role"] == "tool"]


def trace(m, pid) -> str:
    return open(m.p(f"proc/{pid}/trace")).read()


def offered(request: dict) -> list[str]:
    return [t["function"]["name"] for t in request.get("tools", [])]


def test_agent_calls_an_mcp_tool(world):
    m, server = world
    agent(m, "mcpuser", "name: mcpuser\nplanning: false\nmcp: [t]\n")
    server.enqueue({"tool_calls": [call("mcp__t__add", {"a": 20, "b": 22}, "c1")]})
    server.enqueue("the sum is 42")
    pid = m.spawn(json.dumps({"intent": "add", "agent": "mcpuser"}))
    assert m.wait(pid, 120).startswith("exited(0)")
    assert tool_results(m, pid) == ["42\n"] or tool_results(m, pid) == ["42"]
    tools = offered(server.requests[0])
    assert "mcp__t__add" in tools and "mcp__t__echo" in tools and "Read" in tools
    spec = next(t for t in server.requests[0]["tools"] if t["function"]["name"] == "mcp__t__add")
    assert spec["function"]["parameters"]["required"] == ["a", "b"]
    tr = trace(m, pid)
    assert 'Call("t/add", 18 bytes) = 3 bytes' in tr, tr
    assert m.status(pid)["mcp_servers"] == ["t"]


def test_grants_restrict_mcp_tools(world):
    m, server = world
    agent(m, "narrow", "name: narrow\nplanning: false\nmcp: [t]\ntools: [Read]\n")
    agent(m, "wide", "name: wide\nplanning: false\nmcp: [t]\ntools: [Read, 'mcp__t__*']\n")
    server.enqueue({"tool_calls": [call("mcp__t__add", {"a": 1, "b": 2}, "c1")]})
    server.enqueue("denied")
    pid = m.spawn(json.dumps({"intent": "try", "agent": "narrow"}))
    assert m.wait(pid, 120).startswith("exited(0)")
    assert not [t for t in offered(server.requests[0]) if t.startswith("mcp__")]
    assert tool_results(m, pid)[0].startswith("error: "), tool_results(m, pid)
    assert "3" not in tool_results(m, pid)[0]
    server.reset()
    server.enqueue({"tool_calls": [call("mcp__t__add", {"a": 1, "b": 2}, "c1")]})
    server.enqueue("ok")
    pid = m.spawn(json.dumps({"intent": "try", "agent": "wide"}))
    assert m.wait(pid, 120).startswith("exited(0)")
    assert "mcp__t__add" in offered(server.requests[0])
    assert tool_results(m, pid)[0].strip() == "3"


def test_unknown_server_fails_the_spawn(world):
    m, _ = world
    agent(m, "ghost", "name: ghost\nmcp: [nope]\n")
    res = sh(f'exec 3<>"{m.p("proc/new")}"; echo \'{{"intent": "x", "agent": "ghost"}}\' >&3; '
             f'rc=$?; head -n1 <&3; exit $rc')
    assert res.returncode != 0 and "No such file" in res.stderr
    assert "nope" in res.stdout and "not configured" in res.stdout
    assert m.daemon_alive()


def test_inline_servers_and_kill_cancels_a_call(world):
    m, server = world
    inline = json.dumps({"servers": {"inl": {**SERVER, "timeout": "300s"}}})
    agent(m, "inliner", f"name: inliner\nplanning: false\nmcp: {inline}\n")
    server.enqueue({"tool_calls": [call("mcp__inl__hang", {}, "c1")]})
    pid = m.spawn(json.dumps({"intent": "hang", "agent": "inliner"}))
    wait_for(lambda: any("/dev/mcp/inl/tools/hang/call" in d for d in m.status(pid)["fds"].values()),
             60, what="the MCP call to be open in fd/")
    assert "inl" in os.listdir(m.p("dev/mcp"))
    sh(f'echo kill > "{m.p(f"proc/{pid}/ctl")}"', check=True)
    assert m.wait(pid, 30).startswith("exited(137)")
    assert m.daemon_alive()
