"""An HTTP/1.1 transport whose cost per request does not grow with the
number of connections (docs/architecture.md, "Model requests").

httpcore's ``AsyncConnectionPool`` assigns requests to connections by
scanning every connection (with a readability poll each) and every queued
request, on every request and every response close. With hundreds of agents
sharing one provider, that scan was the daemon's largest cost. This
transport keeps the idle keep-alive connections of each origin on a stack:
a request takes the most recently used one (checking only that one) or opens
a new one, and gives it back when its response is closed. A semaphore bounds
the connections in use; waiters queue in FIFO order at no cost per request.

It is built per provider inside the process that runs the requests (the
daemon, or a worker process with its own event loop). With a proxy set in
the environment the driver keeps httpx's own transport, which honours it.
"""
from __future__ import annotations

import os
import ssl
from typing import AsyncIterator

import httpcore
import httpx
import trio

DEFAULT_MAX_CONNECTIONS = 256
DEFAULT_MAX_IDLE = 128
DEFAULT_KEEPALIVE = 5.0  # seconds an idle connection is kept (httpx's default)
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


def env_proxy() -> bool:
    """Does the environment name a proxy (which httpx honours only with its
    own transports)?"""
    return any(os.environ.get(v) or os.environ.get(v.lower()) for v in PROXY_VARIABLES)


class StackPool:
    """httpcore's pool interface (``handle_async_request``, ``aclose``) over
    one stack of idle HTTP/1.1 connections per origin."""

    def __init__(self, ssl_context: ssl.SSLContext | None, *, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 max_idle: int = DEFAULT_MAX_IDLE, keepalive_expiry: float | None = DEFAULT_KEEPALIVE):
        self._ssl_context = ssl_context
        self._keepalive_expiry = keepalive_expiry
        self._max_idle = max_idle
        self._slots = trio.Semaphore(max_connections)
        self._idle: dict[tuple, list[httpcore.AsyncHTTPConnection]] = {}
        self._closed = False
        self.opened = 0  # connections opened so far (tests)

    async def _take(self, key: tuple, origin: httpcore.Origin) -> httpcore.AsyncHTTPConnection:
        stack = self._idle.get(key)
        while stack:
            conn = stack.pop()
            if conn.is_available() and not conn.has_expired():
                return conn
            await _close(conn)
        self.opened += 1
        return httpcore.AsyncHTTPConnection(origin=origin, ssl_context=self._ssl_context,
                                            keepalive_expiry=self._keepalive_expiry)

    async def handle_async_request(self, request: httpcore.Request) -> httpcore.Response:
        if self._closed:
            raise httpcore.PoolTimeout("the connection pool is closed")
        origin = request.url.origin
        key = (origin.scheme, origin.host, origin.port)
        await self._slots.acquire()
        conn = None
        try:
            conn = await self._take(key, origin)
            response = await conn.handle_async_request(request)
        except BaseException:
            if conn is not None:
                await _close(conn)
            self._slots.release()
            raise
        response.stream = _GiveBack(response.stream, self, key, conn)
        return response

    async def _give_back(self, key: tuple, conn: httpcore.AsyncHTTPConnection) -> None:
        try:
            stack = self._idle.setdefault(key, [])
            if not self._closed and conn.is_idle() and len(stack) < self._max_idle:
                stack.append(conn)
                # the oldest idle one may have expired meanwhile: one look per request
                if len(stack) > 1 and stack[0].has_expired():
                    await _close(stack.pop(0))
            else:
                await _close(conn)
        finally:
            self._slots.release()

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, {}
        for stack in idle.values():
            for conn in stack:
                await _close(conn)

    async def __aenter__(self) -> "StackPool":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


async def _close(conn: httpcore.AsyncHTTPConnection) -> None:
    with trio.CancelScope(shield=True):
        try:
            await conn.aclose()
        except Exception:  # a broken socket: it is gone either way
            pass


class _GiveBack:
    """A response body that returns its connection to the pool when closed."""

    def __init__(self, stream, pool: StackPool, key: tuple, conn: httpcore.AsyncHTTPConnection):
        self._stream, self._pool, self._key, self._conn = stream, pool, key, conn
        self._done = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self._stream:
            yield part

    async def aclose(self) -> None:
        if self._done:
            return
        self._done = True
        try:
            if hasattr(self._stream, "aclose"):
                await self._stream.aclose()
        finally:
            with trio.CancelScope(shield=True):
                await self._pool._give_back(self._key, self._conn)


class StackTransport(httpx.AsyncHTTPTransport):
    """``httpx.AsyncHTTPTransport`` (request and error mapping) over a
    ``StackPool`` instead of httpcore's pool. HTTP/1.1, no proxy."""

    def __init__(self, *, max_connections: int = DEFAULT_MAX_CONNECTIONS, max_idle: int = DEFAULT_MAX_IDLE,
                 keepalive_expiry: float | None = DEFAULT_KEEPALIVE, verify: ssl.SSLContext | bool = True):
        ctx = httpx.create_ssl_context(verify=verify)
        super().__init__(verify=ctx)
        self._pool = StackPool(ctx, max_connections=max_connections, max_idle=max_idle,
                               keepalive_expiry=keepalive_expiry)

    @property
    def pool(self) -> StackPool:
        return self._pool
