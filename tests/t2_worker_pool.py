"""The worker pool against hostile and broken workers (docs/architecture.md,
"Workers and the kernel protocol"): a worker of another protocol version is
refused with the reason, one that sends garbage is dropped and its process
ends with exit 15, and workers that cannot start make spawns fail with the
reason instead of waiting forever. The daemon side never crashes."""
from __future__ import annotations

import json
import sys
import textwrap

import pytest
import trio

from rnixfs.kernel.errors import SyscallError
from rnixfs.kernel.loop import ProcessExit
from rnixfs.kernel.process import EXIT_WORKER_LOST, Process
from rnixfs.worker import pool as pool_mod
from rnixfs.worker.pool import WorkerPool
from rnixfs.worker.protocol import Configure

CONFIGURE = Configure(project="/nonexistent", mount="", config_dir="/nonexistent", state_dir="/nonexistent",
                      env={}, limits={}, hidden=[])

# A fake worker: speaks the framing by hand, then misbehaves as told.
FAKE = textwrap.dedent('''
    import json, os, socket, struct, sys
    fd = int(sys.argv[sys.argv.index("--fd") + 1])
    s = socket.socket(fileno=fd)
    def send(obj):
        data = json.dumps(obj).encode()
        s.sendall(struct.pack(">I", len(data)) + data)
    def recv():
        head = s.recv(4, socket.MSG_WAITALL)
        if len(head) < 4:
            return None
        (n,) = struct.unpack(">I", head)
        return json.loads(s.recv(n, socket.MSG_WAITALL))
    MODE = sys.argv[1]
    version = 999 if MODE == "old" else %(version)d
    send({"kind": "hello", "version": version, "role": "worker", "pid": os.getpid()})
    got = []
    while True:
        msg = recv()
        if msg is None:
            break
        got.append(msg)
        if msg["kind"] == "configure":
            send({"kind": "ready", "providers": []})
        if msg["kind"] == "start" and MODE == "garbage":
            data = b"this is not json"
            s.sendall(struct.pack(">I", len(data)) + data)
    tmp = sys.argv[2] + f".{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(got, f)
    try:
        os.link(tmp, sys.argv[2])  # atomic, and only the first fake's story counts
    except FileExistsError:
        pass
''')


def fake(tmp_path, mode: str) -> tuple[list[str], object]:
    from rnixfs.worker.protocol import VERSION
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE % {"version": VERSION})
    out = tmp_path / f"{mode}.json"
    return [sys.executable, str(script), mode, str(out)], out


def run_pool(command, body, *, size=1):
    async def main():
        pool = WorkerPool(size, CONFIGURE, command=command)
        async with trio.open_nursery() as n:
            await n.start(pool.run_service)
            try:
                with trio.fail_after(60):
                    return await body(pool)
            finally:
                await pool.aclose()
                n.cancel_scope.cancel()
    return trio.run(main)


@pytest.mark.expect_log(r"worker 0 failed: ProtocolError: protocol version 999 is not supported")
def test_a_worker_of_another_version_is_refused_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(pool_mod, "RESTART_PAUSE", 0.05)
    command, out = fake(tmp_path, "old")

    async def body(pool):
        while not out.exists() or pool.lost < 1:  # the refused worker is counted after it is reaped
            await trio.sleep(0.05)
        return pool

    pool = run_pool(command, body)
    got = json.loads(out.read_text())
    assert [m["kind"] for m in got] == ["hello", "refuse"]
    assert "protocol version 999 is not supported" in got[1]["reason"]
    assert "run the same rnixfs on both sides" in got[1]["reason"]
    assert pool.lost >= 1


@pytest.mark.expect_log(r"worker pid \d+ lost \(it broke the protocol: frame is not JSON",
                        r"worker 0 failed")
def test_a_worker_that_sends_garbage_loses_its_process_with_exit_15(tmp_path, monkeypatch):
    monkeypatch.setattr(pool_mod, "RESTART_PAUSE", 0.05)
    command, out = fake(tmp_path, "garbage")

    async def body(pool):
        proc = Process(pid=7, intent="x")
        with pytest.raises(ProcessExit) as exc:
            await pool.run(None, proc)
        return exc.value

    exit_ = run_pool(command, body)
    assert exit_.code == EXIT_WORKER_LOST
    assert "was lost: it broke the protocol: frame is not JSON" in exit_.error.cause
    got = json.loads(out.read_text())
    assert [m["kind"] for m in got[:3]] == ["hello", "configure", "start"]


@pytest.mark.expect_log(r"worker 0 failed: PeerGone: worker \d+ closed before its hello")
def test_workers_that_cannot_start_fail_spawns_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(pool_mod, "RESTART_PAUSE", 0.05)
    command = [sys.executable, "-c", "import sys; sys.exit(3)"]

    async def body(pool):
        with pytest.raises(SyscallError) as exc:
            await pool.run(None, Process(pid=8, intent="x"))
        return exc.value

    err = run_pool(command, body)
    assert "no worker process could start (3 failed in a row" in err.cause
    assert "closed before its hello" in err.cause


def test_a_command_not_yet_registered_belongs_to_the_one_process_with_a_shell_open():
    """owner_of: the /dev/shell fd a worker reported before it started a
    command names the parent of a proc/new write that beats the command's
    own registration; two candidates name none."""
    from types import SimpleNamespace

    from rnixfs.worker.pool import RemoteRun, Worker

    pool = WorkerPool(1, CONFIGURE)
    w = Worker(0, SimpleNamespace(pid=4242), channel=None)
    pool.workers.append(w)
    a, b = Process(pid=1, intent="a"), Process(pid=2, intent="b")
    w.runs = {1: RemoteRun(a, w), 2: RemoteRun(b, w)}
    assert pool.owner_of(4242) is None  # nobody runs a command
    a.fds = {3: "/dev/llm/x", 4: "/dev/shell"}
    assert pool.owner_of(4242) == 1
    assert pool.owner_of(4243) is None  # not a worker
    b.fds = {3: "/dev/shell"}
    assert pool.owner_of(4242) is None  # ambiguous: no guess
