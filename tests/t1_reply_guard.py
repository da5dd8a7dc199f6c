"""The reply guard (docs/devices.md, "Reply caps") around a driver that
misbehaves in ways a loopback server cannot easily script: a stream that
stalls between chunks, multi-byte text, and a caller that stops early."""
from __future__ import annotations

import pytest
import trio

from rnixfs.devices.llm.base import ChatChunk, LLMReplyTooLarge, LLMTimeout
from rnixfs.devices.llm.reply_guard import GuardedProvider


class Cfg:
    def __init__(self, max_reply_bytes=1 << 20, max_reply_time=60.0):
        self.max_reply_bytes, self.max_reply_time = max_reply_bytes, max_reply_time


class Driver:
    """Streams ``chunks``, then stalls forever if ``stall``; records closing."""
    name = "fake"

    def __init__(self, chunks, *, stall=False, **cfg):
        self.cfg = Cfg(**cfg)
        self.chunks, self.stall, self.closed = chunks, stall, False

    async def stream_chat(self, messages, **kw):
        try:
            for c in self.chunks:
                await trio.lowlevel.checkpoint()
                yield c
            if self.stall:
                await trio.sleep_forever()
        finally:
            self.closed = True


async def collect(guard):
    got = []
    async for c in guard.stream_chat([]):
        got.append(c.text)
    return got


def test_a_stall_between_chunks_ends_at_max_reply_time():
    driver = Driver([ChatChunk(text="a"), ChatChunk(text="b")], stall=True, max_reply_time=0.5)

    async def main():
        with trio.fail_after(30):
            with pytest.raises(LLMTimeout, match="max_reply_time of 0.5s"):
                await collect(GuardedProvider(driver))

    trio.run(main)
    assert driver.closed  # the driver's stream (its HTTP response) is closed too


def test_multibyte_text_counts_its_bytes():
    ok = Driver([ChatChunk(text="é" * 50)], max_reply_bytes=100)
    assert trio.run(collect, GuardedProvider(ok)) == ["é" * 50]
    big = Driver([ChatChunk(text="é" * 50), ChatChunk(text="x")], max_reply_bytes=100)
    with pytest.raises(LLMReplyTooLarge, match="max_reply_bytes of 100"):
        trio.run(collect, GuardedProvider(big))
    calls = Driver([ChatChunk(tool_calls=[{"index": 0, "function": {"arguments": "x" * 90}}])],
                   max_reply_bytes=100)
    with pytest.raises(LLMReplyTooLarge):  # 90 bytes of arguments + 16 for the delta
        trio.run(collect, GuardedProvider(calls))


def test_a_caller_that_stops_early_closes_the_driver_stream():
    driver = Driver([ChatChunk(text=str(i)) for i in range(10)], stall=True)

    async def main():
        stream = GuardedProvider(driver).stream_chat([])
        async for c in stream:
            if c.text == "3":
                break
        await stream.aclose()  # what the loop's aclosing does on kill

    trio.run(main)
    assert driver.closed
