"""OpenAIProvider against the scripted server: real HTTP, real SSE, real faults."""
from __future__ import annotations

import logging
import socket
import time
from contextlib import aclosing

import pytest
import trio

from rnixfs.config import ProviderConfig
from rnixfs.devices.llm.base import LLMError, LLMTimeout, Usage
from rnixfs.devices.llm.openai import OpenAIProvider

KEY = "sk-scripted-secret-key-4242"


def make(server, **kw) -> OpenAIProvider:
    opts = dict(name="scripted", type="openai", model="scripted-model",
                base_url=server.url, timeout=5.0, connect_timeout=2.0,
                max_retries=3, retry_initial=0.01, retry_max=0.05)
    opts.update(kw)
    return OpenAIProvider(ProviderConfig(**opts))


def run(provider, content, **kw):
    """Stream one reply under trio; returns (text, chunks). Closes the provider."""
    async def main():
        chunks = []
        try:
            async with aclosing(provider.stream_chat(
                    [{"role": "user", "content": content}], **kw)) as agen:
                async for c in agen:
                    chunks.append(c)
        finally:
            await provider.aclose()
        return "".join(c.text for c in chunks), chunks
    return trio.run(main)


def run_err(provider, content, exc=LLMError, **kw):
    with pytest.raises(exc) as ei:
        run(provider, content, **kw)
    return ei.value


