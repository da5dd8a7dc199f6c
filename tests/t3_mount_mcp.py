"""Tier 3: dev/mcp with real MCP servers (the scripted one in
tests/mcp_server.py and the reference `mcp-server-time` from PyPI), driven
with cat, echo, ls and jq-style JSON parsing, as docs/devices.md shows."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.mountutil import do_mount, cleanup, needs_fuse, sh, wait_for

pytestmark = [needs_fuse, pytest.mark.mount]

SCRIPTED = str(Path(__file__).with_name("mcp_server.py"))
SECRET = "mcp-secret-5b1e9d7c3a"


def mcp_yaml(**servers) -> str:
    return json.dumps({"servers": servers})  # JSON is YAML


def scripted(**extra) -> dict:
    return {"command": sys.executable, "args": [SCRIPTED], "timeout": "5s", **extra}


def reference() -> dict:
    return {"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}


@pytest.fixture
def mcp_mount(tmp_path, request):
    mounts = []

    def make(servers: dict | None = None, *, mcp_json: dict | None = None, user: dict | None = None,
             env: dict | None = None):
        project = tmp_path / "project"
        (project / ".rnix").mkdir(parents=True, exist_ok=True)
        if servers is not None:
            (project / ".rnix" / "mcp.yaml").write_text(mcp_yaml(**servers))
        if mcp_json is not None:
            (project / ".mcp.json").write_text(json.dumps({"mcpServers": mcp_json}))
        if user is not None:
            (tmp_path / "config").mkdir(exist_ok=True)
            (tmp_path / "config" / "mcp.yaml").write_text(mcp_yaml(**user))
        old = dict(os.environ)
        os.environ.update(env or {})
        try:
            m = do_mount(tmp_path, None)
        finally:
            os.environ.clear()
            os.environ.update(old)
        mounts.append(m)
        return m

    yield make
    for m in mounts:
        cleanup(m)


def call(m, server: str, tool: str, payload: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """One call through one handle: write the arguments, read the result."""
    path = m.p(f"dev/mcp/{server}/tools/{tool}/call")
    args = m.path.parent / f"args-{os.getpid()}-{time.monotonic_ns()}"
    args.write_bytes(payload.encode("utf-8", "surrogateescape"))
    try:
        return sh(f'exec 3<>"{path}"; cat "{args}" >&3; rc=$?; cat <&3; exit $rc', timeout=timeout)
    finally:
        args.unlink()


def status(m, server: str) -> dict:
    return json.loads(Path(m.p(f"dev/mcp/{server}/status")).read_text())


def launchers(m) -> list[psutil.Process]:
    """The server launchers of this mount's daemon (other mounts, of other
    tests running at the same time, have their own)."""
    out = []
    try:
        children = psutil.Process(m.daemon_pid).children()
    except psutil.NoSuchProcess:
        return out
    for p in children:
        try:
            if any(c.endswith("mcp/launch.py") for c in p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


def test_tree_status_schema_and_a_call(mcp_mount):
    m = mcp_mount({"t": scripted(), "time": reference()})
    assert sorted(os.listdir(m.p("dev/mcp"))) == ["t", "time"]
    assert sorted(os.listdir(m.p("dev/mcp/t"))) == ["ctl", "prompts", "resources", "status", "tools"]
    st = status(m, "t")
    assert st["state"] == "stopped" and st["transport"] == "stdio" and st["calls"] == 0
    tools = os.listdir(m.p("dev/mcp/t/tools"))  # listing starts the server
    assert {"echo", "add", "crash", "hang", "huge", "fail", "env"} <= set(tools)
    assert status(m, "t")["state"] == "ready" and status(m, "t")["pid"]
    schema = json.loads(Path(m.p("dev/mcp/t/tools/add/schema")).read_text())
    assert schema["name"] == "add" and schema["input_schema"]["required"] == ["a", "b"]
    res = call(m, "t", "add", '{"a": 2, "b": 40}')
    assert res.returncode == 0, res.stderr
    assert res.stdout == "42\n"
    assert status(m, "t")["calls"] == 1


def test_reference_server_from_pypi(mcp_mount):
    m = mcp_mount({"time": reference()})
    assert "get_current_time" in os.listdir(m.p("dev/mcp/time/tools"))
    schema = json.loads(Path(m.p("dev/mcp/time/tools/get_current_time/schema")).read_text())
    assert "timezone" in schema["input_schema"]["properties"]
    assert schema["inputSchema"] == schema["input_schema"] and schema["description"]
    res = call(m, "time", "get_current_time", '{"timezone": "Asia/Tokyo"}')
    assert res.returncode == 0, res.stderr
    answer = json.loads(res.stdout)
    assert answer["timezone"] == "Asia/Tokyo" and answer["datetime"].endswith("+09:00")


def test_bad_input_is_einval_with_a_reason_and_the_daemon_stays_up(mcp_mount):
    m = mcp_mount({"t": scripted()})
    for payload, reason in [("not json", "not JSON"), ("[1, 2]", "JSON object"),
                            ('"text"', "JSON object"), ("\udcff", "UTF-8")]:
        res = call(m, "t", "add", payload)
        assert res.returncode != 0, payload
        assert "Invalid argument" in res.stderr, res.stderr
        assert res.stdout.startswith("error: ") and reason in res.stdout, res.stdout
    # arguments the schema refuses: the server's own error, readable
    res = call(m, "t", "add", '{"a": "two"}')
    assert res.returncode == 0 and res.stdout.startswith("error: "), res.stdout
    res = call(m, "t", "fail", '{"why": "because"}')
    assert res.stdout.startswith("error: ") and status(m, "t")["last_error"]["message"]
    oversize = "{" + '"a": 1,' * 60000 + '"b": 2}'
    res = call(m, "t", "add", oversize)
    assert res.returncode != 0 and "too large" in res.stderr.lower(), res.stderr
    res = sh(f'echo bogus > "{m.p("dev/mcp/t/ctl")}"')
    assert res.returncode != 0 and "Invalid argument" in res.stderr
    assert not os.path.exists(m.p("dev/mcp/t/tools/nope"))
    assert not os.path.exists(m.p("dev/mcp/nope"))
    res = sh(f'echo x > "{m.p("dev/mcp/t/status")}"')
    assert res.returncode != 0
    assert m.daemon_alive()
    assert call(m, "t", "add", '{"a": 1, "b": 1}').stdout == "2\n"


def test_concurrent_handles_never_cross(mcp_mount):
    m = mcp_mount({"t": scripted()})
    os.listdir(m.p("dev/mcp/t/tools"))
    script = " & ".join(
        f'(exec 3<>"{m.p("dev/mcp/t/tools/echo/call")}"; printf \'{{"text": "n{i}"}}\' >&3; '
        f'cat <&3 > "{m.path.parent}/out{i}")' for i in range(8)) + " & wait"
    res = sh(script, timeout=120)
    assert res.returncode == 0, res.stderr
    for i in range(8):
        assert (m.path.parent / f"out{i}").read_text().strip() == f"n{i}"
    assert status(m, "t")["calls"] == 8


def test_timeout_crash_and_restart(mcp_mount):
    m = mcp_mount({"t": scripted(timeout="2s")})
    res = call(m, "t", "hang", "{}")
    assert "error: " in res.stdout and "no answer within 2s" in res.stdout, res.stdout
    assert call(m, "t", "add", '{"a": 1, "b": 2}').stdout == "3\n"
    first = status(m, "t")["pid"]
    res = call(m, "t", "crash", "{}")
    assert res.stdout.startswith("error: "), res.stdout
    wait_for(lambda: status(m, "t")["state"] == "failed", 30, what="the crash to be noticed")
    assert status(m, "t")["last_error"]
    # the next use restarts it (after a short backoff)
    def works():
        return call(m, "t", "add", '{"a": 5, "b": 5}').stdout == "10\n"
    wait_for(works, 60, interval=0.5, what="a restart")
    assert status(m, "t")["pid"] not in (None, first)


def test_huge_result_is_capped(mcp_mount):
    m = mcp_mount({"t": scripted()})
    res = call(m, "t", "huge", '{"n": 3000000}')
    assert res.returncode == 0
    assert len(res.stdout) < 1_200_000 and "[truncated: " in res.stdout


def test_ctl_resources_prompts(mcp_mount):
    m = mcp_mount({"t": scripted()})
    sh(f'echo start > "{m.p("dev/mcp/t/ctl")}"', check=True)
    assert status(m, "t")["state"] == "ready"
    assert os.listdir(m.p("dev/mcp/t/resources")) == ["notes%3A%2F%2Freadme"]
    assert Path(m.p("dev/mcp/t/resources/notes%3A%2F%2Freadme")).read_text() == "hello from a resource\n"
    assert sorted(os.listdir(m.p("dev/mcp/t/prompts"))) == ["greet", "review"]
    review = json.loads(Path(m.p("dev/mcp/t/prompts/review")).read_text())
    assert review["arguments"][0]["name"] == "code" and review["arguments"][0]["required"]
    greet = json.loads(Path(m.p("dev/mcp/t/prompts/greet")).read_text())
    assert greet["messages"][0]["content"] == "Say hello."
    sh(f'echo stop > "{m.p("dev/mcp/t/ctl")}"', check=True)
    assert status(m, "t")["state"] == "stopped"
    wait_for(lambda: not launchers(m), 30, what="the server to go")
    sh(f'echo restart > "{m.p("dev/mcp/t/ctl")}"', check=True)
    assert status(m, "t")["state"] == "ready"


def test_claude_code_mcp_json_and_precedence(mcp_mount):
    m = mcp_mount({"both": scripted(timeout="7s")},
                  mcp_json={"fromjson": scripted(), "both": scripted(timeout="9s")},
                  user={"user": scripted(), "both": scripted(timeout="11s")})
    assert sorted(os.listdir(m.p("dev/mcp"))) == ["both", "fromjson", "user"]
    assert status(m, "both")["timeout"] == 7.0
    assert status(m, "fromjson")["origin"].endswith(".mcp.json")


@pytest.mark.expect_log('rnixfs\\.devices\\.mcp')
def test_secrets_never_show(mcp_mount):
    m = mcp_mount({"t": scripted(env={"TOKEN": "${MCP_TEST_TOKEN}"}),
                   "r": {"url": "http://user:" + SECRET + "@127.0.0.1:9/mcp",
                         "headers": {"Authorization": "Bearer ${MCP_TEST_TOKEN}"}, "timeout": "2s"}},
                  env={"MCP_TEST_TOKEN": SECRET})
    # the server gets it ...
    assert call(m, "t", "env", '{"name": "TOKEN"}').stdout.strip() == hashlib.sha256(SECRET.encode()).hexdigest()
    # ... and a result quoting it is redacted
    assert call(m, "t", "echo", json.dumps({"text": f"key={SECRET}"})).stdout.strip() == "key=***"
    # ... but nothing the daemon shows has it
    res = call(m, "r", "x", "{}")
    shown = [json.dumps(status(m, "t")), json.dumps(status(m, "r")), res.stdout, res.stderr, m.log(),
             os.getxattr(m.path, "user.rnixfs.daemon").decode()]
    ls = sh(f'ls "{m.p("dev/mcp/r/tools")}"')
    shown += [ls.stdout, ls.stderr]
    for text in shown:
        assert SECRET not in text
    assert "127.0.0.1:9" in status(m, "r")["url"]


def test_no_server_outlives_the_daemon(mcp_mount):
    m = mcp_mount({"t": scripted()})
    os.listdir(m.p("dev/mcp/t/tools"))
    assert launchers(m)
    server_pids = [c.pid for p in launchers(m) for c in p.children(recursive=True)] + \
        [p.pid for p in launchers(m)]
    os.kill(m.daemon_pid, signal.SIGKILL)

    def gone():
        return not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                       for p in server_pids)
    wait_for(gone, 30, what="the MCP server to die with the daemon")


def test_umount_stops_servers(mcp_mount):
    m = mcp_mount({"t": scripted(), "time": reference()})
    os.listdir(m.p("dev/mcp/t/tools"))
    os.listdir(m.p("dev/mcp/time/tools"))
    pids = [p.pid for p in launchers(m)]
    assert len(pids) == 2
    cleanup(m)
    wait_for(lambda: not any(psutil.pid_exists(p) for p in pids), 30, what="servers to stop")


def test_idle_timeout_stops_a_server(mcp_mount):
    m = mcp_mount({"t": scripted(idle_timeout="1s")})
    assert call(m, "t", "add", '{"a": 1, "b": 1}').stdout == "2\n"
    wait_for(lambda: status(m, "t")["state"] == "stopped", 30, what="idle stop")
    assert call(m, "t", "add", '{"a": 2, "b": 2}').stdout == "4\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def http_server():
    yield from _serve("http", "/mcp")


@pytest.fixture
def sse_server():
    yield from _serve("sse", "/sse")


def _serve(transport: str, path: str):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, SCRIPTED, transport, str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        def up():
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return True
            except OSError:
                return False
        wait_for(up, 60, what="the HTTP MCP server")
        yield f"http://127.0.0.1:{port}{path}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_streamable_http_server(mcp_mount, http_server):
    m = mcp_mount({"h": {"url": http_server, "headers": {"X-Test": "1"}}})
    assert status(m, "h")["transport"] == "http"
    assert "echo" in os.listdir(m.p("dev/mcp/h/tools"))
    res = call(m, "h", "echo", '{"text": "over http"}')
    assert res.stdout.strip() == "over http", res.stdout


@pytest.mark.expect_log('rnixfs\\.devices\\.mcp')
def test_bad_config_is_reported_not_fatal(mcp_mount):
    m = mcp_mount({"good": scripted(), "bad": {"args": ["x"]}, "worse": {"command": "x", "url": "http://y"}})
    assert os.listdir(m.p("dev/mcp")) == ["good"]
    info = json.loads(os.getxattr(m.path, "user.rnixfs.daemon"))
    errors = " ".join(info["mcp"]["errors"])
    assert "'bad'" in errors and "'worse'" in errors
    res = sh(f'ls "{m.p("dev/mcp/good/tools")}"')
    assert "echo" in res.stdout


@pytest.mark.expect_log('rnixfs\\.devices\\.mcp')
def test_missing_command_fails_clearly(mcp_mount):
    m = mcp_mount({"nope": {"command": "/nonexistent/server-binary"}})
    res = sh(f'ls "{m.p("dev/mcp/nope/tools")}"')
    assert res.returncode != 0
    st = status(m, "nope")
    assert st["state"] == "failed" and st["last_error"]
    assert "server-binary" in m.log()
    assert m.daemon_alive()


def test_slow_start_is_waited_for_and_ls_stays_answering(mcp_mount):
    m = mcp_mount({"slow": scripted(env={"MCP_TEST_SLOW_START": "3"})})
    t0 = time.monotonic()
    res = sh(f'(exec 3<>"{m.p("dev/mcp/slow/tools/add/call")}"; printf \'{{"a": 1, "b": 1}}\' >&3; cat <&3) '
             f'> "{m.path.parent}/slow.out" & sleep 0.5; ls "{m.p("proc")}" >/dev/null; '
             f'cat "{m.p("dev/mcp/slow/status")}"; wait')
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["state"] == "starting"  # status answers while it starts
    assert (m.path.parent / "slow.out").read_text() == "2\n"
    assert time.monotonic() - t0 >= 3


@pytest.mark.expect_log('rnixfs\\.devices\\.mcp')
def test_a_command_not_installed_says_so(mcp_mount):
    """`uvx`/`npx` servers where those are not installed: the reason is in
    status and the log, not a bare "connection closed"."""
    m = mcp_mount({"git": {"command": "rnixfs-test-no-such-uvx", "args": ["mcp-server-git"]}})
    res = sh(f'ls "{m.p("dev/mcp/git/tools")}"')
    assert res.returncode != 0
    message = status(m, "git")["last_error"]["message"]
    assert "rnixfs-test-no-such-uvx" in message and "not found" in message, message
    res = call(m, "git", "git_status", "{}")
    assert res.returncode != 0 or res.stdout.startswith("error: ")
    assert m.daemon_alive()


@pytest.mark.expect_log('rnixfs\\.devices\\.mcp')
def test_a_server_dying_at_start_shows_its_stderr(mcp_mount):
    m = mcp_mount({"t": scripted(env={"MCP_TEST_DIE_AT_START": "no database at /x"})})
    assert sh(f'ls "{m.p("dev/mcp/t/tools")}"').returncode != 0
    st = status(m, "t")
    assert st["state"] == "failed" and "no database at /x" in st["last_error"]["message"], st


def test_hostile_names_are_escaped_to_one_component(mcp_mount):
    m = mcp_mount({"t": scripted(env={"MCP_TEST_ODD": "1"})})
    tools = os.listdir(m.p("dev/mcp/t/tools"))
    assert {"a%2Fb", "%2E%2E", "ok.dot", "add"} <= set(tools), tools
    assert call(m, "t", "a%2Fb", "{}").stdout.strip() == "odd tool a/b"
    assert call(m, "t", "%2E%2E", "{}").stdout.strip() == "odd tool .."
    assert json.loads(Path(m.p("dev/mcp/t/tools/a%2Fb/schema")).read_text())["name"] == "a/b"
    resources = os.listdir(m.p("dev/mcp/t/resources"))
    assert len(resources) == 6 and len(set(resources)) == 6, resources  # the two long URIs stay apart
    for name in resources:
        assert "/" not in name and name not in (".", "..") and len(name.encode()) <= 255
    assert "file%3A%2F%2F%2F..%2F..%2Fetc%2Fpasswd" in resources
    contents = {Path(m.p(f"dev/mcp/t/resources/{n}")).read_text() for n in resources if n.startswith("x%3A%2F%2Fzz")}
    assert contents == {"odd resource 3\n", "odd resource 4\n"}
    assert Path(m.p("dev/mcp/t/resources/file%3A%2F%2F%2F..%2F..%2Fetc%2Fpasswd")).read_text() == "odd resource 0\n"
    assert os.listdir(m.p("dev/mcp/t/prompts")).count("..%2Fup") == 1
    for bad in ("..", "../../..", "x/../.."):
        assert not os.path.exists(m.p(f"dev/mcp/t/resources/{bad}/etc")), bad
    assert m.daemon_alive()


def test_streamable_http_sends_the_configured_headers(mcp_mount, http_server):
    m = mcp_mount({"h": {"url": http_server, "headers": {"X-Api-Key": "${MCP_TEST_TOKEN}"}}},
                  env={"MCP_TEST_TOKEN": SECRET})
    res = call(m, "h", "header", '{"name": "x-api-key"}')
    assert res.stdout.strip() == hashlib.sha256(SECRET.encode()).hexdigest(), res.stdout
    assert SECRET not in json.dumps(status(m, "h")) and SECRET not in m.log()


@pytest.mark.expect_log('rnixfs\\.devices\\.mcp\\.server: mcp')
def test_a_crash_is_noticed_and_the_next_call_restarts_at_once(mcp_mount):
    m = mcp_mount({"t": scripted()})
    assert call(m, "t", "add", '{"a": 1, "b": 1}').stdout == "2\n"
    launcher = psutil.Process(status(m, "t")["pid"])
    (server,) = launcher.children()
    server.kill()  # between calls, by nobody's call
    wait_for(lambda: status(m, "t")["state"] == "failed", 30, what="the exit to be noticed")
    assert "exited" in status(m, "t")["last_error"]["message"]
    res = call(m, "t", "add", '{"a": 2, "b": 3}')
    assert res.stdout == "5\n", (res.stdout, res.stderr)
    assert status(m, "t")["pid"] != launcher.pid
    # a crash during a call: that call fails, the next one restarts the server
    assert call(m, "t", "crash", "{}").stdout.startswith("error: ")
    assert call(m, "t", "add", '{"a": 4, "b": 4}').stdout == "8\n"


@pytest.mark.expect_log('mcp\\.client', 'rnixfs\\.devices\\.mcp')
def test_claude_code_mcp_json_as_written(mcp_mount, sse_server):
    """`.mcp.json` entries as Claude Code writes them: `type`, `${VAR:-default}`,
    an SSE server; an unknown type is refused with the reason."""
    m = mcp_mount(mcp_json={
        "local": {"type": "stdio", "command": sys.executable, "args": ["${MCP_TEST_UNSET_DIR:-" + SCRIPTED + "}"]},
        "events": {"type": "sse", "url": sse_server},
        "weird": {"type": "websocket", "url": "ws://127.0.0.1:9/"}})
    assert sorted(os.listdir(m.p("dev/mcp"))) == ["events", "local"]
    assert call(m, "local", "add", '{"a": 1, "b": 2}').stdout == "3\n"
    assert status(m, "events")["transport"] == "sse"
    res = call(m, "events", "echo", '{"text": "over sse"}')
    assert res.stdout.strip() == "over sse", (res.stdout, status(m, "events"))
    errors = " ".join(json.loads(os.getxattr(m.path, "user.rnixfs.daemon"))["mcp"]["errors"])
    assert "'weird'" in errors and "websocket" in errors, errors


def test_a_server_installed_beside_rnixfs_is_found_by_name(mcp_mount):
    """`command: mcp-server-time`, the console script pip installed into
    rnixfs's own environment, works when that environment is not on PATH."""
    m = mcp_mount({"time": {"command": "mcp-server-time", "args": ["--local-timezone", "UTC"]}},
                  env={"PATH": "/usr/bin:/bin"})
    res = call(m, "time", "get_current_time", '{"timezone": "UTC"}')
    assert json.loads(res.stdout)["timezone"] == "UTC", (res.stdout, status(m, "time"))
