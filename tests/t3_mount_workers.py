"""Tier 3: agent loops run in worker processes, off the daemon's FUSE loop
(docs/architecture.md, "Workers and the kernel protocol"): a worker killed
with SIGKILL ends only its processes (exit 15), a replacement starts and
the mount stays up; workers die with the daemon and are reaped on umount;
``workers: 0`` runs the loops in the daemon."""
from __future__ import annotations

import json
import os
import signal
import uuid

import psutil
import pytest

from tests.mountutil import cleanup, needs_fuse, scripted_providers, sh, wait_for

pytestmark = [needs_fuse, pytest.mark.mount]


def call(name, args, cid):
    return {"id": cid, "function": {"name": name, "arguments": json.dumps(args)}}


def workers_of(m) -> list[int]:
    """Worker processes: the daemon's children running ``-m rnixfs.worker``."""
    try:
        kids = psutil.Process(m.daemon_pid).children()
    except psutil.NoSuchProcess:
        return []
    out = []
    for k in kids:
        try:
            if "rnixfs.worker" in k.cmdline() and k.status() != psutil.STATUS_ZOMBIE:
                out.append(k.pid)
        except psutil.Error:
            pass
    return sorted(out)


def daemon_info(m) -> dict:
    return json.loads(os.getxattr(m.path, "user.rnixfs.daemon"))


def mount_with(tmp_path, mount_factory, server, limits: str):
    config = tmp_path / "config"
    config.mkdir(exist_ok=True)
    (config / "limits.yaml").write_text(limits)
    return mount_factory(scripted_providers(server.url, timeout=900))


def tagged(tag: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["environ"]):
        try:
            if (p.info["environ"] or {}).get("RNIXFS_TAG") == tag:
                out.append(p)
        except psutil.Error:
            pass
    return out


def ancestors(p: psutil.Process) -> list[int]:
    out = []
    try:
        while p.ppid() > 1:
            p = psutil.Process(p.ppid())
            out.append(p.pid)
    except psutil.Error:
        pass
    return out


def test_agent_commands_run_under_a_worker_not_the_daemon(tmp_path, mount_factory, scripted_server):
    m = mount_with(tmp_path, mount_factory, scripted_server, "workers: 2\n")
    workers = wait_for(lambda: len(workers_of(m)) == 2 and workers_of(m), 60, what="two workers")
    wait_for(lambda: daemon_info(m)["workers"]["ready"] == 2, 60, what="two ready workers")
    info = daemon_info(m)["workers"]
    assert sorted(info["pids"]) == workers and info["workers"] == 2
    from tests.mountutil import rnixfs
    shown = rnixfs("status", str(m.path)).stdout
    assert f"workers:   2 of 2 ready (pids {' '.join(map(str, info['pids']))})" in shown, shown

    tag = f"rnixfs-w-{uuid.uuid4().hex[:8]}"
    mark = "UNDER-A-WORKER"
    scripted_server.enqueue({"match": mark, "tool_calls": [
        call("Bash", {"command": f"RNIXFS_TAG={tag} sleep 600", "timeout": 900}, "b")]})
    pid = m.spawn(mark)
    sleeper = wait_for(lambda: tagged(tag), 60, what="the command to start")[0]
    chain = ancestors(sleeper)
    assert set(chain) & set(workers), (chain, workers)  # the loop runs in a worker
    # the mount shows what the worker does: the shell's fd, the Bash line in the trace
    assert "/dev/shell" in m.status(pid)["fds"].values()
    wait_for(lambda: "Write(FD(" in open(m.p(f"proc/{pid}/trace")).read(), 30, what="the trace")
    # kill crosses to the worker and ends the command tree, as without workers
    assert sh(f'echo kill > "{m.p(f"proc/{pid}/ctl")}"').returncode == 0
    assert m.wait(pid).startswith("exited(137)")
    wait_for(lambda: not tagged(tag), 30, what="the command to die")
    trace = open(m.p(f"proc/{pid}/trace")).read()
    assert "-1 [INTERRUPTED]" in trace, trace


