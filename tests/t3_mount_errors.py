"""Tier 3: bad input on every writable file of a real mount (README.md, "proc/new").

For each bad write: the exact errno (read by a small Python program doing one
os.write(), and the strerror text bash prints), the reason in words (read back
on the same proc/new handle, and in the daemon log), the daemon still up, and
nothing half spawned (`ls proc` unchanged).
"""
from __future__ import annotations

import base64
import errno
import json
import os
import re
import subprocess
import sys

import pytest

from tests.mountutil import Mount, hanging_process, needs_fuse, served_mount, sh, wait_for

pytestmark = [needs_fuse, pytest.mark.mount]

CAP = 64 * 1024
HANG = json.dumps({"intent": "[[delay:60]] hang", "step_timeout": 0})
TRACE_RE = re.compile(r"^\[\s*\d+\.\d{3}s\] [A-Z][A-Za-z]*\(.*\) = .*$")

# One open(), then a list of steps on that one descriptor, each a single
# syscall: {"write": base64} or {"read": true} (read to EOF). Prints, as JSON,
# the errno of the open and of every step (0 = success) and what was read.
PROBE = r"""
import base64, json, os, sys
path, mode = sys.argv[1], sys.argv[2]
steps = json.loads(sys.stdin.read())
flags = {"rw": os.O_RDWR, "w": os.O_WRONLY | os.O_TRUNC, "a": os.O_WRONLY | os.O_APPEND,
         "r": os.O_RDONLY}[mode]
out = {"open": 0, "steps": []}
try:
    fd = os.open(path, flags)
except OSError as e:
    out["open"] = e.errno
    print(json.dumps(out)); sys.exit()
for step in steps:
    try:
        if "write" in step:
            n = os.write(fd, base64.b64decode(step["write"]))
            out["steps"].append({"errno": 0, "n": n})
        else:
            buf = b""
            while True:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                buf += chunk
            out["steps"].append({"errno": 0, "data": buf.decode("utf-8", "replace")})
    except OSError as e:
        out["steps"].append({"errno": e.errno})
os.close(fd)
print(json.dumps(out))
"""


