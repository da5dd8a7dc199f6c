"""The kernel protocol (docs/architecture.md, "Workers and the kernel
protocol"): every message survives a round trip; bad frames and a peer of
another version are refused with a readable reason, never a crash."""
from __future__ import annotations

import dataclasses
import json
import socket

import pytest
import trio

from rnixfs.kernel.process import Account, Budget, Process
from rnixfs.worker import protocol, spec
from rnixfs.worker import channel as channel_mod
from rnixfs.worker.channel import Channel
from rnixfs.worker.protocol import ProtocolError

SAMPLES = [
    protocol.Hello(version=protocol.VERSION, role="worker", pid=42),
    protocol.Refuse(reason="nope"),
    protocol.Reply(req=3, value={"pid": 7, "list": [1, "ü"]}),
    protocol.Reply(req=4, error={"code": "NOT_FOUND", "cause": "x", "syscall": "", "pid": None, "device": ""}),
    protocol.Configure(project="/p", mount="/m", config_dir="/c", state_dir="/s", env={"A": "b"},
                       limits={"max_steps": 3}, hidden=["mnt"]),
    protocol.Start(pid=5, spec={"intent": "hi"}),
    protocol.Signal(pid=5, command="kill"),
    protocol.Steer(pid=5, text="also this ✓"),
    protocol.Ready(providers=["local", "scripted"]),
    protocol.Trace(pid=5, syscall="Read", args="FD(3)", result="12 bytes", t=1.5, dur_ms=3.0),
    protocol.Trace(pid=5, syscall="Open", args='"/w/a"', result="FD(3)", t=1.6, fields={"fds": {"3": "/w/a"}}),
    protocol.Status(pid=5, fields={"steps": 2}, checkpoint=True),
    protocol.AccountQuery(pid=5, req=9),
    protocol.Charge(pid=5, req=10, tokens=12, cost=0.5),
    protocol.Spawn(pid=5, req=11, intent="child", agent=None),
    protocol.IsChild(pid=5, req=12, child=6),
    protocol.Wait(pid=5, req=13, child=6),
    protocol.HostStarted(pid=5, req=14, host_pid=999),
    protocol.HostEnded(pid=5, host_pid=999),
    protocol.McpSpecs(pid=5, req=15, servers=["a"], inline={}),
    protocol.McpCall(pid=5, req=16, server="a", tool="t", args={"x": 1}, limit=100),
    protocol.Cancel(req=16),
    protocol.Exit(pid=5, code=0, result="done", fields={"steps": 3}),
]


def test_every_message_kind_has_a_sample():
    assert {m.kind for m in SAMPLES} == set(protocol.MESSAGES)


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: m.kind)
def test_round_trip(msg):
    frame = protocol.encode(msg)
    reader = protocol.FrameReader()
    # byte by byte: a frame split anywhere is reassembled
    bodies = [b for i in range(len(frame)) for b in reader.feed(frame[i:i + 1])]
    assert len(bodies) == 1 and reader.pending == 0
    assert protocol.decode(bodies[0]) == msg


def _frame(obj) -> bytes:
    return json.dumps(obj).encode()


@pytest.mark.parametrize("body, why", [
    (b"\xff\xfe", "not JSON"),
    (b"{\"kind\": \"trace\", ", "not JSON"),
    (b"[1, 2]", "not an object"),
    (_frame({"kind": "bogus"}), "unknown message type 'bogus'"),
    (_frame({"pid": 1}), "frame has no message kind"),
    (_frame({"kind": "signal", "pid": 1}), "signal: missing field 'command'"),
    (_frame({"kind": "signal", "pid": "1", "command": "kill"}), "signal: field 'pid' is str, want int"),
    (_frame({"kind": "signal", "pid": True, "command": "kill"}), "field 'pid' is bool"),
    (_frame({"kind": "signal", "pid": 1, "command": "kill", "x": 1}), "signal: unknown field 'x'"),
    (_frame({"kind": "trace", "pid": 1, "syscall": "R", "args": "", "result": "", "t": 0, "error": 3}),
     "field 'error' is int, want dict or null"),
    (b"[" * 100000, "not JSON"),
])
def test_garbled_frames_are_readable_errors(body, why):
    with pytest.raises(ProtocolError) as exc:
        protocol.decode(body)
    assert why in str(exc.value)


def test_an_oversized_frame_is_refused_before_its_body_is_read():
    reader = protocol.FrameReader(max_frame=1000)
    with pytest.raises(ProtocolError, match="frame of 1001 bytes announced; the cap is 1000"):
        reader.feed(protocol.HEADER.pack(1001) + b"x" * 10)
    big = protocol.Steer(pid=1, text="x" * (protocol.MAX_FRAME + 1))
    with pytest.raises(ProtocolError, match="the cap is"):
        protocol.encode(big)