@pytest.mark.expect_log(r"rnixfs.worker.pool: worker pid \d+ lost \(it died of signal 9\): 1 processes end")
def test_a_worker_killed_with_sigkill_ends_only_its_processes(tmp_path, mount_factory, scripted_server):
    m = mount_with(tmp_path, mount_factory, scripted_server, "workers: 1\n")
    [worker] = wait_for(lambda: workers_of(m), 60, what="the worker")
    mark = "SLOW-REPLY"
    scripted_server.enqueue({"match": mark, "content": "late", "delay": 600})
    pid = m.spawn(mark)
    wait_for(lambda: m.status(pid)["fds"] and len(scripted_server.requests) >= 1, 60,
             what="the model request to be in flight")

    os.kill(worker, signal.SIGKILL)
    line = m.wait(pid, timeout=120)
    assert line.startswith("exited(15) "), line
    st = m.status(pid)
    assert st["state"] == "zombie" and st["exit_code"] == 15
    assert f"worker process {worker} was lost" in st["error"]["cause"]
    assert "died of signal 9" in st["error"]["cause"]
    assert "Exit(15)" in open(m.p(f"proc/{pid}/trace")).read()
    assert m.daemon_alive()

    # a replacement serves the next process
    [new] = wait_for(lambda: [w for w in workers_of(m) if w != worker], 60, what="a replacement worker")
    assert daemon_info(m)["workers"]["lost"] == 1
    scripted_server.enqueue({"match": "AFTER-THE-LOSS", "content": "fine"})
    after = m.spawn("AFTER-THE-LOSS")
    assert m.wait(after).startswith("exited(0)")
    assert open(m.p(f"proc/{after}/result")).read().strip() == "fine"
    assert f"worker pid {worker} lost" in m.log()
    assert new in workers_of(m)


@pytest.mark.expect_log(r"rnixfs.worker\[worker \d+\]: the daemon \(pid \d+\) is gone")
def test_workers_die_with_the_daemon_and_are_reaped_on_umount(tmp_path, mount_factory, scripted_server):
    m = mount_with(tmp_path, mount_factory, scripted_server, "workers: 2\n")
    workers = wait_for(lambda: len(workers_of(m)) == 2 and workers_of(m), 60, what="two workers")
    cleanup(m)  # umount
    wait_for(lambda: not any(psutil.pid_exists(w) for w in workers), 30, what="the workers to be reaped")

    m2 = mount_with(tmp_path, mount_factory, scripted_server, "workers: 1\n")
    workers = wait_for(lambda: workers_of(m2), 60, what="the worker")
    os.kill(m2.daemon_pid, signal.SIGKILL)  # no umount, no goodbye: the workers still go
    wait_for(lambda: not any(psutil.pid_exists(w) and psutil.Process(w).status() != psutil.STATUS_ZOMBIE
                             for w in workers), 30, what="the workers to die with the daemon")


def test_workers_0_runs_loops_in_the_daemon(tmp_path, mount_factory, scripted_server):
    m = mount_with(tmp_path, mount_factory, scripted_server, "workers: 0\n")
    assert daemon_info(m)["workers"] == {"workers": 0}
    from tests.mountutil import rnixfs
    assert "workers:   none, agent loops run in the daemon" in rnixfs("status", str(m.path)).stdout
    tag = f"rnixfs-w0-{uuid.uuid4().hex[:8]}"
    scripted_server.enqueue({"match": "INLINE", "tool_calls": [
        call("Bash", {"command": f"RNIXFS_TAG={tag} sleep 600", "timeout": 900}, "b")]})
    pid = m.spawn("INLINE")
    sleeper = wait_for(lambda: tagged(tag), 60, what="the command to start")[0]
    assert m.daemon_pid in ancestors(sleeper) and workers_of(m) == []
    assert sh(f'echo kill > "{m.p(f"proc/{pid}/ctl")}"').returncode == 0
    assert m.wait(pid).startswith("exited(137)")