def probe(path: str, mode: str, *steps: bytes | None, timeout: float = 60) -> dict:
    """steps: bytes to write, or None to read to EOF."""
    plan = [{"read": True} if s is None else {"write": base64.b64encode(s).decode()} for s in steps]
    res = subprocess.run([sys.executable, "-c", PROBE, path, mode], input=json.dumps(plan),
                         capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def spawn_attempt(m: Mount, data: bytes) -> tuple[int, str]:
    """One write on a fresh proc/new handle, then read the handle back."""
    out = probe(m.p("proc/new"), "rw", data, None)
    assert out["open"] == 0
    return out["steps"][0]["errno"], out["steps"][1]["data"]


def run(m: Mount, script: str, env: dict | None = None, timeout: float = 60):
    return sh(script, env={**os.environ, "M": str(m.path), **(env or {})}, timeout=timeout)


def ls_proc(m: Mount) -> set[str]:
    return set(os.listdir(m.p("proc")))


def in_log(m: Mount, text: str) -> bool:
    return wait_for(lambda: text in m.log(), 10, what=f"{text!r} in daemon.log")


@pytest.fixture(scope="module")
def mnt(tmp_path_factory):
    """One mount for the module; overrides conftest's per-test `mnt` (each test
    compares `ls proc` before and after itself)."""
    tmp = tmp_path_factory.mktemp("errors")
    (tmp / "project" / "sub").mkdir(parents=True)
    with served_mount(tmp) as m:
        yield m


@pytest.fixture
def hang(mnt):
    """A running process (a step that does not end by itself); killed after."""
    with hanging_process(mnt, HANG) as pid:
        yield pid


# ---------------------------------------------------------------------- proc/new

def j(obj) -> bytes:
    return json.dumps(obj).encode()


BAD_REQUESTS = [
    # id, bytes, errno, reason (substring of the read-back/log line)
    ("malformed-json", b'{"intent": x}', errno.EINVAL, "bad JSON"),
    ("json-trailing-garbage", b'{"intent": "x"} trailing', errno.EINVAL, "bad JSON"),
    ("json-no-intent", j({"agent": "default"}), errno.EINVAL, 'JSON request has no "intent"'),
    ("unknown-option", j({"intent": "x", "colour": "red"}), errno.EINVAL, "unknown option 'colour'"),
    ("unknown-option-yaml", b"intent: x\ncolour: red\n", errno.EINVAL, "unknown option 'colour'"),
    ("intent-not-text", j({"intent": ["a", "b"]}), errno.EINVAL, "intent must be non-empty text"),
    ("intent-empty", j({"intent": "   "}), errno.EINVAL, "intent must be non-empty text"),
    ("max-steps-text", j({"intent": "x", "max_steps": "ten"}), errno.EINVAL, "max_steps must be a whole number"),
    ("max-steps-zero", j({"intent": "x", "max_steps": 0}), errno.EINVAL, "max_steps must be a whole number"),
    ("max-steps-bool", j({"intent": "x", "max_steps": True}), errno.EINVAL, "max_steps must be a whole number"),
    ("max-steps-float", j({"intent": "x", "max_steps": 1.5}), errno.EINVAL, "max_steps must be a whole number"),
    ("max-tokens-negative", j({"intent": "x", "max_tokens": -5}), errno.EINVAL, "max_tokens must be a whole number"),
    ("max-cost-text", j({"intent": "x", "max_cost": "cheap"}), errno.EINVAL, "max_cost must be a number"),
    ("max-cost-negative", j({"intent": "x", "max_cost": -1}), errno.EINVAL, "max_cost must be a number"),
    ("step-timeout-word", j({"intent": "x", "step_timeout": "soon"}), errno.EINVAL,
     "step_timeout must be a duration"),
    ("step-timeout-negative", j({"intent": "x", "step_timeout": -1}), errno.EINVAL,
     "step_timeout must be between 0 and 7 days"),
    ("skills-number", j({"intent": "x", "skills": 5}), errno.EINVAL, "skills must be a list"),
    ("skill-path", j({"intent": "x", "skills": ["../x"]}), errno.EINVAL, "skill must be a name"),
    ("env-list", j({"intent": "x", "env": ["A=1"]}), errno.EINVAL, "env must be a mapping"),
    ("env-bad-name", j({"intent": "x", "env": {"1A": "x"}}), errno.EINVAL, "is not a valid variable name"),
    ("env-bad-value", j({"intent": "x", "env": {"A": [1]}}), errno.EINVAL, "env value of A must be text"),
    ("agent-path", j({"intent": "x", "agent": "../../etc"}), errno.EINVAL, "agent must be a name"),
    ("provider-number", j({"intent": "x", "provider": 5}), errno.EINVAL, "provider must be a name"),
    ("model-empty", j({"intent": "x", "model": ""}), errno.EINVAL, "model must be a non-empty name"),
    ("cwd-outside", j({"intent": "x", "cwd": "../.."}), errno.EACCES, "is outside the project"),
    ("cwd-absolute", j({"intent": "x", "cwd": "/etc"}), errno.EACCES, "is outside the project"),
    ("cwd-missing", j({"intent": "x", "cwd": "no/such/dir"}), errno.ENOENT, "is not a directory"),
    ("unknown-agent", j({"intent": "x", "agent": "nope"}), errno.ENOENT, 'agent "nope" not found'),
    ("unknown-provider", j({"intent": "x", "provider": "nope"}), errno.ENOENT, 'provider "nope" not found'),
    ("unknown-skill", j({"intent": "x", "skills": ["nope"]}), errno.ENOENT, 'skill "nope" not found'),
    ("unknown-agent-yaml", b"intent: x\nagent: nope\n", errno.ENOENT, 'agent "nope" not found'),
    ("oversized", b"a" * 70000, errno.EFBIG, f"request is 70000 bytes; the cap is {CAP}"),
    ("one-over-cap", b"a" * (CAP + 1), errno.EFBIG, f"the cap is {CAP}"),
    ("non-utf8", b"\xff\xfe hello \xc3\x28", errno.EINVAL, "request is not UTF-8"),
    ("nul-byte", b"hello\x00world", errno.EINVAL, "request contains a NUL byte"),
    ("whitespace-only", b"   \n\t \n", errno.EINVAL, "empty request"),
    ("newline-only", b"\n", errno.EINVAL, "empty request"),
]


@pytest.mark.parametrize("data,err,reason", [c[1:] for c in BAD_REQUESTS], ids=[c[0] for c in BAD_REQUESTS])
def test_bad_spawn_request(mnt, data, err, reason):
    before = ls_proc(mnt)
    got, readback = spawn_attempt(mnt, data)
    assert errno.errorcode.get(got) == errno.errorcode[err], readback
    lines = readback.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), readback
    assert reason in lines[0]
    assert "\n" not in lines[0] and len(lines[0]) < 400
    in_log(mnt, reason)
    assert mnt.daemon_alive()
    assert ls_proc(mnt) == before, "a bad request must spawn nothing"


