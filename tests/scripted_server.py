"""A scripted OpenAI-compatible chat server on loopback, for tests and benchmarks.

Real HTTP (HTTP/1.1, keep-alive), real SSE streaming (chunked transfer, one
event per word), deterministic replies, tool calls and injectable faults, so
that drivers and the FUSE layer are exercised without mocks.

Replies, in priority order:
1. a reply queued with ``enqueue()`` (one per request, FIFO);
2. directives found in the last user message (see ``DIRECTIVES``);
3. the default ``"echo: <last user message, directives removed>"``.

Usage: prompt_tokens = whitespace-separated words in all message contents;
completion_tokens = words in the reply content (+ words of tool-call names and
arguments). Always reported in the last chunk (or in ``usage`` when not
streaming). ``max_tokens`` truncates the reply to that many words
(finish_reason "length").

Run in the foreground: ``python -m tests.scripted_server --port 8080``.
"""
from __future__ import annotations

import argparse
import itertools
import json
import re
import socket
import sys
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DIRECTIVES = """\
[[fault:500]]                   every attempt with this message gets HTTP 500 (any 4xx/5xx code works)
[[fault:500x2]]                 the first 2 attempts carrying this exact message fail, then success
[[fault:429x1:retry-after=1]]   HTTP 429 with a Retry-After header (seconds)
[[fault:timeout]]               never answer (hangs until the client gives up or stop())
[[fault:disconnect]]            stream half of the reply, then drop the connection mid-body
[[fault:malformed]]             send an SSE event that is not JSON (the queued "error" text
                                as the first event, when given)
[[fault:endless]]               stream content deltas (1 KiB each) forever, as fast as the
                                client reads (chunk-delay slows it), until it goes away
[[fault:endless-line]]          start a "data:" line and never end it
[[fault:endless-error]]         HTTP 400 whose JSON error body never ends
[[fault:error-event]]           a 200 event stream whose first event is {"error": ...}
[[fault:not-sse]]               HTTP 200 whose Content-Type is not text/event-stream (the
                                queued "error" text rides in it and in the body)
[[delay:2.5]]                   wait before the first byte
[[chunk-delay:0.2]]             wait between streamed chunks
[[reply:some text]]             reply with exactly this text
[[tokens:N]]                    reply with N words
"""

_DIRECTIVE_RE = re.compile(r"\[\[([a-z-]+):(.*?)\]\]", re.S)
_FAULT_RE = re.compile(r"^(?P<kind>\d{3}|timeout|disconnect|malformed|endless-line|endless-error|endless"
                       r"|error-event|not-sse)"
                       r"(?:x(?P<count>\d+))?(?::retry-after=(?P<ra>[\d.]+))?$")
_WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo "
          "lima mike november oscar papa quebec romeo sierra tango").split()
_HANG_LIMIT = 600.0


def words(text) -> int:
    return len(_text(text).split())