@pytest.mark.parametrize("text, why", [
    ("workers: -1\n", "workers must be a whole number from 0 to 256"),
    ("workers: two\n", "workers must be a whole number"),
    ("workers: true\n", "workers must be a whole number"),
    ("workers: 100000\n", "from 0 to 256"),
])
def test_a_bad_workers_value_refuses_the_mount_with_a_reason(tmp_path, text, why):
    from rnixfs.limits import LimitsError, parse_limits

    with pytest.raises(LimitsError, match=why):
        parse_limits(text)
    assert parse_limits("workers: 3\n").worker_count() == 3
    assert parse_limits("workers: 0\n").worker_count() == 0
    assert parse_limits("").worker_count() == (os.cpu_count() or 1)


def test_idle_workers_stay(tmp_path, mount_factory, scripted_server):
    """trio starts processes from threads it retires after 10 s idle: a
    worker must not die with that thread (no PR_SET_PDEATHSIG)."""
    import time

    m = mount_with(tmp_path, mount_factory, scripted_server, "workers: 2\n")
    workers = wait_for(lambda: len(workers_of(m)) == 2 and workers_of(m), 60, what="two workers")
    time.sleep(15)
    assert workers_of(m) == workers
    assert daemon_info(m)["workers"]["lost"] == 0
    scripted_server.enqueue({"match": "STILL-HERE", "content": "yes"})
    assert m.wait(m.spawn("STILL-HERE")).startswith("exited(0)")


def test_max_time_ends_a_loop_in_a_worker_with_exit_14(tmp_path, mount_factory, scripted_server):
    m = mount_with(tmp_path, mount_factory, scripted_server, "workers: 1\n")
    scripted_server.enqueue({"match": "OUT-OF-TIME", "content": "late", "delay": 600})
    pid = m.spawn(json.dumps({"intent": "OUT-OF-TIME", "max_time": "2s"}))
    line = m.wait(pid, timeout=120)
    assert line.startswith("exited(14) "), line
    st = m.status(pid)
    assert "max_time exceeded" in st["error"]["cause"]
    trace = open(m.p(f"proc/{pid}/trace")).read()
    # the worker's last lines (the cut model request, the close) come before the exit
    assert trace.index("Read(FD(3)) = -1 [INTERRUPTED]") < trace.index("Exit(14)"), trace
    assert st["fds"] == {}


def test_spend_reaches_the_kernel_with_and_without_limits(tmp_path, mount_factory, scripted_server):
    """Without a limit on its chain a loop charges without waiting for the
    kernel's answer; the kernel's record counts the spend all the same. With
    one, the answer still stops the loop (docs/architecture.md, "What a model
    request costs")."""
    m = mount_with(tmp_path, mount_factory, scripted_server, "workers: 1\n")
    for _ in range(2):
        scripted_server.enqueue({"match": "FREE-SPEND", "tool_calls": [call("Read", {"path": "nope"}, "r")],
                                 "usage": {"prompt_tokens": 100, "completion_tokens": 10}})
    scripted_server.enqueue({"match": "FREE-SPEND", "content": "done",
                             "usage": {"prompt_tokens": 100, "completion_tokens": 10}})
    pid = m.spawn("FREE-SPEND")
    assert m.wait(pid, timeout=120).startswith("exited(0)")
    st = m.status(pid)
    assert st["steps"] == 3 and st["tokens"] == {"in": 300, "out": 30}
    assert st["tree"]["tokens"] == 330, st["tree"]

    for _ in range(3):
        scripted_server.enqueue({"match": "CAPPED-SPEND", "tool_calls": [call("Read", {"path": "nope"}, "r")],
                                 "usage": {"prompt_tokens": 100, "completion_tokens": 10}})
    pid = m.spawn(json.dumps({"intent": "CAPPED-SPEND", "max_tokens": 150}))
    line = m.wait(pid, timeout=120)
    assert line.startswith("exited(11)"), line  # over max_tokens after the second step
    st = m.status(pid)
    assert st["steps"] == 2 and st["tree"]["tokens"] == 220, st
