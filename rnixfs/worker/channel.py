"""One end of a kernel-protocol connection over a trio stream: ordered
sends that never block the caller, framed receives, request/reply
correlation, and the hello handshake."""
from __future__ import annotations

import itertools
import logging
import math

import trio

from . import protocol
from .protocol import Hello, Message, ProtocolError, Refuse, Reply

log = logging.getLogger(__name__)

READ_SIZE = 1 << 16
MAX_COALESCE = 256  # frames joined into one send at most (bounds the copy)


class PeerGone(Exception):
    """The other end closed the connection or broke the protocol."""


class Channel:
    def __init__(self, stream: trio.abc.Stream, *, name: str = "peer"):
        self.stream = stream
        self.name = name
        self._reader = protocol.FrameReader()
        self._ready: list[bytes] = []
        self._out_send, self._out_recv = trio.open_memory_channel(math.inf)
        self._reqs = itertools.count(1)
        self._waiting: dict[int, trio.MemorySendChannel] = {}
        self._queued = self._sent = 0
        self._progress = trio.Event()
        self.closed = trio.Event()

    # -- sending ------------------------------------------------------------------------
    def send(self, msg: Message) -> None:
        """Queue ``msg`` (sync: trace lines come from sync code); ``writer``
        sends the queue in order. An unencodable message is a bug: raised here."""
        frame = protocol.encode(msg)
        try:
            self._out_send.send_nowait(frame)
            self._queued += 1
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass  # the connection is gone; the reader reports it

    async def writer(self) -> None:
        """Send queued frames until the connection closes. Everything queued
        by the time the writer runs goes out in one ``send_all``: a step's
        trace lines and status reports, queued by sync code between two
        awaits, cost one system call here and one wake-up of the peer, not
        one per message (docs/architecture.md, "What a model request costs")."""
        try:
            async for frame in self._out_recv:
                # the tasks that are runnable now (other loops of this
                # worker) queue their messages before this send
                await trio.lowlevel.cancel_shielded_checkpoint()
                frames = [frame]
                ended = False
                while len(frames) < MAX_COALESCE:
                    try:
                        frames.append(self._out_recv.receive_nowait())
                    except trio.WouldBlock:
                        break
                    except trio.EndOfChannel:
                        ended = True
                        break
                await self.stream.send_all(frames[0] if len(frames) == 1 else b"".join(frames))
                self._sent += len(frames)
                self._progress.set()
                self._progress = trio.Event()
                if ended:
                    break
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            log.debug("%s: send failed: %s", self.name, exc)
        finally:
            self._gone()

    async def request(self, make) -> Reply:
        """Send ``make(req)`` and wait for the reply with that ``req``."""
        req = next(self._reqs)
        send, recv = trio.open_memory_channel(1)
        self._waiting[req] = send
        try:
            self.send(make(req))
            try:
                return await recv.receive()
            except trio.EndOfChannel:
                raise PeerGone(f"{self.name} went away") from None
            except trio.Cancelled:
                self.send(protocol.Cancel(req=req))  # the peer stops working on it
                raise
        finally:
            self._waiting.pop(req, None)

    def tell(self, make) -> None:
        """Send ``make(req)`` and do not wait: its reply is dropped."""
        self.send(make(next(self._reqs)))

    def answer(self, req: int, value=None, error: dict | None = None) -> None:
        self.send(Reply(req=req, value=value, error=error))

    # -- receiving ------------------------------------------------------------------------
    async def receive(self) -> Message | None:
        """The next message that is not a reply (replies go to their
        ``request``); None at EOF. ProtocolError on a bad frame."""
        while True:
            while not self._ready:
                try:
                    data = await self.stream.receive_some(READ_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    data = b""
                if not data:
                    if self._reader.pending:
                        raise ProtocolError(f"{self.name} closed mid-frame "
                                            f"({self._reader.pending} bytes pending)")
                    return None
                self._ready.extend(self._reader.feed(data))
            msg = protocol.decode(self._ready.pop(0))
            if isinstance(msg, Reply):
                waiter = self._waiting.pop(msg.req, None)
                if waiter is not None:
                    waiter.send_nowait(msg)
                continue
            return msg

    async def flush(self, timeout: float = 5.0) -> None:
        """Wait (bounded) until everything queued so far is sent."""
        want = self._queued
        with trio.move_on_after(timeout):
            while self._sent < want and not self.closed.is_set():
                await self._progress.wait()

    def _gone(self) -> None:
        for waiter in self._waiting.values():
            waiter.close()
        self._waiting.clear()
        self._out_send.close()
        self.closed.set()

    async def aclose(self) -> None:
        self._gone()
        with trio.CancelScope(shield=True):
            await self.stream.aclose()

    # -- handshake --------------------------------------------------------------------------
    async def handshake(self, role: str, peer_role: str, pid: int = 0) -> Hello:
        """Say hello and check the peer's; a mismatch sends ``refuse`` with
        the reason, and raises ProtocolError."""
        self.send(Hello(version=protocol.VERSION, role=role, pid=pid))
        msg = await self.receive()
        if msg is None:
            raise PeerGone(f"{self.name} closed before its hello")
        if isinstance(msg, Refuse):
            raise ProtocolError(f"{self.name} refused us: {msg.reason}")
        try:
            return protocol.check_hello(msg, peer_role)
        except ProtocolError as exc:
            self.send(Refuse(reason=str(exc)))
            await self.flush()  # the peer learns why before we close
            raise