def _text(content) -> str:
    """Message content as text (string or a list of content parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def _pieces(text: str) -> list[str]:
    """Word-by-word stream pieces whose concatenation is exactly ``text``."""
    return re.findall(r"\s*\S+|\s+$", text)


def parse_fault(spec) -> dict | None:
    """'500x2', '429x1:retry-after=1', 'timeout', 500 → {kind, count, retry_after}."""
    if spec is None:
        return None
    m = _FAULT_RE.match(str(spec).strip())
    if not m:
        raise ValueError(f"bad fault spec {spec!r}")
    return {"kind": m["kind"], "count": int(m["count"]) if m["count"] else None,
            "retry_after": m["ra"]}


class _Listener(ThreadingHTTPServer):
    # a real server's listen backlog (http.server's is 5): agents that start
    # together connect together, and an overflowing accept queue resets
    # connections the client already counts as open
    request_queue_size = 1024


class ScriptedServer:
    """The server. ``zero_latency=True`` ignores every delay (benchmarks)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *,
                 zero_latency: bool = False, chunk_delay: float = 0.0,
                 model: str = "scripted"):
        self.host, self.port = host, port
        self.zero_latency = zero_latency
        self.chunk_delay = chunk_delay
        self.model = model
        self._lock = threading.Lock()
        self._requests: list[dict] = []
        self._headers: list[dict[str, str]] = []
        self._queue: deque[dict] = deque()
        self._fault_counts: dict[str, int] = {}
        self._stopping = threading.Event()
        self._conns: set[socket.socket] = set()
        self.connections = 0  # accepted so far: shows whether clients reuse them
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._ids = itertools.count(1)

    # -- public API ---------------------------------------------------------------

    @property
    def base(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.base}/v1"

    @property
    def requests(self) -> list[dict]:
        """JSON bodies of every chat request received (including failed ones)."""
        with self._lock:
            return list(self._requests)

    @property
    def request_headers(self) -> list[dict[str, str]]:
        """HTTP headers of each chat request, parallel to ``requests``."""
        with self._lock:
            return [dict(h) for h in self._headers]

    def enqueue(self, reply: dict | str) -> None:
        """Script the next reply: a str or {content, tool_calls, usage, fault,
        delay, chunk_delay, finish_reason, error, match, usage_raw}. Queued faults
        apply once (counts ignored); ``error`` is the message of a status fault
        (and the text of malformed/error-event/not-sse); ``usage_raw`` is the
        usage object as raw JSON text (numbers JSON can carry but Python
        cannot print, e.g. ``{"prompt_tokens": 1e400}``); a reply
        with ``match`` goes only to a request whose messages contain that text
        (so concurrent agents each get their own script)."""
        if isinstance(reply, str):
            reply = {"content": reply}
        unknown = set(reply) - {"content", "tool_calls", "usage", "usage_raw", "fault", "delay",
                                "chunk_delay", "finish_reason", "error", "match"}
        if unknown:
            raise ValueError(f"unknown reply keys: {sorted(unknown)}")
        parse_fault(reply.get("fault"))
        with self._lock:
            self._queue.append(dict(reply))

    def reset(self) -> None:
        """Forget requests, queued replies and fault attempt counters."""
        with self._lock:
            self._requests.clear()
            self._headers.clear()
            self._queue.clear()
            self._fault_counts.clear()

    def start(self) -> "ScriptedServer":
        server = self

        class Handler(_Handler):
            owner = server

        self._stopping.clear()
        self._httpd = _Listener((self.host, self.port), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.05},
                                        name=f"scripted-server:{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting, wake sleeping handlers and drop open connections."""
        self._stopping.set()
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(timeout=5)
        self._httpd = None

    def __enter__(self) -> "ScriptedServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- internals ---------------------------------------------------------------

    def _sleep(self, seconds: float) -> bool:
        """Sleep unless zero-latency; returns False if the server is stopping."""
        if seconds and seconds > 0 and not self.zero_latency:
            return not self._stopping.wait(seconds)
        return not self._stopping.is_set()

    def _hang(self) -> None:
        self._stopping.wait(_HANG_LIMIT)

    def _plan(self, body: dict, headers: dict[str, str]) -> dict:
        """Decide the reply for one request (records it, consumes the queue)."""
        messages = body.get("messages") or []
        last_user = next((_text(m.get("content")) for m in reversed(messages)
                          if isinstance(m, dict) and m.get("role") == "user"), "")
        with self._lock:
            self._requests.append(body)
            self._headers.append(headers)
            queued = None
            text = json.dumps(messages, ensure_ascii=False)
            for i, item in enumerate(self._queue):  # the first reply whose "match" fits
                if item.get("match") is None or item["match"] in text:
                    queued = item
                    del self._queue[i]
                    break
        prompt_tokens = sum(words(m.get("content")) for m in messages if isinstance(m, dict))
        if queued is not None:
            plan = dict(queued)
            plan.pop("match", None)
            plan["fault"] = parse_fault(plan.get("fault"))
            plan.setdefault("content", "" if plan.get("tool_calls") else f"echo: {last_user}")
        else:
            plan = self._from_directives(last_user)
        plan["prompt_tokens"] = prompt_tokens
        return plan

    def _from_directives(self, last_user: str) -> dict:
        plan: dict = {"fault": None}
        found = {k: v for k, v in _DIRECTIVE_RE.findall(last_user)}
        if "fault" in found:
            fault = parse_fault(found["fault"])
            if fault["count"] is not None:
                key = f"{found['fault']}\0{last_user}"
                with self._lock:
                    seen = self._fault_counts.get(key, 0)
                    self._fault_counts[key] = seen + 1
                if seen >= fault["count"]:
                    fault = None
            plan["fault"] = fault
        if "delay" in found:
            plan["delay"] = float(found["delay"])
        if "chunk-delay" in found:
            plan["chunk_delay"] = float(found["chunk-delay"])
        if "reply" in found:
            plan["content"] = found["reply"]
        elif "tokens" in found:
            n = int(found["tokens"])
            plan["content"] = " ".join(_WORDS[i % len(_WORDS)] for i in range(n))
        else:
            plan["content"] = "echo: " + " ".join(_DIRECTIVE_RE.sub(" ", last_user).split())
        return plan


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    owner: ScriptedServer

    def setup(self):
        super().setup()
        # small SSE writes must not wait for the peer's delayed ACK (~40 ms each)
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.owner._lock:
            self.owner._conns.add(self.connection)
            self.owner.connections += 1

    def finish(self):
        try:
            super().finish()
        finally:
            with self.owner._lock:
                self.owner._conns.discard(self.connection)

    def log_message(self, fmt, *args):  # quiet: tests read server.requests instead
        pass

    def handle_one_request(self):
        try:
            super().handle_one_request()
        except (ConnectionError, TimeoutError):  # the client went away: normal here
            self.close_connection = True

    # -- plumbing ------------------------------------------------------------------

    def _json(self, status: int, obj, headers: dict | None = None) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _endless_error(self) -> None:
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._chunk(b'{"error": {"message": "')
        block = b"x" * 65536
        try:
            while self.owner._sleep(0):
                self._chunk(block)
        except OSError:
            pass
        self._abort()

    def _abort(self) -> None:
        """End the connection mid-body (FIN without the terminating chunk), so
        the client sees data it already got, then a protocol error."""
        self.close_connection = True
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def do_GET(self):
        path = self.path.split("?")[0].rstrip("/")
        if path == "/health":
            self._json(200, {"status": "ok"})
        elif path in ("/v1/models", "/models"):
            self._json(200, {"object": "list", "data": [
                {"id": self.owner.model, "object": "model", "owned_by": "tests"}]})
        else:
            self._json(404, {"error": {"message": f"no such path {path}", "type": "not_found"}})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        path = self.path.split("?")[0].rstrip("/")
        if path not in ("/v1/chat/completions", "/chat/completions"):
            self._json(404, {"error": {"message": f"no such path {path}", "type": "not_found"}})
            return
        try:
            body = json.loads(raw or b"{}")
            if not isinstance(body, dict):
                raise ValueError("body must be an object")
        except ValueError as e:
            self._json(400, {"error": {"message": f"invalid JSON body: {e}",
                                       "type": "invalid_request_error"}})
            return
        self._reply(body, self.owner._plan(body, dict(self.headers.items())))

    # -- replies ------------------------------------------------------------------

    def _reply(self, body: dict, plan: dict) -> None:
        srv = self.owner
        if not srv._sleep(plan.get("delay", 0)):
            return self._abort()
        fault = plan.get("fault")
        kind = fault["kind"] if fault else None
        if kind == "timeout":
            srv._hang()
            return self._abort()
        if kind == "endless-error":
            return self._endless_error()
        if kind and kind.isdigit():
            status = int(kind)
            headers = {"Retry-After": fault["retry_after"]} if fault["retry_after"] else {}
            return self._json(status, {"error": {
                "message": plan.get("error") or f"scripted fault {status}",
                "type": "scripted_fault",
                "code": status}}, headers)

        content = plan.get("content") or ""
        pieces = _pieces(content)
        finish = plan.get("finish_reason")
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        if isinstance(max_tokens, int) and max_tokens >= 0 and len(pieces) > max_tokens:
            pieces = pieces[:max_tokens]
            content = "".join(pieces)
            finish = finish or "length"
        calls = [self._norm_call(i, c) for i, c in enumerate(plan.get("tool_calls") or [])]
        finish = finish or ("tool_calls" if calls else "stop")
        usage = {"prompt_tokens": plan["prompt_tokens"],
                 "completion_tokens": words(content) + sum(
                     words(c["function"]["name"]) + words(c["function"]["arguments"]) for c in calls)}
        usage.update(plan.get("usage") or {})
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        model = body.get("model") or srv.model
        cid = f"chatcmpl-scripted-{next(srv._ids)}"
        if kind == "not-sse":
            note = " ".join(str(plan.get("error") or "not an event stream").split())
            data = f"<html>{note}</html>".encode()
            self.send_response(200)
            self.send_header("Content-Type", f"text/html; note={note}")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return

        if not body.get("stream"):
            if kind == "malformed":
                data = b'{"id": "broken", "choices": [ this is not json'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            if kind == "disconnect":
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "1000")
                self.end_headers()
                self.wfile.write(b'{"id": "')
                return self._abort()
            msg: dict = {"role": "assistant", "content": content if content or not calls else None}
            if calls:
                msg["tool_calls"] = calls
            return self._json(200, {
                "id": cid, "object": "chat.completion", "created": int(time.time()),
                "model": model, "choices": [{"index": 0, "message": msg,
                                             "finish_reason": finish}],
                "usage": usage})
        self._stream(cid, model, pieces, calls, finish, usage, kind, plan)

    @staticmethod
    def _norm_call(i: int, call: dict) -> dict:
        fn = dict(call.get("function") or {})
        args = fn.get("arguments", "")
        fn["arguments"] = args if isinstance(args, str) else json.dumps(args)
        fn.setdefault("name", "")
        return {"id": call.get("id") or f"call_{i}", "type": "function", "function": fn}

    def _stream(self, cid, model, pieces, calls, finish, usage, kind, plan) -> None:
        srv = self.owner
        chunk_delay = plan.get("chunk_delay", srv.chunk_delay)
        batch = srv.zero_latency  # one write for the whole body: fewest syscalls
        out: list[bytes] = []
        created = int(time.time())

        def event(delta=None, finish_reason=None, usage_obj=None, choices=True) -> bytes:
            obj = {"id": cid, "object": "chat.completion.chunk", "created": created,
                   "model": model,
                   "choices": [{"index": 0, "delta": delta or {},
                                "finish_reason": finish_reason}] if choices else []}
            if usage_obj is not None:
                obj["usage"] = usage_obj
            data = json.dumps(obj)
            if usage_obj is not None and plan.get("usage_raw"):
                data = data[:-1] + ', "usage": ' + plan["usage_raw"] + "}"
            return b"data: " + data.encode() + b"\n\n"

        def send(data: bytes, delay: float = 0.0) -> bool:
            if batch:
                out.append(data)
                return True
            if not srv._sleep(delay):
                return False
            self._chunk(data)
            return True

        if kind in ("endless", "endless-line"):
            batch = False  # an endless body cannot be gathered first
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if not batch:
            self.wfile.flush()
        if kind == "malformed" and plan.get("error"):
            send(b"data: {" + " ".join(str(plan["error"]).split()).encode() + b"\n\n")
            return self._finish_body(batch, out)
        if kind == "error-event":
            send(b"data: " + json.dumps({"error": {"message": plan.get("error") or "scripted",
                                                   "type": "scripted_fault"}}).encode() + b"\n\n")
            return self._finish_body(batch, out)
        if kind == "endless-line":
            ok = send(b"data: ")
            while ok:
                ok = send(b"a" * 4096)
            return self._abort()
        ok = send(event({"role": "assistant", "content": ""}))
        if kind == "endless":
            piece = " ".join(_WORDS)
            piece = (piece + " ") * (1024 // (len(piece) + 1))
            while ok:
                ok = send(event({"content": piece}), chunk_delay)
            return self._abort()
        if kind == "malformed":
            ok = ok and send(b"data: {\"choices\": [{\"delta\": {\"content\": \"oops\"\n\n")
        cut = max(1, len(pieces) // 2) if kind == "disconnect" else None
        for i, piece in enumerate(pieces):
            if not ok or (cut is not None and i >= cut):
                break
            ok = send(event({"content": piece}), chunk_delay if i else 0.0)
        if kind == "disconnect" or not ok:
            if batch and out:
                self._chunk(b"".join(out))
            return self._abort()
        for i, call in enumerate(calls):
            fn = call["function"]
            ok = ok and send(event({"tool_calls": [{
                "index": i, "id": call["id"], "type": "function",
                "function": {"name": fn["name"], "arguments": ""}}]}), chunk_delay)
            args = fn["arguments"]
            for j in range(0, len(args), 16):
                ok = ok and send(event({"tool_calls": [{
                    "index": i, "function": {"arguments": args[j:j + 16]}}]}), chunk_delay)
        ok = ok and send(event({}, finish_reason=finish))
        ok = ok and send(event(usage_obj=usage, choices=False))
        ok = ok and send(b"data: [DONE]\n\n")
        if not ok:
            return self._abort()
        self._finish_body(batch, out)

    def _finish_body(self, batch: bool, out: list[bytes]) -> None:
        try:
            if batch and out:
                self._chunk(b"".join(out))
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            self.close_connection = True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.scripted_server",
                                 description="Scripted OpenAI-compatible server.",
                                 epilog="Directives (in the last user message):\n" + DIRECTIVES,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--zero-latency", action="store_true", help="ignore every delay")
    ap.add_argument("--chunk-delay", type=float, default=0.0,
                    help="default seconds between streamed words (e.g. 0.01 ≈ 100 tok/s)")
    args = ap.parse_args(argv)
    srv = ScriptedServer(args.host, args.port, zero_latency=args.zero_latency,
                         chunk_delay=args.chunk_delay).start()
    print(f"listening on {srv.url}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
