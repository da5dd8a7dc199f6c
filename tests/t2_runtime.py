"""Tier 1: the agent runtime's loop — tool calls, denials, Spawn/Wait,
fallback, context budget, schema mode — against the scripted server."""
from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import trio

from rnixfs.kernel.plan import SpawnPlan
from rnixfs.kernel.request import parse
from rnixfs.kernel.tools import Tools
from tests.kernelutil import registry, run_with_kernel


PROVIDERS = """default: main
providers:
  main: {{type: openai, base_url: "{url}", model: m-main, max_retries: 0, retry_initial: 0.01}}
  backup: {{type: openai, base_url: "{url}", model: m-backup, max_retries: 0, retry_initial: 0.01}}
  schema: {{type: openai, base_url: "{url}", model: m-schema, tool_mode: schema, max_retries: 0}}
"""


def planner_with(**fields):
    def plan(req, *, default_provider, driver_models, cwd):
        base = dict(agent="default", provider=req.provider or default_provider, model=req.model,
                    skills=[], allowed_tools=[], system_prompt="SYS")
        base.update(fields)
        return SpawnPlan(**base)
    return plan


def run(tmp_path: Path, url: str, body, **plan_fields):
    return run_with_kernel(tmp_path, lambda: registry(PROVIDERS.format(url=url), tmp_path), body,
                           daemon_id="rt", planner=planner_with(**plan_fields),
                           tools=functools.partial(Tools, None, None, mount=""))


