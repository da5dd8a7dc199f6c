"""Tier 1: kernel logic without a mount — real SQLite store, real HTTP to
the scripted server through the real OpenAI driver."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from rnixfs.kernel.errors import Code, SyscallError
from rnixfs.kernel.process import State
from rnixfs.kernel.request import SpawnRequest, parse
from rnixfs.store import StoreReader
from tests.kernelutil import registry, run_with_kernel
from tests.mountutil import scripted_providers


def providers(url: str, log_dir: Path):
    return registry(scripted_providers(url), log_dir)


def run_kernel(tmp_path: Path, url: str, body, *, linger: float = 600.0, daemon_id: str = "d1"):
    """Run ``body(kernel)`` inside a live kernel with a real store."""
    return run_with_kernel(tmp_path, lambda: providers(url, tmp_path), body, daemon_id=daemon_id,
                           linger=linger)


async def spawn_wait(kernel, text: str, **opts):
    req = parse(json.dumps({"intent": text, **opts}).encode())
    proc = await kernel.spawn(req)
    await proc.exited_event.wait()
    return proc


def test_answer_tokens_and_trace(tmp_path, scripted_server):
    async def body(k):
        return await spawn_wait(k, "What is the capital of France?")

    p = run_kernel(tmp_path, scripted_server.url, body)
    assert p.exit_code == 0 and p.state == State.DEAD  # shutdown retired the zombie
    assert p.result == "echo: What is the capital of France?"
    assert p.tokens_out == 7 and p.tokens_in > 7  # the server's usage, not turns
    trace = p.trace.decode()
    for syscall in ("Spawn(", "Open(\"/dev/llm/scripted\"", "Write(FD(3)", "Read(FD(3))", "Close(FD(3))", "Exit(0)"):
        assert syscall in trace, trace
    assert all(line.startswith("[") and "s] " in line for line in trace.splitlines())
    reader = StoreReader(tmp_path / "rnixfs.db")
    assert reader.trace(p.pid) == trace.splitlines(keepends=True)
    assert reader.process(p.pid)["result"] == p.result
    assert [json.loads(e)["syscall"] for e in reader.events(p.pid)][0] == "Spawn"


def test_pids_monotonic_across_restart(tmp_path, scripted_server):
    async def three(k):
        return [(await spawn_wait(k, f"n{i}")).pid for i in range(3)]

    first = run_kernel(tmp_path, scripted_server.url, three, daemon_id="a")
    second = run_kernel(tmp_path, scripted_server.url, three, daemon_id="b")
    assert first == sorted(first) and len(set(first)) == 3
    assert min(second) > max(first)
    reader = StoreReader(tmp_path / "rnixfs.db")
    assert {p["pid"] for p in reader.processes()} == set(first + second)
    assert reader.process(first[0])["state"] == "dead"


def test_uuid_is_v7(tmp_path, scripted_server):
    async def body(k):
        return await spawn_wait(k, "hi")

    p = run_kernel(tmp_path, scripted_server.url, body)
    assert p.uuid[14] == "7"


@pytest.mark.expect_log('stamina.retry_scheduled')
def test_budgets_and_errors(tmp_path, scripted_server):
    async def body(k):
        tokens = await spawn_wait(k, "[[tokens:50]] go", max_tokens=20)
        timeout = await spawn_wait(k, "[[delay:5]] slow", step_timeout="300ms")
        driver = await spawn_wait(k, "[[fault:500]] broken")
        return tokens, timeout, driver

    tokens, timeout, driver = run_kernel(tmp_path, scripted_server.url, body)
    assert tokens.exit_code == 11 and "max_tokens" in tokens.error["cause"]
    assert timeout.exit_code == 124 and timeout.error["code"] == "TIMEOUT"
    assert driver.exit_code == 1 and driver.error["code"] == "DRIVER"
    assert "-1 [DRIVER]" in driver.trace.decode()


async def in_first_step(proc):
    while proc.steps < 1:
        await trio.sleep(0.01)


def test_max_steps_after_steering(tmp_path, scripted_server):
    async def body(k):
        proc = await k.spawn(parse(b'{"intent": "[[chunk-delay:0.2]] [[tokens:5]] a", "max_steps": 1}'))
        await in_first_step(proc)
        await k.steer(proc.pid, "also b")
        await proc.exited_event.wait()
        return proc

    p = run_kernel(tmp_path, scripted_server.url, body)
    assert p.exit_code == 10 and p.steps == 1 and "max_steps" in p.error["cause"]


def test_steering_reaches_the_model(tmp_path, scripted_server):
    async def body(k):
        proc = await k.spawn(parse(b"[[chunk-delay:0.1]] [[tokens:5]] start"))
        await in_first_step(proc)
        await k.steer(proc.pid, "focus on tests")
        await proc.exited_event.wait()
        return proc

    p = run_kernel(tmp_path, scripted_server.url, body)
    assert p.exit_code == 0 and p.steps == 2
    assert p.result == "echo: focus on tests"
    assert "Steer(" in p.trace.decode()


def test_signals(tmp_path, scripted_server):
    async def body(k):
        slow = "[[chunk-delay:0.3]] [[tokens:20]] slow"
        killed = await k.spawn(parse(slow.encode()))
        termed = await k.spawn(parse(slow.encode()))
        paused = await k.spawn(parse(b"[[chunk-delay:0.2]] [[tokens:3]] p"))
        await trio.sleep(0.3)
        await k.signal(killed.pid, "kill")
        await k.signal(termed.pid, "term")
        await k.signal(paused.pid, "pause")
        await k.steer(paused.pid, "more")  # forces a second step, which must wait
        with pytest.raises(SyscallError) as bad:
            await k.signal(paused.pid, "bogus")
        assert bad.value.code == Code.INVALID
        with pytest.raises(SyscallError) as busy:
            await k.signal(paused.pid, "reap")
        assert busy.value.code == Code.BUSY
        await killed.exited_event.wait()
        await termed.exited_event.wait()
        with trio.move_on_after(1.5):
            await paused.exited_event.wait()
        still_paused = paused.alive and paused.paused
        await k.signal(paused.pid, "resume")
        await paused.exited_event.wait()
        with pytest.raises(SyscallError) as gone:
            await k.signal(killed.pid, "term")
        assert gone.value.code == Code.NO_PROCESS
        await k.signal(killed.pid, "reap")
        with pytest.raises(SyscallError) as reaped:
            k.get(killed.pid)
        assert reaped.value.code == Code.NOT_FOUND
        return killed, termed, paused, still_paused

    killed, termed, paused, still_paused = run_kernel(tmp_path, scripted_server.url, body)
    assert killed.exit_code == 137 and killed.result is None
    assert "-1 [INTERRUPTED]" in killed.trace.decode()
    assert termed.exit_code == 143 and termed.result  # finished its step first
    assert still_paused and paused.exit_code == 0 and paused.steps == 2


def test_linger_reaps_zombies_and_orphans_reparent(tmp_path, scripted_server):
    async def body(k):
        parent = await k.spawn(parse(b"parent"))
        child = await k.spawn(parse(b"[[delay:0.5]] child"), ppid=parent.pid)
        assert child.ppid == parent.pid and child.pid in parent.children
        await parent.exited_event.wait()
        ppid_after = child.ppid
        await child.exited_event.wait()
        with trio.move_on_after(30):  # linger is 0.05 s: poll, the machine may be busy
            while parent.pid in k.table or child.pid in k.table:
                await trio.sleep(0.02)
        return ppid_after, parent.pid in k.table, child.pid in k.table, parent.state

    ppid_after, parent_live, child_live, parent_state = run_kernel(
        tmp_path, scripted_server.url, body, linger=0.05)
    assert ppid_after == 0
    assert not parent_live and not child_live and parent_state == State.DEAD


def test_spawn_validation_spawns_nothing(tmp_path, scripted_server):
    async def body(k):
        codes = []
        for req in (SpawnRequest("x", agent="nope"), SpawnRequest("x", provider="nope"),
                    SpawnRequest("x", skills=["nope"]), SpawnRequest("x", cwd="../.."),
                    SpawnRequest("x", cwd="missing")):
            with pytest.raises(SyscallError) as exc:
                await k.spawn(req)
            codes.append(exc.value.code)
        return codes, len(k.table)

    codes, count = run_kernel(tmp_path, scripted_server.url, body)
    assert codes == [Code.NOT_FOUND, Code.NOT_FOUND, Code.NOT_FOUND, Code.PERMISSION, Code.NOT_FOUND]
    assert count == 0


def test_transitions_only_forward(tmp_path, scripted_server):
    async def body(k):
        return await spawn_wait(k, "x")

    p = run_kernel(tmp_path, scripted_server.url, body)
    with pytest.raises(ValueError):
        p.move_to(State.RUNNING)


def test_syscall_error_format():
    e = SyscallError(Code.TIMEOUT, "deadline exceeded", syscall="Spawn", pid=1, device="/dev/llm/local")
    assert str(e) == "[TIMEOUT] PID 1 Spawn: /dev/llm/local (deadline exceeded)"
    assert e.errno == 110


def test_spawns_and_signals_are_audited(tmp_path, scripted_server):
    import sqlite3

    async def body(k):
        p = await k.spawn(parse(b"[[delay:5]] x"))
        await k.signal(p.pid, "kill")
        await p.exited_event.wait()
        return p.pid

    pid = run_kernel(tmp_path, scripted_server.url, body)
    rows = sqlite3.connect(tmp_path / "rnixfs.db").execute("SELECT action, detail FROM audit").fetchall()
    assert ("spawn", json.dumps({"pid": pid, "ppid": 0, "agent": "default", "provider": "scripted"})) in rows
    assert ("signal", json.dumps({"pid": pid, "command": "kill"})) in rows
