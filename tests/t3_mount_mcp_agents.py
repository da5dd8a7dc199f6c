"""Tier 3: agents calling MCP tools as mcp__<server>__<tool>, driven by the
scripted OpenAI server, against the scripted MCP server of
tests/mcp_server.py (docs/devices.md, "dev/mcp")."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.mountutil import do_mount, cleanup, needs_fuse, scripted_providers, sh, wait_for

pytestmark = [needs_fuse, pytest.mark.mount]

SCRIPTED = str(Path(__file__).with_name("mcp_server.py"))
SERVER = {"command": sys.executable, "args": [SCRIPTED], "timeout": "20s"}
# the reference server from PyPI (mcp-server-time), as a user configures it
REFERENCE = {"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}


def call(name, args, cid):
    return {"id": cid, "function": {"name": name, "arguments": json.dumps(args)}}


@pytest.fixture
def world(tmp_path, scripted_server):
    project = tmp_path / "project"
    (project / ".rnix").mkdir(parents=True)
    (project / ".rnix" / "mcp.yaml").write_text(json.dumps({"servers": {
        "t": SERVER, "time": REFERENCE, "odd": {**SERVER, "env": {"MCP_TEST_ODD": "1"}}}}))
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
    assert 'Call("mcp__t__add", 18 bytes) = 3 bytes' in tr, tr
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


def test_agent_calls_a_reference_server_from_pypi(world):
    m, server = world
    agent(m, "clock", "name: clock\nplanning: false\nmcp: [time]\n")
    server.enqueue({"tool_calls": [call("mcp__time__get_current_time", {"timezone": "Asia/Tokyo"}, "c1")]})
    server.enqueue("it is late in Tokyo")
    pid = m.spawn(json.dumps({"intent": "what time is it in Tokyo", "agent": "clock"}))
    assert m.wait(pid, 120).startswith("exited(0)")
    assert "mcp__time__get_current_time" in offered(server.requests[0])
    answer = json.loads(tool_results(m, pid)[0])
    assert answer["timezone"] == "Asia/Tokyo" and answer["datetime"].endswith("+09:00"), answer
    assert 'Call("mcp__time__get_current_time", 26 bytes) = ' in trace(m, pid), trace(m, pid)


def test_tool_names_a_provider_would_refuse_are_left_out(world):
    m, server = world
    agent(m, "oddball", "name: oddball\nplanning: false\nmcp: [odd]\n")
    server.enqueue({"tool_calls": [call("mcp__odd__add", {"a": 1, "b": 2}, "c1")]})
    server.enqueue("done")
    pid = m.spawn(json.dumps({"intent": "add", "agent": "oddball"}))
    assert m.wait(pid, 120).startswith("exited(0)")
    names = offered(server.requests[0])
    assert "mcp__odd__add" in names
    assert not [n for n in names if n.startswith("mcp__odd__") and not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", n)]
    assert tool_results(m, pid)[0].strip() == "3"
    assert "'a/b' skipped" in trace(m, pid), trace(m, pid)


@pytest.mark.expect_log('rnixfs\\.devices\\.mcp\\.mcp_config: mcp')
def test_a_server_whose_entry_is_unusable_fails_the_spawn_with_the_reason(tmp_path, scripted_server):
    project = tmp_path / "project"
    (project / ".rnix").mkdir(parents=True)
    (project / ".rnix" / "mcp.yaml").write_text(json.dumps({"servers": {
        "git": {**SERVER, "env": {"GIT_TOKEN": "${RNIXFS_TEST_UNSET_TOKEN}"}}}}))
    m = do_mount(tmp_path, scripted_providers(scripted_server.url, timeout=60))
    try:
        agent(m, "gitter", "name: gitter\nmcp: [git]\n")
        res = sh(f'exec 3<>"{m.p("proc/new")}"; echo \'{{"intent": "x", "agent": "gitter"}}\' >&3; '
                 f'rc=$?; head -n1 <&3; exit $rc')
        assert res.returncode != 0 and "No such file" in res.stderr
        assert "'git'" in res.stdout and "RNIXFS_TEST_UNSET_TOKEN is not set" in res.stdout, res.stdout
        assert m.daemon_alive()
    finally:
        cleanup(m)
