"""Tier 1: limits and budgets that bind by default and bind children, and
the agent.yaml fields that steer the loop (planning, ctx_size,
reasoning_effort, fallback tool mode) — a live kernel against the scripted
server. The limits and exit codes are documented in README "Limits"."""
from __future__ import annotations

import functools
import json
import time

import pytest
import trio

from rnixfs.devices.fs import Workspace
from rnixfs.kernel.loop import PLAN_GO, PLAN_REQUEST
from rnixfs.kernel.plan import SpawnPlan
from rnixfs.kernel.request import SpawnRequest, parse
from rnixfs.kernel.tools import Tools
from rnixfs.limits import DEFAULT, Limits, LimitsError, load_limits, parse_limits
from tests.kernelutil import registry, run_with_kernel

PROVIDERS = """default: main
providers:
  main: {{type: openai, base_url: "{url}", model: m-main, max_retries: 0, retry_initial: 0.01{prices}}}
  schema: {{type: openai, base_url: "{url}", model: m-schema, tool_mode: schema, max_retries: 0}}
"""


def planner_with(**fields):
    def plan(req, *, default_provider, driver_models, cwd):
        base = dict(agent="default", provider=req.provider or default_provider, model=req.model,
                    skills=[], allowed_tools=[], system_prompt="SYS")
        base.update(fields)
        return SpawnPlan(**base)
    return plan


def run(tmp_path, url, body, *, limits=None, prices="", **plan_fields):
    (tmp_path / "a.txt").write_text("a\n")

    return run_with_kernel(tmp_path, lambda: registry(PROVIDERS.format(url=url, prices=prices), tmp_path),
                           body, daemon_id="lim", planner=planner_with(**plan_fields),
                           tools=functools.partial(Tools, Workspace(tmp_path), None, mount=""),
                           limits=limits)


def call(name, args, cid="c1"):
    return {"id": cid, "function": {"name": name, "arguments": json.dumps(args)}}


async def spawn_wait(k, text, **opts):
    proc = await k.spawn(parse(json.dumps({"intent": text, **opts}).encode()))
    await proc.exited_event.wait()
    return proc


def glob_forever(server, mark, n=80):
    """A model that never stops asking for tools (an endless Glob loop)."""
    for i in range(n):
        server.enqueue({"match": mark, "tool_calls": [call("Glob", {"pattern": "*.txt"}, f"g{i}")]})


# -- defaults: nothing runs unbounded ------------------------------------------------------


def test_an_endless_tool_loop_stops_at_the_default_max_steps(tmp_path, scripted_server):
    assert DEFAULT.max_steps == 50
    glob_forever(scripted_server, "LOOP")
    p = run(tmp_path, scripted_server.url, lambda k: spawn_wait(k, "LOOP"))
    assert p.exit_code == 10 and p.steps == 50
    assert p.error["cause"] == "max_steps exceeded: 50 steps done, limit 50"
    assert p.status()["budget"]["max_steps"] == 50 and len(scripted_server.requests) == 50


@pytest.mark.parametrize("manifest", [{}, {"max_steps": None}, {"max_steps": 0}])
def test_unset_or_zero_max_steps_in_the_manifest_means_the_default(tmp_path, scripted_server, manifest):
    glob_forever(scripted_server, "ZERO", 10)
    p = run(tmp_path, scripted_server.url, lambda k: spawn_wait(k, "ZERO"),
            limits=Limits(max_steps=4), budget=manifest)
    assert p.exit_code == 10 and p.steps == 4 and p.budget.max_steps == 4


def test_request_and_manifest_still_override_the_default(tmp_path, scripted_server):
    glob_forever(scripted_server, "OVR", 10)

    async def body(k):
        return await spawn_wait(k, "OVR", max_steps=2), await spawn_wait(k, "OVR")

    by_request, by_manifest = run(tmp_path, scripted_server.url, body, limits=Limits(max_steps=9),
                                  budget={"max_steps": 3})
    assert (by_request.exit_code, by_request.steps) == (10, 2)
    assert (by_manifest.exit_code, by_manifest.steps) == (10, 3)