SHELL_CASES = [
    ("bogus-json", '{"intent": x}', errno.EINVAL),
    ("unknown-agent", '{"agent": "nope", "intent": "x"}', errno.ENOENT),
    ("cwd-outside", '{"intent": "x", "cwd": "../../.."}', errno.EACCES),
    ("empty", "", errno.EINVAL),  # echo writes just "\n"
]


@pytest.mark.parametrize("req,err", [c[1:] for c in SHELL_CASES], ids=[c[0] for c in SHELL_CASES])
def test_echo_prints_the_errno_text(mnt, req, err):
    before = ls_proc(mnt)
    res = run(mnt, 'echo "$REQ" > "$M/proc/new"', env={"REQ": req})
    assert res.returncode != 0
    assert f"write error: {os.strerror(err)}" in res.stderr
    assert ls_proc(mnt) == before


def test_echo_to_proc_new_reads_back_the_reason(mnt):
    res = run(mnt, '''exec 3<>"$M/proc/new"
        echo '{"agent":"nope","intent":"x"}' >&3 || echo "rc=$?"
        cat <&3''')
    assert res.stdout == 'rc=1\nerror: agent "nope" not found\n'
    assert "No such file or directory" in res.stderr


def test_file_too_large_from_cat(mnt, tmp_path):
    big = tmp_path / "big"
    big.write_bytes(b"a" * 70000)
    before = ls_proc(mnt)
    res = run(mnt, f'cat "{big}" > "$M/proc/new"')
    assert res.returncode != 0 and "File too large" in res.stderr
    assert ls_proc(mnt) == before
    assert mnt.daemon_alive()


def test_empty_write_spawns_nothing(mnt):
    before = ls_proc(mnt)
    out = probe(mnt.p("proc/new"), "rw", b"", None)
    assert out["steps"] == [{"errno": 0, "n": 0}, {"errno": 0, "data": ""}]
    assert run(mnt, 'printf "" > "$M/proc/new"').returncode == 0
    assert run(mnt, ': > "$M/proc/new"').returncode == 0
    assert ls_proc(mnt) == before


def test_exactly_the_cap_is_accepted(mnt):
    before = ls_proc(mnt)
    got, readback = spawn_attempt(mnt, b"b" * CAP)
    assert got == 0, readback
    pid = int(readback)
    assert ls_proc(mnt) == before | {str(pid)}
    assert (mnt.path / "proc" / str(pid) / "intent").read_bytes() == b"b" * CAP + b"\n"
    mnt.wait(pid)