def call(name, args, cid="c1"):
    return {"id": cid, "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}


async def spawn_wait(k, text, **opts):
    proc = await k.spawn(parse(json.dumps({"intent": text, **opts}).encode()))
    await proc.exited_event.wait()
    return proc


def tool_messages(p):
    return [m for m in p.messages if m["role"] == "tool"]


def test_denied_tool_is_a_permission_error_and_the_process_goes_on(tmp_path, scripted_server):
    scripted_server.enqueue({"tool_calls": [call("Bash", {"command": "rm -rf /"})]})
    scripted_server.enqueue("done anyway")
    p = run(tmp_path, scripted_server.url, lambda k: spawn_wait(k, "try"), allowed_tools=["Read"])
    assert p.exit_code == 0 and p.result == "done anyway"
    assert "permission denied: Bash is not allowed" in tool_messages(p)[0]["content"]
    assert "Bash(" in p.trace.decode() and "-1 [PERMISSION]" in p.trace.decode()
    # the model was only offered its allowed tools
    offered = [t["function"]["name"] for t in scripted_server.requests[0]["tools"]]
    assert offered == ["Read"]


@pytest.mark.parametrize("name", ["bash", "BASH", "Shell", "sh", "Run", "exec"])
def test_no_other_name_runs_a_shell(tmp_path, scripted_server, name):
    scripted_server.enqueue({"tool_calls": [call(name, {"command": "touch /tmp/never"})]})
    scripted_server.enqueue("ok")
    p = run(tmp_path, scripted_server.url, lambda k: spawn_wait(k, "x"), allowed_tools=["Read"])
    assert tool_messages(p)[0]["content"].startswith("error: unknown tool")
    assert p.exit_code == 0


def test_bad_arguments_are_reported_to_the_model(tmp_path, scripted_server):
    scripted_server.enqueue({"tool_calls": [call("Wait", "{not json", "a"), call("Wait", {"pid": "x"}, "b"),
                                            call("Spawn", {}, "c")]})
    scripted_server.enqueue("ok")
    p = run(tmp_path, scripted_server.url, lambda k: spawn_wait(k, "x"))
    msgs = [m["content"] for m in tool_messages(p)]
    assert msgs[0].startswith("error: arguments of Wait are not a JSON object")
    assert msgs[1] == 'error: argument "pid" must be a whole number'
    assert msgs[2] == 'error: missing argument "intent"'


def test_spawn_and_wait_children(tmp_path, scripted_server):
    scripted_server.enqueue({"match": "parent", "tool_calls": [call("Spawn", {"intent": "child work"})]})
    # the child is PID 2: the parent's next reply waits for it, then answers
    scripted_server.enqueue({"match": "spawned PID 2", "tool_calls": [call("Wait", {"pid": 2}, "w")]})
    scripted_server.enqueue({"match": "exited(0)", "content": "all done"})
    # the child answers slowly: the parent is still running (in Wait) when the test looks
    scripted_server.enqueue({"match": "child work", "content": "echo: child work", "delay": 0.5})

    async def body(k):
        parent = await k.spawn(parse(b"parent"))
        while not parent.children:
            await trio.sleep(0.01)
        child = k.table[next(iter(parent.children))]
        ppid_while_parent_runs = child.ppid
        await parent.exited_event.wait()
        return parent, child, ppid_while_parent_runs

    parent, child, ppid = run(tmp_path, scripted_server.url, body)
    assert ppid == parent.pid and child.ppid == 0  # reparented when the parent exited
    assert child.result == "echo: child work"
    results = [m["content"] for m in tool_messages(parent)]
    assert results[0] == f"spawned PID {child.pid}"
    assert results[1].startswith("exited(0) steps=1") and "echo: child work" in results[1]
    assert f"Spawn(\"child work\", agent=default) = PID({child.pid})" in parent.trace.decode()
    assert parent.result == "all done"


def test_wait_on_a_stranger_is_refused(tmp_path, scripted_server):
    async def body(k):
        other = await spawn_wait(k, "someone else")
        scripted_server.enqueue({"tool_calls": [call("Wait", {"pid": other.pid})]})
        scripted_server.enqueue("ok")
        return await spawn_wait(k, "x")

    p = run(tmp_path, scripted_server.url, body)
    assert "is not a child of this process" in tool_messages(p)[0]["content"]


def test_model_then_provider_fallback_in_the_trace(tmp_path, scripted_server):
    p = run(tmp_path, scripted_server.url, lambda k: spawn_wait(k, "[[fault:503x2]] hello"),
            fallback_model="m-cheap", fallback_provider="backup")
    assert p.exit_code == 0 and p.provider == "main" and p.model == "m-main"  # the spawn's choice
    st = p.status()
    assert (st["provider"], st["model"]) == ("main", "m-main")
    assert (st["fallback_provider"], st["fallback_model"]) == ("backup", "m-backup")  # in force
    models = [r["model"] for r in scripted_server.requests]
    assert models == ["m-main", "m-cheap", "m-backup"]
    trace = p.trace.decode()
    assert 'Fallback(model="m-main" -> "m-cheap")' in trace and "Fallback(provider=main -> backup)" in trace


def test_fallback_is_tried_once_then_the_error_stands(tmp_path, scripted_server):
    p = run(tmp_path, scripted_server.url, lambda k: spawn_wait(k, "[[fault:500]] x"),
            fallback_provider="backup")
    assert p.exit_code == 1 and p.active_provider == "backup" and p.error["code"] == "DRIVER"
    assert p.status()["provider"] == "main" and p.status()["fallback_provider"] == "backup"
    assert [r["model"] for r in scripted_server.requests] == ["m-main", "m-backup"]


def test_context_budget_compacts_old_tool_results_first(tmp_path, scripted_server):
    mark = "PARENT-MARK"  # only the parent's requests contain it: children answer by directive
    for i, pid in ((1, 2), (2, 3)):
        scripted_server.enqueue({"match": mark, "tool_calls": [call("Spawn", {"intent": f"[[tokens:300]] c{i}"}, f"s{i}")]})
        scripted_server.enqueue({"match": mark, "tool_calls": [call("Wait", {"pid": pid}, f"w{i}")]})
    scripted_server.enqueue({"match": mark, "content": "final"})
    p = run(tmp_path, scripted_server.url, lambda k: spawn_wait(k, mark, max_steps=10),
            budget={"context_budget": 900})
    assert p.exit_code == 0, p.error
    assert p.messages[0]["content"] == "SYS"  # the system prompt is never cut
    waits = [m["content"] for m in tool_messages(p) if "exited(" in m["content"] or "compacted" in m["content"]]
    assert waits[0].startswith("[compacted:") and waits[-1].startswith("exited(0)")
    assert "Compact(" in p.trace.decode()


def test_context_budget_that_cannot_be_met_ends_the_process(tmp_path, scripted_server):
    p = run(tmp_path, scripted_server.url, lambda k: spawn_wait(k, "x" * 4000),
            budget={"context_budget": 100})
    assert p.exit_code == 13 and "context_budget exceeded" in p.error["cause"]


def test_schema_mode_runs_tools_and_answers(tmp_path, scripted_server):
    scripted_server.enqueue(json.dumps({"tool": "Spawn", "arguments": {"intent": "helper"}}))
    scripted_server.enqueue(json.dumps({"tool": "answer", "arguments": {"text": "the answer"}}))
    p = run(tmp_path, scripted_server.url, lambda k: spawn_wait(k, "x", provider="schema"))
    assert p.exit_code == 0 and p.result == "the answer"
    first = scripted_server.requests[0]
    assert first["response_format"]["type"] == "json_schema"
    assert "answer" in first["response_format"]["json_schema"]["schema"]["properties"]["tool"]["enum"]
    assert "Reply with one JSON object" in first["messages"][0]["content"]
    assert any(m["content"].startswith("Result of Spawn:") for m in scripted_server.requests[1]["messages"])
    assert all("tool_result" not in m for m in scripted_server.requests[1]["messages"])


def test_tool_result_is_capped(tmp_path, scripted_server):
    from rnixfs.kernel.tools import RESULT_CAP, cap

    text = cap("é" * RESULT_CAP)
    assert len(text.encode()) < RESULT_CAP + 100 and "[truncated:" in text


def test_a_refused_request_skips_the_model_fallback(tmp_path, scripted_server):
    p = run(tmp_path, scripted_server.url, lambda k: spawn_wait(k, "[[fault:401]] x"),
            fallback_model="m-cheap", fallback_provider="backup")
    assert [r["model"] for r in scripted_server.requests] == ["m-main", "m-backup"]
    assert p.status()["fallback_provider"] == "backup" and "Fallback(model=" not in p.trace.decode()


def test_step_timeout_is_a_heartbeat(tmp_path, scripted_server):
    """A reply that keeps streaming outlives step_timeout; a silent one does not."""
    async def body(k):
        alive = await spawn_wait(k, "[[chunk-delay:0.2]] [[tokens:8]] steady", step_timeout="0.6s")
        silent = await spawn_wait(k, "[[delay:3]] silent", step_timeout="0.6s")
        return alive, silent

    alive, silent = run(tmp_path, scripted_server.url, body)
    assert alive.exit_code == 0 and alive.elapsed() > 0.6
    assert silent.exit_code == 124 and "no reply for step_timeout" in silent.error["cause"]


def test_schema_mode_tool_results_are_compacted_too(tmp_path, scripted_server):
    mark = "SCHEMA-MARK"
    for i, pid in ((1, 2), (2, 3)):
        scripted_server.enqueue({"match": mark, "content": json.dumps(
            {"tool": "Spawn", "arguments": {"intent": f"[[tokens:300]] c{i}"}})})
        scripted_server.enqueue({"match": mark, "content": json.dumps({"tool": "Wait", "arguments": {"pid": pid}})})
    scripted_server.enqueue({"match": mark, "content": json.dumps({"tool": "answer", "arguments": {"text": "ok"}})})
    p = run(tmp_path, scripted_server.url, lambda k: spawn_wait(k, mark, provider="schema", max_steps=10),
            budget={"context_budget": 1200})
    assert p.exit_code == 0, p.error
    results = [m["content"] for i, m in enumerate(p.messages) if i in p.tool_results]
    assert results[1].startswith("[compacted:") and results[-1].startswith("Result of Wait:\nexited(0)")