def test_context_is_compacted_then_a_hard_stop_by_default(tmp_path, scripted_server):
    assert DEFAULT.context_budget == 100_000

    async def body(k):
        proc = await k.spawn(SpawnRequest(intent="word " * 100_000))  # ~125k tokens of JSON
        await proc.exited_event.wait()
        return proc

    p = run(tmp_path, scripted_server.url, body)
    assert p.exit_code == 13 and "context_budget exceeded" in p.error["cause"]
    assert scripted_server.requests == []  # stopped before sending it


def test_wall_time_ends_a_process_with_exit_14(tmp_path, scripted_server):
    assert DEFAULT.max_time == 3600.0
    start = time.monotonic()
    p = run(tmp_path, scripted_server.url, lambda k: spawn_wait(k, "[[delay:30]] slow", max_time="1s"))
    assert p.exit_code == 14 and p.error["cause"] == "max_time exceeded: ran 1s"
    assert time.monotonic() - start < 20
    assert "Exit(14)" in p.trace.decode()


def test_wall_time_default_comes_from_limits(tmp_path, scripted_server):
    p = run(tmp_path, scripted_server.url, lambda k: spawn_wait(k, "[[delay:30]] slow"),
            limits=Limits(max_time=0.5))
    assert p.exit_code == 14 and p.budget.max_time == 0.5


# -- children draw on their ancestors' budgets ---------------------------------------------


def test_a_one_step_parent_cannot_start_thirty_unbounded_children(tmp_path, scripted_server):
    """The hostile case: max_steps 1, max_cost 0.000001, 30 Spawns in one step."""
    mark = "SPAWN-STORM"
    scripted_server.enqueue({"match": mark, "usage": {"prompt_tokens": 0, "completion_tokens": 0},
                             "tool_calls": [call("Spawn", {"intent": f"child {i}"}, f"s{i}") for i in range(30)]})

    async def body(k):
        parent = await spawn_wait(k, mark, max_steps=1, max_cost=0.000001)
        kids = [p for p in k.table.values() if p.pid != parent.pid]
        for kid in kids:
            await kid.exited_event.wait()
        return parent, kids

    # 1 USD per 1M tokens: every child's first step costs more than the parent has
    parent, kids = run(tmp_path, scripted_server.url, body,
                       prices=", prices: {m-main: {input: 1.0, output: 1.0}}")
    assert parent.exit_code in (10, 12)
    assert 1 <= len(kids) <= DEFAULT.max_tool_calls == 16  # the rest of the 30 calls never ran
    trace = parent.trace.decode()
    assert "14 of 30 tool calls not run; max_tool_calls is 16 per step" in trace
    results = [m["content"] for m in parent.messages if m["role"] == "tool"]
    assert len(results) == 30 and sum(r.startswith("error: not run:") for r in results) == 14
    for kid in kids:
        st = kid.status()
        assert st["budget"]["max_cost"] <= 0.000001 and st["budget"]["max_steps"] == 50
        assert kid.exit_code == 12, kid.error
        assert "by PID %d and its descendants" % parent.pid in kid.error["cause"] or \
            kid.error["cause"].startswith("max_cost exceeded")
    assert sum(k.steps for k in kids) <= len(kids)  # one step each, then the parent's budget stopped them
    assert parent.status()["tree"]["descendants"] == len(kids)
    assert parent.account.cost > 0.000001  # the children's spend was charged to the parent


