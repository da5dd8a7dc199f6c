"""Tier 1: parsing proc/new requests (no mount)."""
import pytest

from rnixfs.kernel.errors import Code, SyscallError
from rnixfs.kernel.request import MAX_REQUEST_BYTES, parse


def code_of(data: bytes) -> Code:
    with pytest.raises(SyscallError) as exc:
        parse(data)
    return exc.value.code


def test_plain_text_is_the_whole_intent():
    assert parse(b"summarize README.md\n").intent == "summarize README.md"


def test_json_object_with_options():
    r = parse(b'{"intent": "x", "agent": "code-analyst", "max_steps": 3, "step_timeout": "10m",'
              b' "skills": ["a", "b"], "env": {"A": 1}, "max_cost": 0.5}')
    assert (r.intent, r.agent, r.max_steps, r.step_timeout, r.skills, r.env, r.max_cost) == (
        "x", "code-analyst", 3, 600.0, ["a", "b"], {"A": "1"}, 0.5)


def test_yaml_mapping_with_intent():
    r = parse(b"intent: review the diff\nprovider: local\nmax_tokens: 100\n")
    assert (r.intent, r.provider, r.max_tokens) == ("review the diff", "local", 100)


def test_yaml_mapping_without_intent_is_plain_text():
    assert parse(b"note: this is just a sentence").intent == "note: this is just a sentence"


def test_step_timeout_zero_means_off_and_units():
    assert parse(b'{"intent":"x","step_timeout":"0"}').step_timeout == 0
    assert parse(b'{"intent":"x","step_timeout":"500ms"}').step_timeout == 0.5
    assert parse(b'{"intent":"x","step_timeout":90}').step_timeout == 90


def test_skills_as_comma_string():
    assert parse(b"intent: x\nskills: a, b").skills == ["a", "b"]


@pytest.mark.parametrize("data", [
    b"", b"   \n", b'{"agent": "x"}', b"{not json", b'{"intent": ""}',
    b'{"intent": 5}', b'{"intent": "x", "bogus": 1}', b'{"intent": "x", "max_steps": 0}',
    b'{"intent": "x", "max_steps": true}', b'{"intent": "x", "max_steps": "3"}',
    b'{"intent": "x", "agent": "../etc"}', b'{"intent": "x", "agent": "a/b"}',
    b'{"intent": "x", "step_timeout": "soon"}', b'{"intent": "x", "step_timeout": -1}',
    b'{"intent": "x", "max_cost": -1}', b'{"intent": "x", "env": {"1BAD": "v"}}',
    b'{"intent": "x", "env": ["A"]}', b'{"intent": "x", "skills": [1]}',
    b"hello\x00world", b"\xff\xfe bad utf8", b'{"intent": "x", "cwd": ""}',
])
def test_bad_requests_are_invalid(data):
    assert code_of(data) == Code.INVALID


def test_oversized_request_is_too_big():
    assert code_of(b"x" * (MAX_REQUEST_BYTES + 1)) == Code.TOO_BIG
    assert parse(b"x" * MAX_REQUEST_BYTES).intent


def test_error_text_is_readable():
    with pytest.raises(SyscallError) as exc:
        parse(b'{"intent": "x", "bogus": 1}')
    assert "unknown option 'bogus'" in exc.value.cause


@pytest.mark.parametrize("data,last,expect", [
    (b"summarize README.md\n", 20, "now"),
    (b"no newline", 10, "now"),  # one write is one request
    (b"a" * 4096, 4096, "more"),  # a full stdio buffer: the writer goes on
    (b"a" * 4096 + b"\n", 4097, "now"),
    (b'{"intent": "x",\n', 16, "more"),  # bash writes echo line by line
    (b'{"intent": "unterminated', 24, "more"),
    (b'{"intent": "x"}\n', 16, "now"),
    (b'{"intent": x}\n', 14, "now"),  # broken, not unfinished: fail now
    (b"intent: x\n", 10, "later"),  # a YAML request may go on
    (b"note: hi\n", 9, "now"),  # not request options: plain text
    ("é".encode()[:1] + b"a" * 4095, 4096, "now"),
    (b"a" * 4095 + "é".encode()[:1], 4096, "more"),  # UTF-8 cut at a buffer edge
])
def test_framing(data, last, expect):
    from rnixfs.kernel.request import framing

    assert framing(data, last) == expect