def test_streams_text_and_usage(scripted_server):
    text, chunks = run(make(scripted_server), "hello big world")
    assert text == "echo: hello big world"
    assert len([c for c in chunks if c.text]) == 4  # word by word
    last = chunks[-1]
    assert last.usage == Usage(prompt_tokens=3, completion_tokens=4)
    assert last.finish_reason == "stop"
    body = scripted_server.requests[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["model"] == "scripted-model"


def test_extra_merged_and_model_override(scripted_server):
    run(make(scripted_server), "x", model="other", max_tokens=7,
        extra={"temperature": 0.3, "response_format": {"type": "json_object"}})
    body = scripted_server.requests[0]
    assert body["model"] == "other" and body["max_tokens"] == 7
    assert body["temperature"] == 0.3
    assert body["response_format"] == {"type": "json_object"}


def test_tool_calls_passed_through(scripted_server):
    scripted_server.enqueue({"tool_calls": [
        {"id": "c1", "function": {"name": "read_file", "arguments": {"path": "/etc/hostname"}}}]})
    _, chunks = run(make(scripted_server), "read it")
    deltas = [tc for c in chunks for tc in c.tool_calls]
    assert deltas[0]["id"] == "c1" and deltas[0]["function"]["name"] == "read_file"
    args = "".join(d["function"].get("arguments", "") for d in deltas)
    assert args == '{"path": "/etc/hostname"}'
    assert chunks[-1].finish_reason == "tool_calls"


@pytest.mark.expect_log('stamina.retry_scheduled')
def test_500_then_success_is_retried(scripted_server):
    text, _ = run(make(scripted_server), "[[fault:500x2]] hi")
    assert text == "echo: hi"
    assert len(scripted_server.requests) == 3


@pytest.mark.expect_log('stamina.retry_scheduled')
def test_500_forever_gives_up(scripted_server):
    err = run_err(make(scripted_server, max_retries=2), "[[fault:500]] hi")
    assert err.status == 500 and err.retryable
    assert "3 attempt" in str(err) and "scripted fault 500" in str(err)
    assert len(scripted_server.requests) == 3


@pytest.mark.expect_log('stamina.retry_scheduled')
def test_429_retry_after_honoured(scripted_server):
    p = make(scripted_server, retry_max=5.0)
    t0 = time.monotonic()
    text, _ = run(p, "[[fault:429x1:retry-after=1]] hi")
    elapsed = time.monotonic() - t0
    assert text == "echo: hi"
    assert len(scripted_server.requests) == 2
    assert 0.9 <= elapsed < 4.0


@pytest.mark.expect_log('stamina.retry_scheduled')
def test_retry_after_capped_by_retry_max(scripted_server):
    t0 = time.monotonic()
    run(make(scripted_server, retry_max=0.2), "[[fault:429x1:retry-after=30]] hi")
    assert time.monotonic() - t0 < 3.0


@pytest.mark.expect_log('stamina.retry_scheduled')
def test_timeout_raises_llmtimeout(scripted_server):
    t0 = time.monotonic()
    err = run_err(make(scripted_server, timeout=0.3, max_retries=1),
                  "[[fault:timeout]]", LLMTimeout)
    assert "2 attempt" in str(err)
    assert len(scripted_server.requests) == 2
    assert time.monotonic() - t0 < 5.0


def test_disconnect_mid_stream_is_not_retried(scripted_server):
    got = []

    async def main():
        p = make(scripted_server)
        try:
            async with aclosing(p.stream_chat([{"role": "user", "content":
                                 "one two three four five six [[fault:disconnect]]"}])) as agen:
                async for c in agen:
                    got.append(c.text)
        finally:
            await p.aclose()

    with pytest.raises(LLMError) as ei:
        trio.run(main)
    assert str(ei.value).startswith("stream interrupted")
    assert not ei.value.retryable
    assert "".join(got).startswith("echo:")
    assert len(scripted_server.requests) == 1


def test_malformed_event(scripted_server):
    err = run_err(make(scripted_server), "[[fault:malformed]]")
    assert "malformed" in str(err)
    assert len(scripted_server.requests) == 1


def test_401_not_retried(scripted_server):
    err = run_err(make(scripted_server), "[[fault:401]]")
    assert err.status == 401 and not err.retryable
    assert "HTTP 401" in str(err) and "scripted fault 401" in str(err)
    assert len(scripted_server.requests) == 1


def test_long_server_message_truncated(scripted_server):
    scripted_server.enqueue({"fault": 400, "error": "bad request " * 100})
    err = run_err(make(scripted_server), "x")
    assert err.status == 400 and not err.retryable
    assert "bad request" in str(err) and len(str(err)) < 260


@pytest.mark.expect_log('stamina.retry_scheduled')
def test_key_sent_as_bearer_never_leaked(scripted_server, caplog):
    caplog.set_level(logging.DEBUG)
    p = make(scripted_server, api_key=KEY, max_retries=1)
    assert KEY not in str(p.describe()) and p.describe()["api_key"] == "set"
    run(p, "hi")
    # The server echoes the key back in its error message, as some real ones do.
    scripted_server.enqueue({"fault": 401, "error": f"Incorrect API key provided: {KEY}"})
    scripted_server.enqueue({"fault": 503, "error": f"overloaded for {KEY}"})
    scripted_server.enqueue({"fault": 503, "error": f"overloaded for {KEY}"})
    for directive, exc in (("x", LLMError), ("y", LLMError), ("[[fault:timeout]]", LLMTimeout)):
        err = run_err(make(scripted_server, api_key=KEY, max_retries=1, timeout=0.3),
                      directive, exc)
        assert KEY not in str(err) and KEY not in repr(err) and KEY not in err.cause
    headers = scripted_server.request_headers
    assert len(headers) == 6
    assert all(h.get("Authorization") == f"Bearer {KEY}" for h in headers)
    assert caplog.records, "retries should be logged"
    assert all(KEY not in r.getMessage() for r in caplog.records)
    assert KEY not in caplog.text


def test_no_key_no_authorization_header(scripted_server):
    run(make(scripted_server), "hi")
    assert "Authorization" not in scripted_server.request_headers[0]


@pytest.mark.expect_log('stamina.retry_scheduled')
def test_unreachable_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    cfg = ProviderConfig(name="gone", type="openai", model="m",
                         base_url=f"http://127.0.0.1:{port}/v1", connect_timeout=1.0,
                         max_retries=2, retry_initial=0.01, retry_max=0.02)
    with pytest.raises(LLMError) as ei:
        run(OpenAIProvider(cfg), "hi")
    assert "3 attempt" in str(ei.value) and ei.value.retryable
    assert "Connect" in str(ei.value)


def test_cancellation_closes_cleanly(scripted_server):
    """A caller's deadline cancels the stream; no retry, nothing left open."""
    async def main():
        p = make(scripted_server)
        with trio.move_on_after(0.3) as scope:
            async with aclosing(p.stream_chat([{"role": "user", "content":
                                                "[[delay:5]] slow"}])) as agen:
                async for _ in agen:
                    pass
        await p.aclose()
        return scope.cancelled_caught
    assert trio.run(main)
    assert len(scripted_server.requests) == 1


def test_registry_from_config(scripted_server, tmp_path, monkeypatch):
    from rnixfs.config import parse_providers
    from rnixfs.devices.llm.registry import ProviderRegistry

    monkeypatch.setenv("RNIXFS_TEST_KEY", KEY)
    cfg = parse_providers(f"""
default: scripted
providers:
  scripted: {{type: openai, base_url: "{scripted_server.url}", model: s, api_key: "${{RNIXFS_TEST_KEY}}"}}
""")
    reg = ProviderRegistry.from_config(cfg, tmp_path)
    assert reg.default_name == "scripted" and reg.names() == ["local", "scripted"]
    assert reg.get().name == "scripted" and reg.get("local").describe()["state"] == "stopped"
    with pytest.raises(KeyError):
        reg.get("nope")
    assert KEY not in str(reg.describe())

    async def main():
        try:
            chunks = []
            async with aclosing(reg.get("scripted").stream_chat(
                    [{"role": "user", "content": "via registry"}])) as agen:
                async for c in agen:
                    chunks.append(c)
            return "".join(c.text for c in chunks)
        finally:
            await reg.aclose()  # local was never started: nothing to stop

    assert trio.run(main) == "echo: via registry"


def test_registry_price(tmp_path):
    from rnixfs.config import parse_providers
    from rnixfs.devices.llm.registry import ProviderRegistry

    cfg = parse_providers("""
providers:
  paid: {type: openai, base_url: "http://127.0.0.1:9/v1", model: m1,
         prices: {m1: {input: 0.15, output: 0.6}, m2: {input: 1000000}}}
""")
    reg = ProviderRegistry.from_config(cfg, tmp_path)
    u = Usage(prompt_tokens=1_000_000, completion_tokens=2_000_000)
    assert reg.price("paid", "m1", u) == pytest.approx(0.15 + 1.2)
    assert reg.price("paid", None, u) == pytest.approx(1.35)  # default model
    assert reg.price("paid", "m2", Usage(3, 7)) == pytest.approx(3.0)  # no output price: 0
    assert reg.price("paid", "other", u) == 0.0
    assert reg.price("local", None, u) == 0.0
    assert reg.price("paid", "m1", None) == 0.0
    trio.run(reg.aclose)


# --- the scripted server itself (a shared test asset) ------------------------

def test_scripted_server_directives_and_non_streaming(scripted_server):
    import httpx

    def ask(content, **body):
        r = httpx.post(f"{scripted_server.url}/chat/completions", timeout=10,
                       json={"messages": [{"role": "system", "content": "be brief"},
                                          {"role": "user", "content": content}], **body})
        return r.json()

    d = ask("[[reply:Paris is the capital.]]")
    assert d["choices"][0]["message"]["content"] == "Paris is the capital."
    # prompt: "be brief" (2) + the 4 whitespace words of the directive message
    assert d["usage"] == {"prompt_tokens": 6, "completion_tokens": 4, "total_tokens": 10}
    assert ask("[[tokens:5]]")["usage"]["completion_tokens"] == 5
    d = ask("[[tokens:50]]", max_tokens=3)
    assert d["usage"]["completion_tokens"] == 3 and d["choices"][0]["finish_reason"] == "length"
    assert httpx.get(f"{scripted_server.base}/health").status_code == 200
    assert httpx.get(f"{scripted_server.url}/models").json()["data"][0]["id"] == "scripted"
    r = httpx.post(f"{scripted_server.url}/chat/completions",
                   json={"messages": [{"role": "user", "content": "[[fault:429x1:retry-after=2]]"}]})
    assert r.status_code == 429 and r.headers["retry-after"] == "2"


def test_scripted_server_delays_and_zero_latency():
    from tests.scripted_server import ScriptedServer

    async def timed(server, content):
        p = make(server)
        t0 = trio.current_time()
        async with aclosing(p.stream_chat([{"role": "user", "content": content}])) as agen:
            async for _ in agen:
                pass
        await p.aclose()
        return trio.current_time() - t0

    slow = "[[delay:0.3]] [[chunk-delay:0.05]] [[tokens:6]]"
    with ScriptedServer() as s:
        assert trio.run(timed, s, slow) >= 0.5
    with ScriptedServer(zero_latency=True) as s:
        assert trio.run(timed, s, slow) < 0.3


def test_scripted_server_stop_wakes_hanging_handlers():
    import threading
    import httpx
    from tests.scripted_server import ScriptedServer

    s = ScriptedServer().start()
    errors = []

    def client():
        try:
            httpx.post(f"{s.url}/chat/completions", timeout=30,
                       json={"stream": True, "messages": [{"role": "user", "content": "[[fault:timeout]]"}]})
        except httpx.HTTPError as e:
            errors.append(e)

    t = threading.Thread(target=client)
    t.start()
    while not s.requests:
        time.sleep(0.01)
    t0 = time.monotonic()
    s.stop()
    t.join(5)
    assert not t.is_alive() and time.monotonic() - t0 < 3
    assert errors


def test_scripted_server_cli():
    import subprocess
    import sys
    import httpx
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen([sys.executable, "-m", "tests.scripted_server", "--port", "0",
                             "--zero-latency"], cwd=root, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("listening on http://127.0.0.1:") and line.endswith("/v1")
        url = line.split()[-1]
        r = httpx.post(f"{url}/chat/completions",
                       json={"messages": [{"role": "user", "content": "ping"}]})
        assert r.json()["choices"][0]["message"]["content"] == "echo: ping"
    finally:
        proc.terminate()
        proc.wait(5)


def test_connection_is_reused_between_requests(scripted_server):
    """The body is read past [DONE], so httpx keeps the connection."""
    provider = make(scripted_server)

    async def main():
        for i in range(3):
            async with aclosing(provider.stream_chat([{"role": "user", "content": f"n{i}"}])) as s:
                async for _ in s:
                    pass
        await provider.aclose()

    trio.run(main)
    assert len(scripted_server.requests) == 3
    assert scripted_server.connections == 1


# --- the driver boundary: caps, usage checks, redaction ----------------------

def guarded(server, redactor=None, **kw):
    from rnixfs.devices.llm.reply_guard import GuardedProvider
    return GuardedProvider(make(server, **kw), redactor)


def test_endless_reply_capped_in_bytes(scripted_server):
    from rnixfs.devices.llm.base import LLMReplyTooLarge

    got = []

    async def main():
        p = guarded(scripted_server, max_reply_bytes=64 * 1024)
        try:
            async with aclosing(p.stream_chat([{"role": "user", "content": "[[fault:endless]]"}])) as s:
                async for c in s:
                    got.append(c.text)
        finally:
            await p.aclose()

    with pytest.raises(LLMReplyTooLarge) as ei:
        trio.run(main)
    assert "max_reply_bytes of 65536" in str(ei.value)
    assert 60 * 1024 < len("".join(got).encode()) <= 64 * 1024


def test_endless_line_capped_by_the_driver_itself(scripted_server):
    """A data line that never ends is refused before it fills memory."""
    from rnixfs.devices.llm.base import LLMReplyTooLarge

    t0 = time.monotonic()
    err = run_err(make(scripted_server, max_reply_bytes=32 * 1024), "[[fault:endless-line]]",
                  LLMReplyTooLarge)
    assert "larger than" in str(err) and time.monotonic() - t0 < 30


def test_wall_clock_cap_although_chunks_keep_coming(scripted_server):
    t0 = time.monotonic()
    err = run_err(guarded(scripted_server, timeout=0.5, max_reply_time=1.0),
                  "[[fault:endless]] [[chunk-delay:0.05]]", LLMTimeout)
    assert "max_reply_time of 1s" in str(err)
    assert time.monotonic() - t0 < 10


def test_tool_call_bytes_count_toward_the_cap(scripted_server):
    from rnixfs.devices.llm.base import LLMReplyTooLarge

    scripted_server.enqueue({"tool_calls": [
        {"id": "c1", "function": {"name": "Write", "arguments": {"content": "x" * 5000}}}]})
    run_err(guarded(scripted_server, max_reply_bytes=4096), "write", LLMReplyTooLarge)


@pytest.mark.parametrize("raw,shown", [
    ('{"prompt_tokens": 1e400, "completion_tokens": 1}', "prompt_tokens=inf"),
    ('{"prompt_tokens": 3, "completion_tokens": -1000000000}', "completion_tokens=-1000000000"),
    ('{"prompt_tokens": "12", "completion_tokens": 1}', "prompt_tokens=str"),
    ('{"prompt_tokens": true, "completion_tokens": 1}', "prompt_tokens=True"),
    ('{"prompt_tokens": 100000001, "completion_tokens": 1}', "prompt_tokens=100000001"),
    ('[1, 2]', "malformed event"),
])
def test_usage_from_the_server_is_checked(scripted_server, raw, shown):
    scripted_server.enqueue({"content": "hi", "usage_raw": raw})
    err = run_err(guarded(scripted_server), "x")
    assert type(err) is LLMError  # a driver error: fallbacks apply
    assert shown in str(err)


def test_sane_usage_is_accepted(scripted_server):
    scripted_server.enqueue({"content": "hi", "usage_raw": '{"prompt_tokens": 7.0, "completion_tokens": 0}'})
    _, chunks = run(guarded(scripted_server), "x")
    assert chunks[-1].usage == Usage(7, 0)
    with pytest.raises(LLMError):
        Usage(-1, 0).check()


def test_redactor_masks_secrets_and_userinfo():
    from rnixfs.devices.llm.redact import Redactor

    r = Redactor([KEY, "abc", ""])  # too short to mask safely: ignored
    assert r(f"bad {KEY}!") == "bad ***!"
    assert r("see https://u:p@host:1/v1 and ftp://x@y") == "see https://***@host:1/v1 and ftp://***@y"
    assert r("mail me: a@b.c, abc") == "mail me: a@b.c, abc"
    assert r.data({"k": [f"{KEY}", 3, {"url": "http://me:pw@h/"}]}) == \
        {"k": ["***", 3, {"url": "http://***@h/"}]}


def test_stream_redactor_catches_a_secret_split_anywhere():
    import random

    from rnixfs.devices.llm.redact import Redactor

    secrets = [KEY, "hunter2-password", "sk-scripted"]  # one is a prefix of another
    r = Redactor(secrets)
    rng = random.Random(7)
    for _ in range(300):
        words = [rng.choice(secrets + ["sk-", "hunt", "plain text ", "s", "k"]) for _ in range(12)]
        text = " ".join(words)
        cuts = sorted(rng.sample(range(1, len(text)), 5))
        pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])]
        s = r.stream()
        out = "".join(s.feed(p) for p in pieces) + s.flush()
        assert out == r(text), (pieces, out)
        for secret in secrets:
            assert secret not in out