def _pair():
    a, b = socket.socketpair()
    return (trio.SocketStream(trio.socket.from_stdlib_socket(a)),
            trio.SocketStream(trio.socket.from_stdlib_socket(b)))


def test_handshake_and_a_request_over_a_socketpair():
    async def main():
        ka, wa = _pair()
        kernel, worker = Channel(ka, name="kernel"), Channel(wa, name="worker")
        async with trio.open_nursery() as n:
            n.start_soon(kernel.writer)
            n.start_soon(worker.writer)
            hellos = {}

            async def shake(ch, role, peer):
                hellos[role] = await ch.handshake(role, peer, pid=1)

            async with trio.open_nursery() as n2:
                n2.start_soon(shake, kernel, "kernel", "worker")
                n2.start_soon(shake, worker, "worker", "kernel")
            assert hellos["kernel"].role == "worker" and hellos["worker"].role == "kernel"

            async def serve():
                msg = await kernel.receive()
                assert isinstance(msg, protocol.Charge)
                kernel.answer(msg.req, value=msg.tokens * 2)

            n.start_soon(serve)

            async def pump():  # the worker's reader hands the reply to ``request``
                while await worker.receive() is not None:
                    pass

            n.start_soon(pump)
            with trio.fail_after(10):
                got = await worker.request(lambda req: protocol.Charge(pid=1, req=req, tokens=21, cost=0.0))
            assert got.value == 42 and got.error is None
            await kernel.aclose()
            await worker.aclose()
            n.cancel_scope.cancel()

    trio.run(main)


def test_a_peer_of_another_version_is_refused_with_a_reason():
    async def main():
        ka, wa = _pair()
        kernel = Channel(ka, name="kernel")
        raw = wa
        async with trio.open_nursery() as n:
            n.start_soon(kernel.writer)
            old = protocol.encode(protocol.Hello(version=protocol.VERSION + 1, role="worker"))
            await raw.send_all(old)
            with pytest.raises(ProtocolError, match=r"protocol version \d+ is not supported"):
                await kernel.handshake("kernel", "worker")
            # the peer is told why before the kernel closes
            reader, got = protocol.FrameReader(), []
            with trio.fail_after(10):
                while not any(m.kind == "refuse" for m in got):
                    got += [protocol.decode(b) for b in reader.feed(await raw.receive_some(65536))]
            refuse = [m for m in got if m.kind == "refuse"][0]
            assert "run the same rnixfs on both sides" in refuse.reason
            await kernel.aclose()
            await raw.aclose()
            n.cancel_scope.cancel()

    trio.run(main)


def test_garbage_on_the_socket_is_a_protocol_error_not_a_crash():
    async def main():
        ka, wa = _pair()
        kernel = Channel(ka, name="kernel")
        await wa.send_all(protocol.HEADER.pack(5) + b"hello")
        with pytest.raises(ProtocolError, match="not JSON"):
            await kernel.receive()
        await wa.send_all(protocol.HEADER.pack(10) + b"{}")  # then EOF mid-frame
        await wa.aclose()
        with pytest.raises(ProtocolError, match="closed mid-frame"):
            await kernel.receive()
        await kernel.aclose()

    trio.run(main)


def test_a_process_travels_to_its_worker_and_its_changes_come_back():
    parent = Account(1, max_tokens=100, tokens=40)
    parent.deadline = __import__("time").monotonic() + 30
    proc = Process(pid=2, intent="do it", allowed_tools=["Read"], budget=Budget(max_steps=4),
                   account=Account(2, max_tokens=80, parent=parent), env={"K": "v"})
    wire = json.loads(json.dumps(spec.to_spec(proc)))
    copy = spec.from_spec(2, wire)
    assert (copy.intent, copy.allowed_tools, copy.budget, copy.env) == \
        ("do it", ["Read"], Budget(max_steps=4), {"K": "v"})
    assert copy.account.remaining_tokens() == 60  # the parent's budget binds the copy
    assert 25 < copy.account.parent.deadline - __import__("time").monotonic() <= 30

    diff = spec.StatusDiff(copy)
    copy.steps, copy.fds[3] = 1, "/dev/llm/x"
    copy.messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    first = json.loads(json.dumps(diff.changed()))
    assert first["steps"] == 1 and first["fds"] == {"3": "/dev/llm/x"} and first["messages_at"] == 0
    spec.apply_fields(proc, first)
    assert proc.fds == {3: "/dev/llm/x"} and proc.messages == copy.messages
    copy.messages.append({"role": "assistant", "content": "A"})
    second = diff.changed()
    assert second == {"messages_at": 2, "messages": [{"role": "assistant", "content": "A"}]}
    copy.messages[1]["content"] = "[compacted]"  # an in-place change is seen too
    third = diff.changed()
    assert third["messages_at"] == 1
    spec.apply_fields(proc, second)
    spec.apply_fields(proc, third)
    assert proc.messages == copy.messages
    assert diff.changed() == {}
    spec.apply_fields(proc, {"bogus": 1, "fds": {"x": "y"}})  # ignored, no crash
    assert not hasattr(proc, "bogus") and proc.fds == {}
    # ill-typed values never reach the record the mount renders
    spec.apply_fields(proc, {"steps": "9", "cost": float("nan"), "tokens_in": -5, "fell_back": 1,
                             "allowed_tools": ["Read", 3], "result": 7, "tool_results": [True, 2]})
    assert (proc.steps, proc.cost, proc.tokens_in, proc.fell_back, proc.allowed_tools, proc.result) == \
        (1, 0.0, 0, False, ["Read"], None)
    assert proc.tool_results == {2}
    json.dumps(proc.status())