def test_max_children_per_process(tmp_path, scripted_server):
    mark = "MANY-KIDS"
    scripted_server.enqueue({"match": mark, "tool_calls": [
        call("Spawn", {"intent": f"kid {i}"}, f"s{i}") for i in range(5)]})
    scripted_server.enqueue({"match": mark, "content": "done"})
    p = run(tmp_path, scripted_server.url, lambda k: spawn_wait(k, mark), limits=Limits(max_children=3))
    results = [m["content"] for m in p.messages if m["role"] == "tool"]
    assert [r.startswith("spawned PID") for r in results] == [True, True, True, False, False]
    assert "max_children is 3" in results[3] and p.spawned == 3
    assert "-1 [AGAIN]" in p.trace.decode()


def test_max_descendants_counts_every_level(tmp_path, scripted_server):
    mark = "GRAND"
    # every process of the tree asks for one child, forever; max_descendants 3 stops it
    for i in range(8):
        scripted_server.enqueue({"match": mark, "tool_calls": [call("Spawn", {"intent": f"{mark} {i}"})]})

    async def body(k):
        root = await k.spawn(parse(json.dumps({"intent": mark, "max_steps": 2}).encode()))
        await root.exited_event.wait()
        with trio.fail_after(30):
            while any(p.alive for p in k.table.values()):
                await trio.sleep(0.02)
        return root, dict(k.table)

    root, table = run(tmp_path, scripted_server.url, body, limits=Limits(max_descendants=3, max_steps=2))
    assert len(table) == 4 and root.account.descendants == 3
    refused = [m["content"] for p in table.values() for m in p.messages if "max_descendants is 3" in
               (m.get("content") or "")]
    assert refused


def test_children_draw_on_the_parents_tokens(tmp_path, scripted_server):
    mark = "TOKEN-PARENT"
    scripted_server.enqueue({"match": mark, "usage": {"prompt_tokens": 100, "completion_tokens": 0},
                             "tool_calls": [call("Spawn", {"intent": "greedy child"})]})
    scripted_server.enqueue({"match": mark, "tool_calls": [call("Wait", {"pid": 2}, "w")]})
    scripted_server.enqueue({"match": "greedy child", "usage": {"prompt_tokens": 5000}, "content": "big"})

    async def body(k):
        parent = await k.spawn(parse(json.dumps({"intent": mark, "max_tokens": 1000}).encode()))
        while 2 not in k.table:
            await trio.sleep(0.01)
        child = k.table[2]
        await child.exited_event.wait()
        await parent.exited_event.wait()
        return parent, child

    parent, child = run(tmp_path, scripted_server.url, body)
    assert child.budget.max_tokens <= 1000 - 100  # min(own, what the parent had left)
    assert child.exit_code == 11 and f"by PID {parent.pid} and its descendants" in child.error["cause"]
    assert parent.exit_code == 11 and parent.tokens_in + parent.tokens_out < 1000  # its own count
    assert parent.status()["tree"]["tokens"] >= 5100


def test_a_child_gets_no_more_time_than_its_parent(tmp_path, scripted_server):
    mark = "TIME-PARENT"
    scripted_server.enqueue({"match": mark, "tool_calls": [call("Spawn", {"intent": "[[delay:30]] slow kid"})]})
    scripted_server.enqueue({"match": mark, "tool_calls": [call("Wait", {"pid": 2}, "w")]})

    async def body(k):
        parent = await k.spawn(parse(json.dumps({"intent": mark, "max_time": "2s"}).encode()))
        while 2 not in k.table:
            await trio.sleep(0.01)
        child = k.table[2]
        await child.exited_event.wait()
        await parent.exited_event.wait()
        return parent, child

    start = time.monotonic()
    parent, child = run(tmp_path, scripted_server.url, body)
    assert child.budget.max_time <= 2 and child.exit_code == 14 and parent.exit_code == 14
    assert time.monotonic() - start < 20


# -- agent.yaml fields in force ---------------------------------------------------------------