def test_guard_redacts_errors_replies_tool_calls_and_describe(scripted_server, caplog):
    from rnixfs.devices.llm.redact import Redactor

    caplog.set_level(logging.DEBUG, logger="rnixfs")
    r = Redactor([KEY])
    for fault in ("error-event", "malformed", "not-sse", 400):
        scripted_server.enqueue({"fault": fault, "error": f"key {KEY} rejected"})
        err = run_err(guarded(scripted_server, r, api_key=KEY, max_retries=0), "x")
        assert KEY not in str(err) and "***" in str(err), fault
    scripted_server.enqueue({"content": f"the key is {KEY} indeed",
                             "tool_calls": [{"id": "c1", "function": {
                                 "name": "Bash", "arguments": {"command": f"echo {KEY}"}}}]})
    text, chunks = run(guarded(scripted_server, r, api_key=KEY), "x")
    assert text == "the key is *** indeed"
    args = "".join(d["function"].get("arguments", "") for c in chunks for d in c.tool_calls)
    assert args == '{"command": "echo ***"}'
    g = guarded(scripted_server, Redactor(["s3cr3t-pass"]),
                base_url=scripted_server.url.replace("://", "://user:s3cr3t-pass@"))
    assert "s3cr3t-pass" not in str(g.describe()) and "***@" in g.describe()["base_url"]
    trio.run(g.aclose)
    assert KEY not in caplog.text