def test_bad_then_good_on_one_handle(mnt):
    out = probe(mnt.p("proc/new"), "rw", b'{"intent": 1}', b"good one", b"\xff", b"another", None)
    errs = [s["errno"] for s in out["steps"][:4]]
    assert errs == [errno.EINVAL, 0, errno.EINVAL, 0]
    lines = out["steps"][4]["data"].splitlines()
    assert lines[0].startswith("error: intent must be non-empty text")
    assert lines[2].startswith("error: request is not UTF-8")
    a, b = int(lines[1]), int(lines[3])
    assert b > a
    assert mnt.status(a)["intent"] == "good one" and mnt.status(b)["intent"] == "another"


# ------------------------------------------------------------- hostile strings

HOSTILE = [
    ("shell-metachars", "$(touch {marker}); `touch {marker}` | rm -rf / ; && || > < * ? ~ \"q\" 'q' \\ ${HOME}"),
    ("path-traversal", "../../../../etc/passwd"),
    ("control-chars", "bell\x07 esc\x1b[31mred\x1b[0m tab\tin\tmiddle \x01\x02\x7f end"),
    ("unicode", "naïve café 日本語 🚀 right-to-left \u202e override \u200b zero-width"),
    ("broken-yaml", "key: value: broken: [ { ]"),
    ("yaml-list", "- a\n- b\n- c"),
    ("multi-line", "line one\nline two\n\nline four"),
    ("json-array", '["not", "an", "object"]'),
    ("looks-like-ctl", "kill\nreap"),
]


