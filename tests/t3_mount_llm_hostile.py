"""A hostile model server against a real mount: replies that never end, keys
quoted back, absurd usage. The daemon must stay small and answering, end the
process with the documented code, and never store or print a secret."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time

import psutil
import pytest

from tests.mountutil import needs_fuse, rnixfs, scripted_providers, sh, wait_for

pytestmark = [needs_fuse, pytest.mark.mount]

MiB = 1024 * 1024
KEY = "sk-hostile-test-key-8d1f4c2a9b7e"
USER, PASSWORD = "proxyuser", "pr0xy-pa55word-71c3"


def rss(pid: int) -> int:
    """The daemon's RSS with its worker processes' (agent loops, and so the
    replies they read, live in the workers: docs/architecture.md)."""
    daemon = psutil.Process(pid)
    total = daemon.memory_info().rss
    for child in daemon.children():
        try:
            if "rnixfs.worker" in child.cmdline():
                total += child.memory_info().rss
        except psutil.Error:
            pass
    return total


def settled(m) -> int:
    """Every worker process has started (their RSS is part of the baseline)."""
    info = json.loads(os.getxattr(m.path, "user.rnixfs.daemon"))["workers"]
    wait_for(lambda: json.loads(os.getxattr(m.path, "user.rnixfs.daemon"))["workers"].get("ready", 0)
             == info["workers"], 60, what="the workers to start")
    return rss(m.daemon_pid)


def stat_answers(m, within: float = 5.0) -> bool:
    res = subprocess.run(["stat", "-c", "%i", str(m.path)], capture_output=True, timeout=within)
    return res.returncode == 0


def finished(m, pid):
    st = m.status(pid)
    return st if st["state"] in ("zombie", "dead") else None


def test_endless_reply_is_capped_with_its_exit_code(mount_factory, scripted_server):
    """Default caps: an endless stream ends the step with exit 20 (reply too
    large), the daemon stays small and answers throughout."""
    m = mount_factory(scripted_providers(scripted_server.url))
    base = settled(m)
    pid = m.spawn("[[fault:endless]] talk forever")
    peak = base
    deadline = time.monotonic() + 120
    while not finished(m, pid):
        assert time.monotonic() < deadline, "the endless reply was never cut"
        peak = max(peak, rss(m.daemon_pid))
        assert stat_answers(m)
        time.sleep(0.05)
    st = m.status(pid)
    assert st["exit_code"] == 20, st
    assert st["error"]["code"] == "TOO_BIG" and "max_reply_bytes" in st["error"]["cause"]
    assert peak < 512 * MiB, f"daemon RSS peaked at {peak // MiB} MiB"
    assert "-1 [TOO_BIG]" in open(m.p(f"proc/{pid}/trace")).read()
    assert m.daemon_alive()


def test_endless_reply_under_a_high_cap_is_killable_and_memory_comes_back(
        mount_factory, scripted_server):
    """With a cap too high to reach, the stream runs: RSS stays bounded by
    the cap, the mount answers `stat`, and after kill RSS returns near its
    baseline (the reply's buffers are dropped)."""
    m = mount_factory(scripted_providers(scripted_server.url, max_reply_bytes=2048 * MiB))
    base = settled(m)
    pid = m.spawn("[[fault:endless]] talk forever")
    deadline = time.monotonic() + 120
    while rss(m.daemon_pid) < base + 96 * MiB:  # the reply is really piling up
        assert time.monotonic() < deadline, "the stream never grew the daemon"
        assert stat_answers(m)
        assert m.status(pid)["state"] == "running"
        time.sleep(0.05)
    assert rss(m.daemon_pid) < 512 * MiB
    t0 = time.monotonic()
    sh(f'echo kill > "{m.p(f"proc/{pid}/ctl")}"', check=True, timeout=10)
    wait_for(lambda: finished(m, pid), 10, what="the kill")
    assert time.monotonic() - t0 < 10
    assert m.status(pid)["exit_code"] == 137
    wait_for(lambda: rss(m.daemon_pid) < base + 48 * MiB, 20,
             what=f"RSS back near its baseline of {base // MiB} MiB")
    assert stat_answers(m) and m.daemon_alive()


def test_wall_clock_cap_beside_the_heartbeat(mount_factory, scripted_server):
    """Chunks that arrive steadily renew step_timeout; max_reply_time still
    ends the step (exit 124, as any timeout)."""
    m = mount_factory(scripted_providers(scripted_server.url, max_reply_time=2))
    pid = m.spawn("[[fault:endless]] [[chunk-delay:0.05]] slow but endless")
    st = wait_for(lambda: finished(m, pid), 60, what="the wall-clock cap")
    assert st["exit_code"] == 124, st
    assert "max_reply_time" in st["error"]["cause"]


@pytest.mark.expect_log('rnixfs\\.devices\\.llm\\.conversation')
def test_dev_llm_endless_reply_ends_with_efbig(mount_factory, scripted_server):
    m = mount_factory(scripted_providers(scripted_server.url, max_reply_bytes=MiB))
    res = sh(f'exec 3<>"{m.p("dev/llm/scripted")}"; echo "[[fault:endless]] go" >&3; '
             'cat <&3 | wc -c', timeout=60)
    assert "File too large" in res.stderr
    got = int(res.stdout.split()[-1])
    assert 0 < got <= MiB
    assert m.daemon_alive() and stat_answers(m)


@pytest.mark.parametrize("usage", ['{"prompt_tokens": 1e400, "completion_tokens": 1}',
                                   '{"prompt_tokens": -1000000000, "completion_tokens": 1}',
                                   '{"prompt_tokens": "12", "completion_tokens": 1}'])
def test_absurd_usage_is_a_driver_error_and_fallback_applies(mount_factory, scripted_server, usage):
    yaml = scripted_providers(scripted_server.url, max_retries=0)
    yaml += ("  backup:\n    type: openai\n"
             f"    base_url: {scripted_server.url}\n    model: backup-model\n")
    m = mount_factory(yaml)
    agent = m.project / ".rnix/agents/counter"
    agent.mkdir(parents=True)
    (agent / "agent.yaml").write_text("name: counter\ndescription: falls back\n"
                                      "models:\n  provider: scripted\n  fallback_provider: backup\n")
    (agent / "instructions.md").write_text("Count.\n")
    scripted_server.enqueue({"content": "counted wrong", "usage_raw": usage})
    scripted_server.enqueue({"content": "counted right"})
    pid = m.spawn(json.dumps({"intent": "count", "agent": "counter", "max_tokens": 1000}))
    st = wait_for(lambda: finished(m, pid), 60, what="the process to end")
    assert st["exit_code"] == 0, st
    trace = open(m.p(f"proc/{pid}/trace")).read()
    assert "Fallback" in trace and "invalid usage" in trace
    assert 0 < st["tokens"]["in"] + st["tokens"]["out"] < 1000
    assert st["provider"] == "scripted" and st["fallback_provider"] == "backup"
    # without a fallback: a driver error (exit 1), never an internal one
    scripted_server.enqueue({"content": "counted wrong", "usage_raw": usage})
    pid = m.spawn("count again")
    st = wait_for(lambda: finished(m, pid), 60, what="the process to end")
    assert st["exit_code"] == 1 and st["error"]["code"] == "DRIVER", st


def _everything(m, pids) -> str:
    """Every place a secret could land, as one text."""
    out = []
    for pid in pids:
        for name in ("trace", "events", "status", "context"):
            out.append(open(m.p(f"proc/{pid}/{name}"), errors="replace").read())
    out.append(rnixfs("status", str(m.path)).stdout)
    out.append(rnixfs("status", str(m.path), "--json").stdout)
    out.append(sh(f'getfattr -d -m - "{m.path}" 2>&1').stdout)
    out.append(os.getxattr(m.path, "user.rnixfs.daemon").decode())
    return "\n".join(out)


def _stored_and_logged(m) -> bytes:
    data = b""
    for f in sorted(m.state_dir.iterdir()):
        if f.is_file():
            data += f.read_bytes()
    return data


@pytest.mark.expect_log('rnixfs\\.devices\\.llm\\.conversation')
def test_key_quoted_by_the_server_is_never_kept(mount_factory, scripted_server, monkeypatch):
    """Error event, malformed first event, non-SSE content type, a 401 body,
    the reply itself: the key appears in no trace, event, status, store
    byte, daemon.log line or xattr. Credentials in base_url neither."""
    monkeypatch.setenv("RNIXFS_HOSTILE_KEY", KEY)
    monkeypatch.setenv("RNIXFS_PROXY_PASSWORD", PASSWORD)
    host = scripted_server.url.split("://", 1)[1]
    yaml = scripted_providers(f"http://{USER}:${{RNIXFS_PROXY_PASSWORD}}@{host}", max_retries=0,
                              api_key="${RNIXFS_HOSTILE_KEY}")
    m = mount_factory(yaml)
    quoted = f"invalid key {KEY} for {USER}:{PASSWORD}"
    pids = []
    for fault in ("error-event", "malformed", "not-sse", 401, 500):
        scripted_server.enqueue({"fault": fault, "error": quoted})
        pid = m.spawn(f"leak via {fault}")
        st = wait_for(lambda: finished(m, pid), 60, what=f"the {fault} process to end")
        assert st["exit_code"] == 1 and st["error"]["code"] == "DRIVER", st
        assert "***" in st["error"]["cause"], st  # the reason is kept, the key is not
        pids.append(pid)
    # the key quoted in a streamed reply, split across words, and in a tool call
    scripted_server.enqueue({"tool_calls": [{"id": "c1", "function": {
        "name": "Glob", "arguments": {"pattern": f"{KEY}*"}}}]})
    scripted_server.enqueue({"content": f"your key is {KEY[:7]} {KEY} and {PASSWORD} ok"})
    pid = m.spawn("echo my key back")
    assert wait_for(lambda: finished(m, pid), 60)["exit_code"] == 0
    pids.append(pid)
    text = _everything(m, pids)
    assert "***" in text
    for secret in (KEY, PASSWORD):
        assert secret not in text
    # a connect error names the URL: no credentials in it either
    scripted_server.stop()
    pid = m.spawn("nobody home")
    st = wait_for(lambda: finished(m, pid), 60, what="the connect error")
    assert st["exit_code"] == 1 and "***@" in st["error"]["cause"], st
    pids.append(pid)
    text = _everything(m, pids)
    res = sh(f'exec 3<>"{m.p("dev/llm/scripted")}"; echo hi >&3; cat <&3', timeout=60)
    assert res.returncode != 0
    rnixfs("umount", str(m.path))
    blob = _stored_and_logged(m)
    assert blob, "the store and the log should exist"
    for secret in (KEY, PASSWORD):
        assert secret not in text and secret not in res.stderr
        assert secret.encode() not in blob
    db = sqlite3.connect(m.state_dir / "rnixfs.db")
    try:
        dump = "\n".join(db.iterdump())
    finally:
        db.close()
    assert KEY not in dump and PASSWORD not in dump
    assert "***" in (m.state_dir / "daemon.log").read_text()


def test_endless_error_body_is_not_buffered(mount_factory, scripted_server):
    """An HTTP error whose body never ends: only its first bytes are read for
    the reason, the daemon stays small and answering, the process ends as a
    driver error."""
    m = mount_factory(scripted_providers(scripted_server.url, max_retries=0))
    base = rss(m.daemon_pid)
    pid = m.spawn("[[fault:endless-error]] fail forever")
    peak = base
    deadline = time.monotonic() + 120
    while not finished(m, pid):
        assert time.monotonic() < deadline, "the endless error body was never cut"
        peak = max(peak, rss(m.daemon_pid))
        assert peak < 512 * MiB, f"daemon RSS reached {peak // MiB} MiB"
        assert stat_answers(m)
        time.sleep(0.05)
    st = m.status(pid)
    assert st["exit_code"] == 1 and st["error"]["code"] == "DRIVER", st
    assert "HTTP 400" in st["error"]["cause"], st
    assert m.daemon_alive()


@pytest.mark.parametrize("fault", ["error-event", "malformed", "not-sse", 401])
@pytest.mark.parametrize("pad", [60, 190])
def test_a_key_cut_by_the_length_limit_is_not_kept_in_part(mount_factory, scripted_server,
                                                           monkeypatch, fault, pad):
    """Error texts are shortened; a key the cut falls inside must not leave
    its first characters behind (redact first, then shorten)."""
    monkeypatch.setenv("RNIXFS_HOSTILE_KEY", KEY)
    m = mount_factory(scripted_providers(scripted_server.url, max_retries=0,
                                         api_key="${RNIXFS_HOSTILE_KEY}"))
    scripted_server.enqueue({"fault": fault, "error": "x" * pad + " " + KEY + " tail"})
    pid = m.spawn("leak a part")
    st = wait_for(lambda: finished(m, pid), 60, what="the process to end")
    assert st["exit_code"] == 1 and st["error"]["code"] == "DRIVER", st
    text = _everything(m, [pid]) + m.log()
    assert KEY[:8] not in text, st["error"]["cause"]