@pytest.mark.expect_log(r'rnixfs\.test: ')
def test_log_filter_redacts_messages_args_and_tracebacks(tmp_path):
    from rnixfs.devices.llm.redact import Redactor, install_log_filter, remove_log_filter

    path = tmp_path / "x.log"
    handler = logging.FileHandler(path)
    root = logging.getLogger()
    root.addHandler(handler)
    f = install_log_filter(Redactor([KEY]))
    try:
        log = logging.getLogger("rnixfs.test")
        log.warning("key %s in args", KEY)
        log.warning(f"key {KEY} in the message")
        try:
            raise ValueError(f"boom {KEY}")
        except ValueError:
            log.exception("failed")
    finally:
        remove_log_filter(f)
        root.removeHandler(handler)
        handler.close()
    text = path.read_text()
    assert KEY not in text and text.count("***") == 3 and "ValueError: boom ***" in text


def test_config_secret_values(monkeypatch):
    import base64

    from rnixfs.config import parse_providers

    monkeypatch.setenv("RNIXFS_T_KEY", KEY)
    monkeypatch.setenv("RNIXFS_T_ORG", "org-7f3a")
    monkeypatch.setenv("RNIXFS_T_PW", "p%40ss-word")
    cfg = parse_providers("""
providers:
  a: {type: openai, base_url: "http://bob:${RNIXFS_T_PW}@h/v1", model: m, api_key: "${RNIXFS_T_KEY}",
      headers: {X-Org: "${RNIXFS_T_ORG}", X-Plain: literal-value}, max_reply_bytes: 1000,
      max_reply_time: 2.5}
""")
    s = cfg.secret_values()
    assert {KEY, "org-7f3a", "literal-value", "p%40ss-word", "p@ss-word",
            base64.b64encode(b"bob:p@ss-word").decode()} <= s
    a = cfg.providers["a"]
    assert (a.max_reply_bytes, a.max_reply_time) == (1000, 2.5)
    for bad in ("max_reply_bytes: 0", "max_reply_bytes: 1.5", "max_reply_time: -1"):
        with pytest.raises(Exception, match="max_reply"):
            parse_providers(f"providers:\n  b: {{type: openai, base_url: 'http://h', model: m, {bad}}}\n")