@pytest.mark.parametrize("template", [h[1] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_hostile_intent_round_trips(mnt, tmp_path, template):
    marker = tmp_path / "pwned"
    intent = template.replace("{marker}", str(marker))
    before = ls_proc(mnt)
    got, readback = spawn_attempt(mnt, intent.encode())
    assert got == 0, readback
    pid = int(readback)
    assert ls_proc(mnt) == before | {str(pid)}
    assert (mnt.path / "proc" / str(pid) / "intent").read_text() == intent + "\n"
    assert mnt.status(pid)["intent"] == intent
    mnt.wait(pid)
    assert not marker.exists(), "the intent was run by a shell"
    # the trace stays one strace line per event, whatever the intent holds
    trace = (mnt.path / "proc" / str(pid) / "trace").read_text()
    assert "\x1b" not in trace and "\x07" not in trace
    for line in trace.splitlines():
        assert TRACE_RE.match(line), line
    events = [json.loads(x) for x in (mnt.path / "proc" / str(pid) / "events").read_text().splitlines()]
    assert [e["syscall"] for e in events][0] == "Spawn" and events[-1]["syscall"] == "Exit"
    assert events[-1]["result"] == "?" and "Exit(0)" in trace.splitlines()[-1]
    assert mnt.daemon_alive()


def test_long_intent_round_trips_through_cat(mnt, tmp_path):
    intent = "".join(chr(ord("a") + i % 26) for i in range(10_000))
    src = tmp_path / "intent.txt"
    src.write_text(intent + "\n")
    before = ls_proc(mnt)
    res = run(mnt, f'exec 3<>"$M/proc/new"; cat "{src}" >&3; read -r pid <&3; echo "$pid"')
    assert res.returncode == 0, res.stderr
    pid = int(res.stdout)
    assert ls_proc(mnt) == before | {str(pid)}
    assert run(mnt, f'cat "$M/proc/{pid}/intent"').stdout == intent + "\n"
    assert mnt.status(pid)["intent"] == intent


# The shell's own echo/printf flush stdout at every newline and every 4 KiB, so
# one `echo` can be several write()s: proc/new reassembles them (see framing()).


def test_multi_line_json_through_echo(mnt):
    before = ls_proc(mnt)
    res = run(mnt, """echo '{
  "intent": "multi line",
  "max_steps": 2
}' > "$M/proc/new" """)
    assert res.returncode == 0, res.stderr
    new = ls_proc(mnt) - before
    assert len(new) == 1
    st = mnt.status(int(new.pop()))
    assert st["intent"] == "multi line" and st["budget"]["max_steps"] == 2


@pytest.mark.expect_log('rnixfs\\.devices\\.llm\\.conversation', 'stamina.retry_scheduled')
def test_unfinished_json_fails_at_close_and_reads_back(mnt):
    before = ls_proc(mnt)
    out = probe(mnt.p("proc/new"), "rw", b'{"intent": "never closed",', None)
    assert out["steps"][0]["errno"] == 0  # more may come ...
    assert out["steps"][1]["data"].startswith("error: bad JSON")  # ... until the handle is read
    # close() reports it (coreutils checks close; bash's builtins do not)
    res = run(mnt, """env printf '{"intent": ' > "$M/proc/new" """)
    assert res.returncode != 0 and "Invalid argument" in res.stderr
    assert ls_proc(mnt) == before and mnt.daemon_alive()


def test_long_intent_round_trips_through_echo(mnt):
    intent = "x" * 10_000
    before = ls_proc(mnt)
    res = run(mnt, 'echo "$REQ" > "$M/proc/new"', env={"REQ": intent})
    assert res.returncode == 0, res.stderr
    new = ls_proc(mnt) - before
    assert len(new) == 1, f"one echo spawned {len(new)} processes"
    assert mnt.status(int(new.pop()))["intent"] == intent


def test_multi_line_yaml_request_through_echo(mnt):
    before = ls_proc(mnt)
    res = run(mnt, 'echo "intent: summarize\nmax_steps: 3" > "$M/proc/new"')
    assert res.returncode == 0, res.stderr
    new = ls_proc(mnt) - before
    assert len(new) == 1, f"one echo spawned {len(new)} processes"
    st = mnt.status(int(new.pop()))
    assert st["intent"] == "summarize" and st["budget"]["max_steps"] == 3


def test_oversized_request_through_a_pipe_is_refused(mnt):
    before = ls_proc(mnt)
    res = run(mnt, """head -c 70000 /dev/zero | tr '\\0' a > "$M/proc/new" """)
    new = ls_proc(mnt) - before
    assert res.returncode != 0 and "File too large" in res.stderr and not new, \
        f"{len(new)} processes spawned from one oversized request"


# ---------------------------------------------------------------------------- ctl

BAD_CTL = [
    ("unknown", b"bogus\n", "unknown command 'bogus'"),
    ("upper-case", b"TERM\n", "unknown command 'TERM'"),
    ("two-commands", b"term kill\n", "unknown command 'term kill'"),
    ("empty", b"\n", "unknown command ''"),
    ("non-utf8", b"\xff\xfe\n", "command is not UTF-8"),
    ("nul", b"term\x00\n", "unknown command"),
]


@pytest.mark.parametrize("data,reason", [c[1:] for c in BAD_CTL], ids=[c[0] for c in BAD_CTL])
def test_bad_ctl_command_is_einval(mnt, hang, data, reason):
    before = ls_proc(mnt)
    out = probe(mnt.p(f"proc/{hang}/ctl"), "w", data)
    assert out["open"] == 0
    assert out["steps"][0]["errno"] == errno.EINVAL
    in_log(mnt, reason)
    st = mnt.status(hang)
    assert st["state"] == "running" and st["paused"] is False
    assert mnt.daemon_alive()
    assert ls_proc(mnt) == before


def test_bad_ctl_from_echo(mnt, hang):
    res = run(mnt, f'echo bogus > "$M/proc/{hang}/ctl"')
    assert res.returncode != 0 and "write error: Invalid argument" in res.stderr
    assert mnt.status(hang)["state"] == "running"


def test_oversized_ctl_is_refused(mnt, hang):
    out = probe(mnt.p(f"proc/{hang}/ctl"), "w", b"k" * 70000)
    assert out["steps"][0]["errno"] in (errno.EINVAL, errno.EFBIG)
    assert mnt.status(hang)["state"] == "running"
    assert mnt.daemon_alive()


def test_ctl_after_exit_is_esrch_and_after_reap_enoent(mnt):
    pid = mnt.spawn("done soon")
    mnt.wait(pid)
    for cmd in (b"term", b"kill", b"pause", b"resume"):
        out = probe(mnt.p(f"proc/{pid}/ctl"), "w", cmd + b"\n")
        assert out["steps"][0]["errno"] == errno.ESRCH, cmd
    in_log(mnt, f"process {pid} has already exited")
    res = run(mnt, f'echo term > "$M/proc/{pid}/ctl"')
    assert "write error: No such process" in res.stderr
    assert probe(mnt.p(f"proc/{pid}/ctl"), "w", b"reap\n")["steps"][0]["errno"] == 0
    out = probe(mnt.p(f"proc/{pid}/ctl"), "w", b"kill\n")
    assert out["open"] == errno.ENOENT
    res = run(mnt, f'echo kill > "$M/proc/{pid}/ctl"')
    assert res.returncode != 0 and "No such file or directory" in res.stderr
    assert mnt.daemon_alive()


def test_reap_running_is_ebusy(mnt, hang):
    out = probe(mnt.p(f"proc/{hang}/ctl"), "w", b"reap\n")
    assert out["steps"][0]["errno"] == errno.EBUSY
    in_log(mnt, "process is still running")
    assert str(hang) in ls_proc(mnt)


# ------------------------------------------------------------------------ context

def _context(m: Mount, pid: int) -> str:
    return (m.path / "proc" / str(pid) / "context").read_text()


@pytest.mark.parametrize("data,err,reason", [
    (b"   \n", errno.EINVAL, "empty message"),
    (b"\n", errno.EINVAL, "empty message"),
    (b"\xff\xfe steer", errno.EINVAL, "context text is not UTF-8"),
], ids=["whitespace", "newline", "non-utf8"])
def test_bad_steer_is_refused(mnt, hang, data, err, reason):
    before, listed = _context(mnt, hang), ls_proc(mnt)
    out = probe(mnt.p(f"proc/{hang}/context"), "a", data)
    assert out["steps"][0]["errno"] == err
    in_log(mnt, reason)
    assert _context(mnt, hang) == before
    assert mnt.daemon_alive()
    assert ls_proc(mnt) == listed


def test_oversized_steer_is_efbig(mnt, hang):
    before = _context(mnt, hang)
    out = probe(mnt.p(f"proc/{hang}/context"), "a", b"s" * 70000)
    assert out["steps"][0]["errno"] == errno.EFBIG
    assert _context(mnt, hang) == before


def test_steer_hostile_text_is_kept_verbatim(mnt, hang):
    text = "$(reboot) `id` ../../etc \x1b[31m \"quoted\" naïve"
    out = probe(mnt.p(f"proc/{hang}/context"), "a", text.encode())
    assert out["steps"][0]["errno"] == 0
    last = json.loads(_context(mnt, hang).splitlines()[-1])
    assert last == {"role": "user", "content": text, "pending": True}


def test_steer_after_exit_is_esrch_and_after_reap_enoent(mnt):
    pid = mnt.spawn("done soon")
    mnt.wait(pid)
    out = probe(mnt.p(f"proc/{pid}/context"), "a", b"too late")
    assert out["steps"][0]["errno"] == errno.ESRCH
    res = run(mnt, f'echo "too late" >> "$M/proc/{pid}/context"')
    assert "write error: No such process" in res.stderr
    run(mnt, f'echo reap > "$M/proc/{pid}/ctl"')
    res = run(mnt, f'echo "too late" >> "$M/proc/{pid}/context"')
    assert res.returncode != 0 and "No such file or directory" in res.stderr


def test_context_cannot_be_truncated_to_a_size(mnt, hang):
    res = run(mnt, f'truncate -s 5 "$M/proc/{hang}/context"')
    assert res.returncode != 0 and "Invalid argument" in res.stderr


# ------------------------------------------------------------------------ dev/llm

BAD_LLM = [
    ("malformed-json", b'{"messages": [', errno.EINVAL, "bad JSON"),
    ("not-an-object", b'{"messages": [1]}', errno.EINVAL, "each message needs"),
    ("empty-messages", b'{"messages": []}', errno.EINVAL, "messages must be a non-empty list"),
    ("unknown-key", j({"messages": [{"role": "user", "content": "x"}], "bogus": 1}), errno.EINVAL,
     "unknown request key 'bogus'"),
    ("bad-role", j({"role": "wizard", "content": "x"}), errno.EINVAL, "each message needs"),
    ("content-number", j({"role": "user", "content": 5}), errno.EINVAL, "each message needs"),
    ("whitespace", b"  \n", errno.EINVAL, "empty message"),
    ("non-utf8", b"\xff\xfe", errno.EINVAL, "message is not UTF-8"),
    ("oversized", b"m" * 70000, errno.EFBIG, f"message is 70000 bytes; the cap is {CAP}"),
]


@pytest.mark.parametrize("data,err,reason", [c[1:] for c in BAD_LLM], ids=[c[0] for c in BAD_LLM])
def test_bad_llm_message_then_the_handle_still_works(mnt, data, err, reason):
    before = ls_proc(mnt)
    out = probe(mnt.p("dev/llm/scripted"), "rw", data, b"still here", None)
    assert out["open"] == 0
    assert out["steps"][0]["errno"] == err
    assert out["steps"][1] == {"errno": 0, "n": len(b"still here")}
    assert out["steps"][2] == {"errno": 0, "data": "echo: still here\n"}
    in_log(mnt, reason)
    assert mnt.daemon_alive()
    assert ls_proc(mnt) == before  # a conversation is not a process


def test_unknown_llm_provider_is_enoent(mnt):
    out = probe(mnt.p("dev/llm/nope"), "rw", b"hi")
    assert out["open"] == errno.ENOENT
    res = run(mnt, 'cat "$M/dev/llm/nope"')
    assert res.returncode != 0 and "No such file or directory" in res.stderr
    assert sorted(os.listdir(mnt.p("dev/llm"))) == ["local", "scripted"]


def test_llm_write_while_streaming_is_ebusy(mnt):
    out = probe(mnt.p("dev/llm/scripted"), "rw", b"[[chunk-delay:0.2]] [[tokens:5]]", b"again", None,
                b"next", None)
    assert out["steps"][1]["errno"] == errno.EBUSY
    assert out["steps"][2]["data"].split() == "alpha bravo charlie delta echo".split()
    assert out["steps"][4] == {"errno": 0, "data": "echo: next\n"}
    in_log(mnt, "a reply is still streaming")


@pytest.mark.expect_log('rnixfs\\.devices\\.llm\\.conversation: \\[DRIVER\\]', 'stamina.retry_scheduled')
def test_llm_driver_error_is_eio_and_the_conversation_goes_on(mnt):
    out = probe(mnt.p("dev/llm/scripted"), "rw", b"first", None, b"[[fault:500]] boom", None,
                b"second", None)
    errs = [s["errno"] for s in out["steps"]]
    assert errs == [0, 0, 0, errno.EIO, 0, 0]
    assert out["steps"][1]["data"] == "echo: first\n"
    assert out["steps"][5]["data"] == "echo: second\n"
    in_log(mnt, "[DRIVER] Read: /dev/llm/scripted")
    assert mnt.daemon_alive()


# -------------------------------------------------------------- read-only files

READ_ONLY = ["status", "intent", "trace", "events", "result", "wait"]


@pytest.mark.parametrize("name", READ_ONLY)
def test_write_to_read_only_file_is_eacces(mnt, hang, name):
    path = mnt.p(f"proc/{hang}/{name}")
    before = open(path, "rb").read() if name != "wait" else None
    for mode in ("w", "a", "rw"):
        assert probe(path, mode, b"x")["open"] == errno.EACCES, mode
    for redir in (">", ">>"):
        res = run(mnt, f'echo x {redir} "{path}"')
        assert res.returncode != 0 and "Permission denied" in res.stderr
    res = run(mnt, f'truncate -s 0 "{path}"; chmod 777 "{path}"')
    assert res.stderr.count("Permission denied") == 2
    if name in ("intent",):
        assert open(path, "rb").read() == before
    assert mnt.daemon_alive()


def test_write_to_a_directory_is_eisdir(mnt, hang):
    for rel in (f"proc/{hang}", f"proc/{hang}/fd", "proc", "dev/llm"):
        res = run(mnt, f'echo x > "$M/{rel}"')
        assert res.returncode != 0 and "Is a directory" in res.stderr, rel


def test_changing_the_tree_is_refused_cleanly(mnt, hang):
    cmds = ['touch "$M/proc/foo"', 'mkdir "$M/proc/x"', 'rm -f "$M/proc/new"', f'rm -rf "$M/proc/{hang}"',
            'mv "$M/proc/new" "$M/proc/new2"', 'ln -s x "$M/proc/y"', 'echo hi > "$M/dev/llm/nope"',
            'touch "$M/foo"']
    before = ls_proc(mnt)
    bad = []
    for cmd in cmds:
        res = run(mnt, cmd)
        ok = res.returncode != 0 and any(t in res.stderr for t in (
            "Permission denied", "Operation not permitted", "Read-only file system", "No such file or directory"))
        if not ok:
            bad.append(f"{cmd}: {res.stderr.strip()}")
    assert ls_proc(mnt) == before
    assert not bad, "\n".join(bad)


# --------------------------------------------------------------- concurrency

def test_twenty_parallel_echos_spawn_twenty_processes(mnt):
    before = ls_proc(mnt)
    res = run(mnt, 'for i in $(seq 0 19); do echo "parallel request $i" > "$M/proc/new" & done; wait')
    assert res.returncode == 0 and res.stderr == "", res.stderr
    new = ls_proc(mnt) - before
    assert len(new) == 20
    pids = sorted(int(p) for p in new)
    intents = {}
    for pid in pids:
        st = mnt.status(pid)  # every status parses: nothing half made
        intents[st["intent"]] = pid
        assert st["state"] in ("created", "running", "zombie")
    assert set(intents) == {f"parallel request {i}" for i in range(20)}
    for pid in pids:
        assert mnt.wait(pid).startswith("exited(0) steps=1")
        assert mnt.status(pid)["state"] == "zombie"


def test_twenty_parallel_handles_read_back_their_own_pid(mnt):
    before = ls_proc(mnt)
    res = run(mnt, '''for i in $(seq 0 19); do
            ( exec 3<>"$M/proc/new"; echo "readback $i" >&3; read -r pid <&3; echo "$i $pid" ) &
        done; wait''')
    assert res.returncode == 0, res.stderr
    pairs = dict(line.split() for line in res.stdout.splitlines())
    assert len(pairs) == 20 and len(set(pairs.values())) == 20
    assert ls_proc(mnt) - before == set(pairs.values())
    for i, pid in pairs.items():
        assert mnt.status(int(pid))["intent"] == f"readback {i}"


def test_parallel_good_and_bad_requests(mnt):
    before = ls_proc(mnt)
    res = run(mnt, '''for i in $(seq 0 9); do
            echo "good $i" > "$M/proc/new" &
            echo "{\\"intent\\": \\"bad $i\\", \\"agent\\": \\"nope\\"}" > "$M/proc/new" &
        done; wait''')
    assert res.stderr.count("write error: No such file or directory") == 10, res.stderr
    new = ls_proc(mnt) - before
    assert len(new) == 10
    assert {mnt.status(int(p))["intent"] for p in new} == {f"good {i}" for i in range(10)}
    assert mnt.daemon_alive()
