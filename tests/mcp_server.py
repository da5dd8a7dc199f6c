"""A scripted MCP server for the tests (the SDK's MCPServer), with faults.

    python tests/mcp_server.py [stdio | http PORT]

Tools: echo, add, crash (the server exits mid-call), hang (never answers),
huge (N bytes of text), fail (a tool error), env (one environment variable).
Also a resource (notes://readme) and two prompts. Writes "started" to
stderr so the daemon log shows it. Slow start with MCP_TEST_SLOW_START=S.
"""
from __future__ import annotations

import os
import sys
import time

from mcp.server.mcpserver import MCPServer

if os.environ.get("MCP_TEST_SLOW_START"):
    time.sleep(float(os.environ["MCP_TEST_SLOW_START"]))

server = MCPServer("scripted")


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def crash() -> str:
    """Exit the server process mid-call."""
    os._exit(3)


@server.tool()
def hang() -> str:
    """Never answer."""
    time.sleep(3600)
    return "late"


@server.tool()
def huge(n: int) -> str:
    """n bytes of text."""
    return "x" * n


@server.tool()
def fail(why: str) -> str:
    """Raise, so the call is a tool error."""
    raise ValueError(f"failed because {why}")


@server.tool()
def env(name: str) -> str:
    """The sha256 of one environment variable of the server (not the value:
    the daemon would redact a configured secret)."""
    import hashlib
    return hashlib.sha256(os.environ.get(name, "<unset>").encode()).hexdigest()


@server.resource("notes://readme")
def readme() -> str:
    """The readme note."""
    return "hello from a resource\n"


@server.prompt()
def review(code: str) -> str:
    """Review some code."""
    return f"Please review:\n{code}"


@server.prompt()
def greet() -> str:
    """A prompt without arguments."""
    return "Say hello."


if __name__ == "__main__":
    print("scripted mcp server started", file=sys.stderr, flush=True)
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
