"""What the inline invocation path (inline.py) puts on the server's connection: a whole
answer in one write, the request id it gives, and the replay of a body it looked at."""

from __future__ import annotations

import os

from starlette.types import Message, Receive
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from service.core.front import whole_answer
from service.core.server import Resume


class Replay:
    """A `receive` that first gives back what the inline path already took."""

    def __init__(self, first: Message | BaseException, receive: Receive) -> None:
        self._first: Message | BaseException | None = first
        self._receive = receive

    async def __call__(self) -> Message:
        first, self._first = self._first, None
        if first is None:
            return await self._receive()
        if isinstance(first, BaseException):
            raise first
        return first


def write_whole(
    cycle: RequestResponseCycle, status: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> bool:
    """Write a whole answer (its headers carry its length) to the cycle's connection in one
    write, doing what the server's `send` does for a head and a last body; False when that
    `send` must do it (the connection's writes are paused, or a response began)."""
    lines = b"".join([name + b": " + value + b"\r\n" for name, value in headers])
    return write_lines(cycle, status, lines, body)


def write_lines(cycle: RequestResponseCycle, status: int, lines: bytes, body: bytes) -> bool:
    """`write_whole` with the headers as header lines, each ending in CRLF."""
    if cycle.response_started or cycle.flow.write_paused:
        return False
    if cycle.disconnected:
        return True
    if cycle.scope["method"] == "HEAD":
        body = b""
    answer = whole_answer(status, cycle.default_headers, lines, cycle.keep_alive, body)
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    cycle.transport.write(answer)
    cycle.response_complete = True
    cycle.message_event.set()
    if not cycle.keep_alive:
        cycle.transport.close()
    cycle.on_response()
    return True


class CycleWire:
    """A server cycle as the inline path's `Front` (core/front.py): a request that came by
    uvicorn's protocol."""

    __slots__ = ("cycle",)

    def __init__(self, cycle: RequestResponseCycle) -> None:
        self.cycle = cycle

    def writable(self) -> bool:
        return not (self.cycle.response_started or self.cycle.flow.write_paused)

    def write(self, status: int, lines: bytes, body: bytes) -> None:
        write_lines(self.cycle, status, lines, body)
        self.cycle.on_response = nothing  # the finished cycle no longer holds its connection

    def abort(self) -> None:
        self.cycle.transport.close()
        self.cycle.on_response = nothing

    def resume(self, resume: Resume) -> bool:
        raise AssertionError("a cycle's request goes on in a task of the inline path")


def nothing() -> None:
    """What a finished cycle calls when its response completes: nothing (the server's own
    `run_asgi` does the same, so that the cycle no longer holds its connection)."""


#: random bytes read at once for this many request ids (one system call instead of one each)
_IDS_PER_READ = 256
_ids: list[str] = []


def _forget_ids() -> None:
    _ids.clear()  # a forked child must not give the ids its parent gives


os.register_at_fork(after_in_child=_forget_ids)


def new_request_id() -> str:
    """A random (version 4) UUID as text, as `str(uuid.uuid4())` gives, without the UUID
    object (16 bytes each from os.urandom, read and put in text for many ids at a time)."""
    if not _ids:
        _ids.extend(_some_ids())
    return _ids.pop()


def _some_ids() -> list[str]:
    raw = bytearray(os.urandom(16 * _IDS_PER_READ))
    raw[6::16] = bytes(b & 0x0F | 0x40 for b in raw[6::16])  # version 4
    raw[8::16] = bytes(b & 0x3F | 0x80 for b in raw[8::16])  # RFC 4122 variant
    h = raw.hex()
    return [
        f"{h[i : i + 8]}-{h[i + 8 : i + 12]}-{h[i + 12 : i + 16]}-{h[i + 16 : i + 20]}-"
        f"{h[i + 20 : i + 32]}"
        for i in range(0, len(h), 32)
    ]
