"""A scripted MCP server for the tests (the SDK's MCPServer), with faults.

    python tests/mcp_server.py [stdio | http PORT | sse PORT]

Tools: echo, add, crash (the server exits mid-call), hang (never answers),
huge (N bytes of text), fail (a tool error), env (one environment variable).
Also a resource (notes://readme) and two prompts. Writes "started" to
stderr so the daemon log shows it. Slow start with MCP_TEST_SLOW_START=S;
MCP_TEST_DIE_AT_START=REASON writes the reason to stderr and exits;
MCP_TEST_ODD=1 adds tools, resources and a prompt with hostile names.
Over HTTP, the tool `header` returns the sha256 of one request header.
"""
from __future__ import annotations

import os
import sys
import time

from mcp.server.mcpserver import Context, MCPServer

if os.environ.get("MCP_TEST_SLOW_START"):
    time.sleep(float(os.environ["MCP_TEST_SLOW_START"]))

if os.environ.get("MCP_TEST_DIE_AT_START"):
    print(f"fatal: {os.environ['MCP_TEST_DIE_AT_START']}", file=sys.stderr, flush=True)
    sys.exit(1)

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


@server.tool()
def header(name: str, ctx: Context) -> str:
    """The sha256 of one HTTP request header (Streamable HTTP only)."""
    import hashlib
    request = ctx.request_context.request
    value = request.headers.get(name, "<unset>") if request is not None else "<no http>"
    return hashlib.sha256(value.encode()).hexdigest()


ODD_URIS = ["file:///../../etc/passwd", "x://..", "x://a/b/../c", "x://" + "z" * 400,
            "x://" + "z" * 400 + "2"]
ODD_TOOLS = ["a/b", "..", "ok.dot"]
if os.environ.get("MCP_TEST_ODD"):
    for i, uri in enumerate(ODD_URIS):
        server.resource(uri, name=f"odd{i}")((lambda j: (lambda: f"odd resource {j}\n"))(i))
    for tool in ODD_TOOLS:
        server.tool(name=tool)((lambda t: (lambda: f"odd tool {t}"))(tool))
    server.prompt(name="../up")(lambda: "an odd prompt")


if __name__ == "__main__":
    print("scripted mcp server started", file=sys.stderr, flush=True)
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    elif len(sys.argv) > 2 and sys.argv[1] == "sse":
        server.run("sse", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