def test_planning_step_comes_first_without_tools(tmp_path, scripted_server):
    scripted_server.enqueue("1. look around\n2. answer")
    scripted_server.enqueue("done")
    p = run(tmp_path, scripted_server.url, lambda k: spawn_wait(k, "do it"), planning=True)
    assert p.exit_code == 0 and p.result == "done" and p.steps == 2
    assert p.plan == "1. look around\n2. answer"
    first, second = scripted_server.requests
    assert "tools" not in first and first["messages"][-1]["content"] == PLAN_REQUEST
    assert [t["function"]["name"] for t in second["tools"]][:1] == ["Read"]
    assert [m["content"] for m in second["messages"][2:]] == [PLAN_REQUEST, p.plan, PLAN_GO]
    assert 'Plan("1. look around\\n2. answer") = 24 bytes' in p.trace.decode()


def test_planning_false_skips_it(tmp_path, scripted_server):
    p = run(tmp_path, scripted_server.url, lambda k: spawn_wait(k, "do it"), planning=False)
    assert p.exit_code == 0 and p.plan is None and p.steps == 1
    assert len(scripted_server.requests) == 1 and "tools" in scripted_server.requests[0]


def test_planning_in_schema_mode_takes_the_answer_text(tmp_path, scripted_server):
    scripted_server.enqueue(json.dumps({"tool": "answer", "arguments": {"text": "1. plan"}}))
    scripted_server.enqueue(json.dumps({"tool": "answer", "arguments": {"text": "ok"}}))
    p = run(tmp_path, scripted_server.url, lambda k: spawn_wait(k, "x", provider="schema"), planning=True)
    assert p.plan == "1. plan" and p.result == "ok"
    assert "response_format" not in scripted_server.requests[0]
    assert "response_format" in scripted_server.requests[1]


def _valid_native(messages):
    """Every tool result follows the assistant message that asked for it."""
    asked: set[str] = set()
    for m in messages:
        if m["role"] == "assistant":
            asked = {c["id"] for c in m.get("tool_calls") or []}
        elif m["role"] == "tool":
            assert m["tool_call_id"] in asked, messages
    return True


def test_ctx_size_limits_message_slots(tmp_path, scripted_server):
    mark = "SLOTS"
    for i in range(6):
        scripted_server.enqueue({"match": mark, "tool_calls": [call("Read", {"path": "a.txt"}, f"r{i}")]})
    scripted_server.enqueue({"match": mark, "content": "finished"})
    p = run(tmp_path, scripted_server.url, lambda k: spawn_wait(k, mark), budget={"ctx_size": 6})
    assert p.exit_code == 0 and p.result == "finished"
    for req in scripted_server.requests:
        msgs = req["messages"]
        assert len(msgs) <= 6
        assert msgs[0] == {"role": "system", "content": "SYS"} and msgs[1]["content"] == mark
        assert _valid_native(msgs)
    last = scripted_server.requests[-1]["messages"]
    assert last[2]["content"].startswith("[compacted: ") and "ctx_size=6" in last[2]["content"]
    assert last[-1]["tool_call_id"] == "r5"  # the newest exchange is kept
    assert "Compact(ctx_size=6, " in p.trace.decode()


def test_ctx_size_in_schema_mode_keeps_tool_result_marks(tmp_path, scripted_server):
    mark = "SCHEMA-SLOTS"
    for _ in range(5):
        scripted_server.enqueue({"match": mark, "content": json.dumps({"tool": "Read", "arguments": {"path": "a.txt"}})})
    scripted_server.enqueue({"match": mark, "content": json.dumps({"tool": "answer", "arguments": {"text": "ok"}})})
    p = run(tmp_path, scripted_server.url, lambda k: spawn_wait(k, mark, provider="schema"),
            budget={"ctx_size": 5})
    assert p.exit_code == 0 and all(len(r["messages"]) <= 5 for r in scripted_server.requests)
    assert p.tool_results and all(p.messages[i]["content"].startswith("Result of Read:") for i in p.tool_results)


