"""The kernel protocol: typed messages between the daemon's kernel and a
worker process (docs/architecture.md, "Workers and the kernel protocol").

A frame is a 4-byte big-endian length and that many bytes of UTF-8 JSON,
``{"kind": <kind>, <fields>…}``. Every message is a dataclass below; decoding
checks the kind, the field names and their types, so a garbled or hostile
frame is a ``ProtocolError`` with a readable reason, never a crash. Nothing
in a message is local to one machine: no fds, no shared memory, no
monotonic stamps (times are durations), so a worker could run elsewhere.
"""
from __future__ import annotations

import dataclasses
import json
import struct
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

VERSION = 2  # 2: trace lines carry the fields that changed with them
MAX_FRAME = 32 << 20  # bytes of one message: a whole conversation fits
HEADER = struct.Struct(">I")


class ProtocolError(Exception):
    """A frame that is not a message of this protocol; ``str()`` says why."""


MESSAGES: dict[str, type["Message"]] = {}
_HINTS: dict[str, dict[str, Any]] = {}


class Message:
    kind: ClassVar[str] = ""

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls.kind:
            MESSAGES[cls.kind] = cls


def _checker(tp):
    """A predicate: is a decoded JSON value of type ``tp``? (A bool is not
    a number.) The type's structure is worked out once, at class creation."""
    if tp is Any:
        return lambda v: True
    if typing.get_origin(tp) is typing.Union:
        checks = tuple(_checker(a) for a in typing.get_args(tp))
        return lambda v: any(c(v) for c in checks)
    if tp is type(None):
        return lambda v: v is None
    if tp is float:
        return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
    if tp is int:
        return lambda v: isinstance(v, int) and not isinstance(v, bool)
    return lambda v: isinstance(v, tp)


# kind → (field name, required, its type's check, its type) for each field:
# built once per message class, so decoding a frame does no typing work
_FIELDS: dict[str, tuple[tuple[str, bool, Any, Any], ...]] = {}


def _message(cls):
    cls = dataclass(cls)
    hints = _HINTS[cls.kind] = typing.get_type_hints(cls)
    _FIELDS[cls.kind] = tuple(
        (f.name, f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
         _checker(hints[f.name]), hints[f.name]) for f in dataclasses.fields(cls))
    return cls


# -- both ways ----------------------------------------------------------------------------
@_message
class Hello(Message):
    """First message each way; a peer of another version is refused."""
    kind = "hello"
    version: int
    role: str  # "kernel" or "worker"
    pid: int = 0


@_message
class Refuse(Message):
    """Sent before closing: why the peer is not served."""
    kind = "refuse"
    reason: str


@_message
class Reply(Message):
    """The answer to a request with the same ``req``: a value or an error
    (a SyscallError as a dict, see ``errors.SyscallError.to_dict``)."""
    kind = "reply"
    req: int
    value: Any = None
    error: Optional[dict] = None


# -- kernel -> worker -----------------------------------------------------------------------
@_message
class Configure(Message):
    """What every loop of this worker shares."""
    kind = "configure"
    project: str
    mount: str
    config_dir: str
    state_dir: str
    env: dict           # the environment of agents' commands (no provider keys)
    limits: dict        # Limits.to_json()
    hidden: list        # workspace paths the tools never see (the mount inside the project)


@_message
class Start(Message):
    """Run a process's loop: everything it needs (see ``spec.to_spec``)."""
    kind = "start"
    pid: int
    spec: dict


@_message
class Signal(Message):
    kind = "signal"
    pid: int
    command: str  # term, kill, pause, resume


@_message
class Steer(Message):
    kind = "steer"
    pid: int
    text: str


# -- worker -> kernel -----------------------------------------------------------------------
@_message
class Ready(Message):
    """Configured (providers, sandbox, workspace): starts are served now."""
    kind = "ready"
    providers: list


@_message
class Trace(Message):
    """One syscall line; the kernel's Tracer numbers and commits it."""
    kind = "trace"
    pid: int
    syscall: str
    args: str
    result: str
    t: float                    # seconds since the process started
    dur_ms: Optional[float] = None
    error: Optional[dict] = None
    # ``spec.CHEAP_FIELDS`` that changed since the last report (an fd opened
    # or closed, a step counted): applied before the line, in the same frame
    fields: dict = dataclasses.field(default_factory=dict)


@_message
class Status(Message):
    """Fields of the process that changed (``spec.STATUS_FIELDS``), batched
    per step; ``messages`` travel as a tail from index ``messages_at``."""
    kind = "status"
    pid: int
    fields: dict
    checkpoint: bool = False    # a step boundary: the kernel stores the record


@_message
class AccountQuery(Message):
    """The process's account chain as it stands (answered with ``spec.account_to_wire``)."""
    kind = "account"
    pid: int
    req: int


