"""The OpenAI driver's connection pool (rnixfs/devices/llm/stack_transport.py) over
real HTTP to the scripted server: bounded, connections reused, and a slot
never lost to a failed, cancelled or broken request."""
from __future__ import annotations

import json

import httpx
import pytest
import trio

from rnixfs.devices.llm.stack_transport import StackTransport


def chat(text: str) -> dict:
    return {"model": "m", "stream": True, "messages": [{"role": "user", "content": text}]}


async def ask(client: httpx.AsyncClient, url: str, text: str) -> str:
    """The streamed reply's text (the content deltas of its SSE events)."""
    async with client.stream("POST", f"{url}/chat/completions", json=chat(text)) as resp:
        resp.raise_for_status()
        out = []
        async for line in resp.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:]).get("choices") or []:
                    out.append((choice.get("delta") or {}).get("content") or "")
        return "".join(out)


def run(body, **limits):
    async def main():
        transport = StackTransport(**limits)
        async with httpx.AsyncClient(transport=transport, timeout=30) as client:
            return await body(client, transport.pool)
    return trio.run(main)


def test_sequential_requests_reuse_one_connection(scripted_server):
    async def body(client, pool):
        return [await ask(client, scripted_server.url, f"hello {i}") for i in range(10)], pool.opened

    replies, opened = run(body)
    assert replies == [f"echo: hello {i}" for i in range(10)]
    assert opened == 1 and scripted_server.connections == 1


def test_concurrent_requests_stay_within_the_bound(scripted_server):
    """50 requests at once through 4 connections: each gets its own reply."""
    replies: dict[int, str] = {}

    async def body(client, pool):
        async def one(i):
            replies[i] = await ask(client, scripted_server.url, f"[[delay:0.05]] ask {i}")
        async with trio.open_nursery() as n:
            for i in range(50):
                n.start_soon(one, i)
        return pool.opened

    opened = run(body, max_connections=4)
    assert sorted(replies) == list(range(50))
    assert all(r == f"echo: ask {i}" for i, r in replies.items()), replies
    assert opened <= 4 and scripted_server.connections <= 4


def test_a_broken_or_cancelled_request_gives_its_slot_back(scripted_server):
    """One connection allowed: after a dropped body, an HTTP error and a
    cancelled request, the next request still gets through."""
    async def body(client, pool):
        with pytest.raises(httpx.HTTPError):
            await ask(client, scripted_server.url, "[[fault:disconnect]] cut")
        with pytest.raises(httpx.HTTPStatusError):
            await ask(client, scripted_server.url, "[[fault:500]] fail")
        with trio.move_on_after(0.3) as scope:
            await ask(client, scripted_server.url, "[[delay:30]] slow")
        assert scope.cancelled_caught
        with trio.fail_after(20):
            return await ask(client, scripted_server.url, "still served")

    assert run(body, max_connections=1) == "echo: still served"


def test_a_connection_the_server_closed_is_not_reused(scripted_server):
    """The server drops idle keep-alive connections when it stops; the next
    request opens a new one instead of failing on the dead socket."""
    async def body(client, pool):
        await ask(client, scripted_server.url, "first")
        scripted_server.stop()
        scripted_server.start()  # same port, the old connection is gone
        await trio.sleep(0.2)
        return await ask(client, scripted_server.url, "second"), pool.opened

    reply, opened = run(body)
    assert reply == "echo: second" and opened == 2


def test_a_closed_pool_refuses_requests(scripted_server):
    async def body(client, pool):
        await ask(client, scripted_server.url, "one")
        await pool.aclose()
        with pytest.raises(httpx.HTTPError):
            await ask(client, scripted_server.url, "two")
        return True

    assert run(body)


def test_a_proxy_in_the_environment_keeps_httpx_own_transport(monkeypatch, scripted_server):
    """httpx honours proxy variables only with its own transports, so the
    driver does not swap in the pool then (docs/architecture.md)."""
    from rnixfs.config import parse_providers
    from rnixfs.devices.llm.openai import OpenAIProvider
    from tests.mountutil import scripted_providers

    cfg = parse_providers(scripted_providers(scripted_server.url)).providers["scripted"]
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    plain = OpenAIProvider(cfg)
    assert isinstance(plain._client._transport, StackTransport)
    monkeypatch.setenv("https_proxy", "http://127.0.0.1:9")
    proxied = OpenAIProvider(cfg)
    assert not isinstance(proxied._client._transport, StackTransport)
    assert any(m is not None for m in proxied._client._mounts.values())  # the proxy is mounted