def test_reasoning_effort_is_sent_to_openai(tmp_path, scripted_server):
    async def body(k):
        await spawn_wait(k, "think")
        k.planner = planner_with()
        await spawn_wait(k, "plain")

    run(tmp_path, scripted_server.url, body, reasoning_effort="high")
    with_effort, without = scripted_server.requests
    assert with_effort["reasoning_effort"] == "high" and "reasoning_effort" not in without


def test_fallback_to_another_tool_mode_rebuilds_the_system_prompt(tmp_path, scripted_server):
    scripted_server.enqueue({"fault": "500"})
    scripted_server.enqueue(json.dumps({"tool": "answer", "arguments": {"text": "from schema"}}))
    p = run(tmp_path, scripted_server.url, lambda k: spawn_wait(k, "x"), fallback_provider="schema")
    assert p.exit_code == 0 and p.result == "from schema"
    native, schema = scripted_server.requests
    assert native["messages"][0]["content"] == "SYS" and "tools" in native
    assert schema["messages"][0]["content"].startswith("SYS\n\nReply with one JSON object")
    assert "response_format" in schema
    st = p.status()
    assert (st["provider"], st["model"]) == ("main", "m-main")
    assert (st["fallback_provider"], st["fallback_model"]) == ("schema", "m-schema")
    assert "Prompt(tool_mode=schema)" in p.trace.decode()


def test_manifest_warnings_are_in_the_spawn_trace(tmp_path, scripted_server):
    p = run(tmp_path, scripted_server.url, lambda k: spawn_wait(k, "x"),
            warnings=["sla is set but rnixfs does not act on it: it has no effect"])
    trace = p.trace.decode().splitlines()
    assert trace[0].split("] ", 1)[1].startswith("Spawn(")
    assert 'Warning("sla is set but rnixfs does not act on it: it has no effect") = 0' in trace[1]
    assert p.status()["warnings"] == ["sla is set but rnixfs does not act on it: it has no effect"]


# -- limits.yaml -------------------------------------------------------------------------------


def test_limits_yaml_overrides_defaults(tmp_path):
    assert load_limits(tmp_path) == DEFAULT
    (tmp_path / "limits.yaml").write_text(
        "max_steps: 7\nmax_time: 10m\nstep_timeout: 0\nmax_tokens: 5000\nmax_cost: 0.5\n"
        "context_budget: 0\nmax_tool_calls: 4\nmax_children: 2\nmax_descendants: 9\n")
    got = load_limits(tmp_path)
    assert got == Limits(max_steps=7, max_time=600.0, step_timeout=None, max_tokens=5000, max_cost=0.5,
                         context_budget=None, max_tool_calls=4, max_children=2, max_descendants=9)


def test_limits_yaml_that_is_not_a_small_utf8_file_is_refused(tmp_path):
    """A FIFO planted as limits.yaml must not hang the mount; big or binary
    files are refused with one line naming the file."""
    import os

    path = tmp_path / "limits.yaml"
    os.mkfifo(path)
    with pytest.raises(LimitsError, match="limits.yaml: cannot read"):
        load_limits(tmp_path)
    path.unlink()
    path.write_bytes(b"max_steps: 1\n" + b"#" * (64 << 10))
    with pytest.raises(LimitsError, match="larger than 65536 bytes"):
        load_limits(tmp_path)
    path.write_bytes(b"max_steps: \xff\n")
    with pytest.raises(LimitsError, match="not UTF-8"):
        load_limits(tmp_path)