def test_a_body_that_goes_on_after_done_does_not_hold_the_reply():
    """[DONE] ends the reply even if the server keeps streaming after it."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    stop = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            events = [b'data: {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}\n\n',
                      b"data: [DONE]\n\n"]
            try:
                for e in events:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(e), e))
                end = time.monotonic() + 10  # bounded: a failing driver still ends
                while not stop.is_set() and time.monotonic() < end:
                    e = b"data: more\n\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(e), e))
                    self.wfile.flush()
                    time.sleep(0.001)
                self.wfile.write(b"0\r\n\r\n")
            except OSError:
                pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        cfg = ProviderConfig(name="after", type="openai", model="m", timeout=5.0,
                             base_url=f"http://127.0.0.1:{httpd.server_address[1]}/v1")
        t0 = time.monotonic()
        text, chunks = run(OpenAIProvider(cfg), "x")
        assert text == "hi" and chunks[-1].finish_reason == "stop"
        assert time.monotonic() - t0 < 5
    finally:
        stop.set()
        httpd.shutdown()
        httpd.server_close()


def test_text_accumulator_is_compact_and_exact():
    import sys

    from rnixfs.devices.llm.base import TextAccumulator

    acc = TextAccumulator()
    assert not acc and acc.text() == "" and not acc.endswith("x")
    pieces = [chr(97 + i % 26) for i in range(100_000)]
    for p in pieces:
        acc.append(p)
    assert acc.text() == "".join(pieces) and acc.endswith(pieces[-1]) and acc
    held = sum(sys.getsizeof(b) for b in acc._blocks) + sum(sys.getsizeof(p) for p in acc._pieces)
    assert held < 3 * len(pieces)  # not ~50 bytes per one-character piece
    acc.clear()
    assert not acc