def test_a_byte_stream_cut_anywhere_gives_the_same_frames():
    frames = [protocol.encode(m) for m in SAMPLES]
    data = b"".join(frames)
    want = [f[protocol.HEADER.size:] for f in frames]
    for cut in (1, 3, 4, 5, 17, 64, len(data)):
        reader, got = protocol.FrameReader(), []
        for i in range(0, len(data), cut):
            got += reader.feed(data[i:i + cut])
        assert got == want and reader.pending == 0, cut
    assert [protocol.decode(b) for b in want] == SAMPLES


class _CountingStream(trio.abc.HalfCloseableStream):
    """A stream that counts its ``send_all`` calls."""

    def __init__(self, inner):
        self.inner, self.sends = inner, 0

    async def send_all(self, data):
        self.sends += 1
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self):
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self):
        await self.inner.send_eof()

    async def receive_some(self, max_bytes=None):
        return await self.inner.receive_some(max_bytes)

    async def aclose(self):
        await self.inner.aclose()


def test_messages_queued_together_go_out_in_order_in_few_sends():
    async def main():
        ka, wa = _pair()
        counting = _CountingStream(wa)
        kernel, worker = Channel(ka, name="kernel"), Channel(counting, name="worker")
        sent = [protocol.Trace(pid=1, syscall="Read", args=f"FD({i})", result="0", t=i / 10)
                for i in range(1000)]
        async with trio.open_nursery() as n:
            n.start_soon(worker.writer)
            for msg in sent:  # sync, as trace lines are queued between two awaits
                worker.send(msg)
            got = []
            with trio.fail_after(10):
                while len(got) < len(sent):
                    got.append(await kernel.receive())
            assert got == sent
            # one send per MAX_COALESCE frames, not one per frame
            assert counting.sends <= -(-len(sent) // channel_mod.MAX_COALESCE) + 1
            with trio.fail_after(10):
                await worker.flush()
            await worker.aclose()
            assert await kernel.receive() is None  # EOF after the last frame
            await kernel.aclose()
            n.cancel_scope.cancel()

    trio.run(main)


def test_the_sent_conversation_prefix_is_kept_across_reports():
    copy = Process(pid=3, intent="x")
    diff = spec.StatusDiff(copy)
    copy.messages = [{"role": "user", "content": str(i)} for i in range(3)]
    assert diff.changed()["messages_at"] == 0
    copy.messages.append({"role": "assistant", "content": "3"})
    assert diff.changed() == {"messages_at": 3, "messages": [{"role": "assistant", "content": "3"}]}
    del copy.messages[1:]  # compaction drops the middle
    copy.messages.append({"role": "user", "content": "again"})
    out = diff.changed()
    assert out == {"messages_at": 1, "messages": [{"role": "user", "content": "again"}]}
    assert diff.changed() == {}  # nothing new: nothing sent


def test_fields_changed_in_place_are_reported_once_in_wire_form():
    proc = Process(pid=4, intent="x")
    diff = spec.StatusDiff(proc)
    proc.fds[3] = "/dev/llm/a"
    proc.tool_results.add(5)
    proc.allowed_tools.append("Read")
    out = diff.changed(messages=False)
    assert out == {"fds": {"3": "/dev/llm/a"}, "tool_results": [5], "allowed_tools": ["Read"]}
    assert diff.changed(messages=False) == {}
    proc.fds.pop(3)
    assert diff.changed(spec.CHEAP_FIELDS, messages=False) == {"fds": {}}