@pytest.mark.parametrize("text,words", [
    ("max_step: 3\n", "unknown key 'max_step'"),
    ("max_steps: -1\n", "max_steps must be a non-negative number"),
    ("max_steps: true\n", "max_steps must be a non-negative number"),
    ("max_steps: 1.5\n", "max_steps must be a non-negative number"),
    ("max_children: 0\n", "max_children must be at least 1"),
    ("max_tool_calls: null\n", "max_tool_calls must be a non-negative number"),
    ("max_time: soon\n", "max_time must be a duration"),
    ("[1, 2]\n", "top level must be a mapping"),
    ("a: [\n", "invalid YAML"),
])
def test_bad_limits_yaml_is_one_readable_line(text, words):
    with pytest.raises(LimitsError) as exc:
        parse_limits(text)
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_a_child_cannot_raise_its_budget_above_its_parents(tmp_path, scripted_server):
    """Hostile: an agent asks proc/new (here: the same kernel call) for a
    huge budget, or for none; it gets at most what its parent has left."""
    async def body(k):
        parent = await k.spawn(parse(json.dumps(
            {"intent": "[[delay:30]] parent", "max_tokens": 500, "max_cost": 0.01, "max_time": "20s"}).encode()))
        while parent.state.value != "running":
            await trio.sleep(0.01)
        greedy = await k.spawn(parse(json.dumps(
            {"intent": "[[delay:30]] greedy", "max_tokens": 100_000_000, "max_cost": 1000,
             "max_time": 0}).encode()), ppid=parent.pid)
        budgets = greedy.status()["budget"]
        k.get(parent.pid).cancel_scope.cancel()
        greedy.cancel_scope.cancel()
        return budgets

    budgets = run(tmp_path, scripted_server.url, body)
    assert budgets["max_tokens"] == 500 and budgets["max_cost"] == 0.01
    assert 0 < budgets["max_time"] <= 20


def test_request_takes_max_time_and_context_budget():
    from rnixfs.kernel.errors import SyscallError

    r = parse(b'{"intent": "x", "max_time": "90s", "context_budget": 2000}')
    assert (r.max_time, r.context_budget) == (90.0, 2000)
    assert parse(b'{"intent": "x", "max_time": 0}').max_time == 0.0  # off
    for bad, words in (('"max_time": "soon"', "max_time must be a duration"),
                       ('"context_budget": 0', "context_budget must be a whole number"),
                       ('"context_budget": "big"', "context_budget must be a whole number")):
        with pytest.raises(SyscallError) as exc:
            parse(('{"intent": "x", %s}' % bad).encode())
        assert exc.value.code.value == "INVALID" and words in exc.value.cause


def test_the_catalog_plan_carries_the_manifest_fields(tmp_path):
    from rnixfs.catalog import Catalog

    project, cfg = tmp_path / "p", tmp_path / "cfg"
    d = project / ".rnix" / "agents" / "full"
    d.mkdir(parents=True)
    (d / "agent.yaml").write_text(
        "name: full\nmodels: {provider: main, preferred: big, fallback: small, reasoning_effort: low}\n"
        "planning: true\nctx_size: 12\nmax_time: 2m\nmax_steps: 0\nsla: {p99: 1s}\n")
    (d / "instructions.md").write_text("Be brief.\n")
    catalog = Catalog(project, cfg)
    models = {"main": "m-main", "other": "m-other"}
    plan = catalog.plan(parse(b'{"intent": "x", "agent": "full"}'), default_provider="main",
                        driver_models=models, cwd=project)
    assert plan.planning is True and plan.reasoning_effort == "low"
    assert plan.budget["ctx_size"] == 12 and plan.budget["max_time"] == 120.0
    assert plan.budget["max_steps"] is None  # 0 = the daemon's default
    assert plan.warnings == ["sla is set but rnixfs does not act on it: it has no effect"]
    moved = catalog.plan(parse(b'{"intent": "x", "agent": "full", "provider": "other"}'),
                         default_provider="main", driver_models=models, cwd=project)
    assert moved.warnings[1:] == ["models.preferred is not used: the request chose provider other",
                                  "models.fallback is not used: the request chose provider other"]
    default = catalog.plan(parse(b"x"), default_provider="main", driver_models=models, cwd=project)
    assert default.planning is False and default.warnings == [] and default.reasoning_effort == ""