@_message
class Charge(Message):
    kind = "charge"
    pid: int
    req: int
    tokens: int
    cost: float


@_message
class Spawn(Message):
    kind = "spawn"
    pid: int
    req: int
    intent: str
    agent: Optional[str] = None


@_message
class IsChild(Message):
    kind = "is_child"
    pid: int
    req: int
    child: int


@_message
class Wait(Message):
    kind = "wait"
    pid: int
    req: int
    child: int


@_message
class HostStarted(Message):
    """A Bash command of ``pid`` runs as ``host_pid`` (its proc/new writes
    spawn children of ``pid``)."""
    kind = "host_started"
    pid: int
    req: int
    host_pid: int


@_message
class HostEnded(Message):
    kind = "host_ended"
    pid: int
    host_pid: int


@_message
class McpSpecs(Message):
    kind = "mcp_specs"
    pid: int
    req: int
    servers: list
    inline: dict


@_message
class McpCall(Message):
    kind = "mcp_call"
    pid: int
    req: int
    server: str
    tool: str
    args: dict
    limit: int


@_message
class Cancel(Message):
    """The loop that sent request ``req`` no longer waits for it (killed)."""
    kind = "cancel"
    req: int


@_message
class Exit(Message):
    """The loop ended: exit code, error, result, and the last changed fields."""
    kind = "exit"
    pid: int
    code: int
    error: Optional[dict] = None
    result: Optional[str] = None
    fields: dict = dataclasses.field(default_factory=dict)


# -- encoding --------------------------------------------------------------------------------
def encode(msg: Message) -> bytes:
    """One frame; ProtocolError when it would pass MAX_FRAME."""
    body = {"kind": msg.kind}
    body.update((f.name, getattr(msg, f.name)) for f in dataclasses.fields(msg))
    try:
        data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"{msg.kind}: not JSON-serialisable: {exc}") from None
    if len(data) > MAX_FRAME:
        raise ProtocolError(f"{msg.kind} message is {len(data)} bytes; the cap is {MAX_FRAME}")
    return HEADER.pack(len(data)) + data


def decode(body: bytes) -> Message:
    """The message of one frame's body, checked field by field."""
    try:
        obj = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ProtocolError(f"frame is not JSON: {str(exc)[:120]}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"frame is a JSON {type(obj).__name__}, not an object")
    kind = obj.pop("kind", None)
    cls = MESSAGES.get(kind) if isinstance(kind, str) else None
    if kind is None:
        raise ProtocolError("frame has no message kind")
    if cls is None:
        raise ProtocolError(f"unknown message type {str(kind)[:40]!r}")
    hints = _HINTS[kind]
    for k in obj:
        if k not in hints:
            raise ProtocolError(f"{kind}: unknown field {str(k)[:40]!r}")
    for name, required, check, tp in _FIELDS[kind]:
        if name not in obj:
            if required:
                raise ProtocolError(f"{kind}: missing field {name!r}")
            continue
        if not check(obj[name]):
            raise ProtocolError(f"{kind}: field {name!r} is {type(obj[name]).__name__}, "
                                f"want {_name(tp)}")
    return cls(**obj)


def _name(tp) -> str:
    if typing.get_origin(tp) is typing.Union:
        return " or ".join(_name(a) for a in typing.get_args(tp))
    return "null" if tp is type(None) else getattr(tp, "__name__", str(tp))


class FrameReader:
    """Cuts a byte stream into frame bodies; a length past MAX_FRAME is a
    ProtocolError before a byte of the body is buffered."""

    def __init__(self, max_frame: int = MAX_FRAME):
        self._buf = bytearray()
        self._max = max_frame

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf
        buf += data
        out = []
        pos, have = 0, len(buf)
        while have - pos >= HEADER.size:  # one read holds many frames: cut by offset
            (size,) = HEADER.unpack_from(buf, pos)
            if size > self._max:
                raise ProtocolError(f"frame of {size} bytes announced; the cap is {self._max}")
            end = pos + HEADER.size + size
            if have < end:
                break
            out.append(bytes(buf[pos + HEADER.size:end]))
            pos = end
        if pos:
            del buf[:pos]
        return out

    @property
    def pending(self) -> int:
        return len(self._buf)


def check_hello(msg: Message, want_role: str) -> Hello:
    """The peer's hello, or ProtocolError saying what is wrong with it."""
    if not isinstance(msg, Hello):
        raise ProtocolError(f"expected hello, got {msg.kind}")
    if msg.version != VERSION:
        raise ProtocolError(f"protocol version {msg.version} is not supported (this side speaks "
                            f"version {VERSION}); run the same rnixfs on both sides")
    if msg.role != want_role:
        raise ProtocolError(f"peer says it is a {msg.role[:20]!r}, expected a {want_role}")
    return msg
