"""Connection bounds for the uvicorn server: header time, body time, keep-alive idle time and
how many connections are open at once.

uvicorn bounds only the keep-alive idle time: a connection that sends nothing, or half a
request head, or half a body, stays open for as long as the client likes, each one holding a
file descriptor. `BoundedHttpToolsProtocol` (uvicorn's httptools protocol, installed with
`uvicorn.run(http=...)`) adds one deadline per connection:

- from the connection opening, and from a later request's first byte, the head must be
  complete within `header_timeout`;
- from the head, the body must be complete within `body_timeout` (the ASGI side,
  `service.core.deadline.BodyDeadlineMiddleware`, answers a route reading a late body 408),
  or `long_body_timeout` for paths under `long_body_prefix` (uploads of assets);
- between requests (the response complete and the body read), `keepalive_timeout`; uvicorn's
  own keep-alive timer is set a second later (`uvicorn_keepalive`), a backstop only;
- while writing is paused (the caller reads nothing and the buffers are full), `send_timeout`:
  past it the connection is aborted. Armed by asyncio's `pause_writing`, so a send that does
  not block costs nothing.

When the deadline passes the connection is closed: at once if no response is under way, or
else as soon as the response is complete. A connection opened while `max_connections` are open
is answered 503 and closed without reading from it.

A request head over `max_head_bytes` (counted by reads, so at most one read more) or with
more than `max_headers` header lines is answered 431 and the connection closed, before the
parser has gathered it: the application never sees it. A chunked body's framing (chunk-size
lines with their extensions, and the trailer section) is bounded alike: over `max_head_bytes`
(plus `CHUNK_LINE_BYTES` per chunk) or `max_headers` trailer lines, 431 and closed (a response
already under way is cut). Trailer fields are dropped: they are not header fields (RFC 9110
§6.5.1), and an `Authorization` or `function-id` sent as one must never count as one.

This is uvicorn's httptools protocol with its parser callbacks (httptools' public callback
interface) extended; it reads uvicorn's per-request state (`cycle`, `scope`, `url`) and writes
none of it. Why uvicorn and not a server that owns these bounds (granian was measured):
docs/invocation.md, "The HTTP server".

A response under way that cannot be completed (the worker's answer it relays broke off) is
cut with `cut_response`: the connection closes at once and the call returns once it is lost,
as a call whose caller went away does (not logged as an application error; but uvicorn marks
only a connection's newest request disconnected, so a cut answer with a pipelined request
queued behind it still is).

`freeze_startup_objects` (`NVCF_GC_FREEZE`): the serve commands call it once the application is
built, before serving.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import math
import resource
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, cast

from starlette.types import Scope
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("nvcf.server")

#: scope key set once the request's body has arrived whole (`BodyDeadlineMiddleware`)
BODY_RECEIVED = "nvcf.body_received"
#: scope key of the callable that closes the request's connection at once (`cut_response`)
CUT = "nvcf.cut"

_REFUSAL_TEXT = b"too many open connections; retry later\n"
REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"content-type: text/plain; charset=utf-8\r\n"
    b"content-length: " + str(len(_REFUSAL_TEXT)).encode() + b"\r\n"
    b"retry-after: 1\r\n"
    b"x-content-type-options: nosniff\r\n"
    b"connection: close\r\n\r\n" + _REFUSAL_TEXT
)

#: what each chunk of a chunked body may add to its framing bytes (its size line, with room for a
#: short extension) before they count against the head bound
CHUNK_LINE_BYTES = 64

#: how long a refused request's further bytes are read and discarded before its connection is
#: closed (its answer and the end of the stream have been sent by then)
LINGER_SECONDS = 1.0

#: file descriptors kept for everything but client connections (database, Redis, Kubernetes
#: and registry clients, chart files, Helm subprocesses), at most half of the limit
FD_RESERVE = 128


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout: float
    body_timeout: float
    keepalive_timeout: float
    max_connections: int
    #: a request head's bytes and header lines (431 beyond)
    max_head_bytes: int = 64 * 1024
    max_headers: int = 100
    #: requests whose path starts with `long_body_prefix` (uploads to the local store's signed
    #: URLs) have `long_body_timeout` seconds for their body instead of `body_timeout`
    long_body_prefix: str = ""
    long_body_timeout: float = 0.0
    #: seconds the connection's writes may stay paused (the caller reads nothing and the
    #: buffers are full) before it is aborted; None: no bound
    send_timeout: float | None = None

    def body_timeout_of(self, path: str) -> float:
        if self.long_body_prefix and path.startswith(self.long_body_prefix):
            return max(self.body_timeout, self.long_body_timeout)
        return self.body_timeout


def soft_fd_limit() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def connection_cap(configured: int, soft_fd_limit: int | None) -> int:
    """`configured`, lowered so that connections cannot use up the file-descriptor limit."""
    if soft_fd_limit is None:
        return configured
    room = soft_fd_limit - min(FD_RESERVE, soft_fd_limit // 2)
    return max(1, min(configured, room))


def freeze_startup_objects(enabled: bool) -> bool:
    """Move everything alive at start-up (modules, classes, the application) out of the cyclic
    garbage collector's reach, so that its full collections, which otherwise walk all of it
    and pause every request for a few hundred ms on a busy machine, walk only what requests
    created. True when done (`NVCF_GC_FREEZE`)."""
    if not enabled:
        return False
    gc.collect()
    gc.freeze()
    return True


class Deadline:
    """One connection's deadline: `arm(seconds)` sets it (replacing the one set), `disarm()`
    clears it, `on_passed` is called when it passes. One timer at most, which looks again
    when it fires: a later deadline leaves it be (it sets itself again), so arming one per
    request costs no timer."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_passed: Callable[[], None]) -> None:
        self._loop = loop
        self._on_passed = on_passed
        #: when the deadline passes (loop time); None: none is set
        self._at: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0

    @property
    def armed(self) -> bool:
        return self._at is not None

    def arm(self, seconds: float) -> None:
        at = self._at = self._loop.time() + seconds
        if self._timer is None or at < self._timer_at:
            self._rearm(at)

    def arm_at(self, at: float) -> None:
        """`arm` for a loop time."""
        self._at = at
        if self._timer is None or at < self._timer_at:
            self._rearm(at)

    def _rearm(self, at: float) -> None:
        """The timer set for `at`, earlier than the one set (if any)."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(at, self._look)
        self._timer_at = at

    def disarm(self) -> None:
        self._at = None

    def cancel(self) -> None:
        """Disarmed, and its timer gone (the connection is closed)."""
        self._at = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _look(self) -> None:
        self._timer = None
        at = self._at
        if at is None:
            return
        if self._loop.time() < at:
            self._timer = self._loop.call_at(at, self._look)
            self._timer_at = at
            return
        self._at = None
        self._on_passed()


class CoalescingTransport(asyncio.Transport):
    """A connection's transport whose writes made in one step of the event loop leave in one
    send: uvicorn writes a response's head and its body separately, each a system call (and,
    on loopback, the whole delivery to the peer) of its own. Pending bytes go out at the end
    of the step, before the connection closes, or at once past `FLUSH_BYTES`. A write to a
    closed connection raises `ConnectionResetError`."""

    FLUSH_BYTES = 64 * 1024

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []
        self._size = 0
        self._scheduled = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._transport.is_closing():
            # the peer is gone: say so to the writer (uvicorn does not always tell a response
            # under way, e.g. one with a pipelined request behind it)
            raise ConnectionResetError("the connection is closed")
        if not data:
            return
        self._pending.append(bytes(data))
        self._size += len(data)
        if self._size >= self.FLUSH_BYTES:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def flush(self) -> None:
        """Send what is pending now."""
        self._scheduled = False
        if not self._pending:
            return
        data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pending.clear()
        self._size = 0
        if self._transport.is_closing():
            return
        try:
            self._transport.write(data)
        except Exception as exc:  # e.g. the peer reset the connection
            log.debug("writing to a connection failed: %s", exc)
            self._transport.abort()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending.clear()
        self._size = 0
        self._transport.abort()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + self._size

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    limits: ClassVar[ConnectionLimits]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._clock = Deadline(self.loop, self._deadline_passed)
        #: the deadline passed while a response was under way: close once it is complete
        self._expired = False
        self._refused = False
        #: the parser is reading a request head (or waits for the next one)
        self._in_head = True
        #: no request has begun yet: the first head's time runs from the connection opening
        self._first = True
        #: bytes of the current head seen so far (whole reads), and its header lines (then
        #: the trailer lines of its body)
        self._head_bytes = 0
        self._header_count = 0
        #: a message began, or ended, during the read being fed
        self._began = False
        self._ended = False
        #: a body's bytes that are not body (chunk lines, trailer fields), counted by whole
        #: reads, and the chunks whose lines they may hold
        self._framing_bytes = 0
        self._chunks = 0
        #: body bytes the parser handed over from the read being fed
        self._body_in_read = 0
        #: why the request is refused (431), once it is
        self._head_refusal: str | None = None
        #: the send deadline, armed while writing is paused (made at the first pause)
        self._send_clock: Deadline | None = None
        #: the connection is lost; `_lost` is done then (made when a call waits for it)
        self._gone = False
        self._lost: asyncio.Future[None] | None = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        full = len(self.connections) >= self.limits.max_connections
        transport = CoalescingTransport(transport, self.loop)
        super().connection_made(transport)
        if full:
            self._refused = True
            self.connections.discard(self)
            transport.write(REFUSAL)
            transport.close()
            return
        self._clock.arm(self.limits.header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._clock.cancel()
        if self._send_clock is not None:
            self._send_clock.cancel()
        super().connection_lost(exc)
        self._gone = True
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self._refused or self._head_refusal is not None:
            return
        in_body = not self._in_head  # the read starts inside a body
        self._began = self._ended = False
        self._body_in_read = 0
        super().data_received(data)
        if self._head_refusal is not None:
            return
        if self._in_head and not self._began:
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_head_bytes:
                self._refuse(f"the request head is over {self.limits.max_head_bytes} bytes")
        elif in_body and not self._ended:
            # A body's framing (chunk-size lines, their extensions, the trailer section) is
            # bounded like a head: llhttp gathers it without limit, in quadratic time.
            self._framing_bytes += len(data) - self._body_in_read
            if self._framing_bytes > self.limits.max_head_bytes + CHUNK_LINE_BYTES * self._chunks:
                self._refuse(
                    f"the request's chunk lines and trailer section are over "
                    f"{self.limits.max_head_bytes} bytes"
                )

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.limits.send_timeout is not None:
            if self._send_clock is None:
                self._send_clock = Deadline(self.loop, self._send_stalled)
            self._send_clock.arm(self.limits.send_timeout)

    def resume_writing(self) -> None:
        if self._send_clock is not None:
            self._send_clock.disarm()
        super().resume_writing()

    # httptools parser callbacks

    def on_message_begin(self) -> None:
        self._in_head, self._began = True, True
        self._head_bytes = self._header_count = 0
        super().on_message_begin()
        if not self._first:  # the first request's deadline runs from the connection
            self._clock.arm(self.limits.header_timeout)
        self._first = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self.limits.max_headers:
            what = "header" if self._in_head else "trailer"
            self._head_refusal = f"the request has over {self.limits.max_headers} {what} lines"
            raise _HeadTooLarge  # stops the parser; answered by send_400_response
        if self._in_head:
            super().on_header(name, value)
        # else a trailer field: not a header field (RFC 9110 §6.5.1), and none of the
        # application's business; it is dropped

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._header_count = self._framing_bytes = self._chunks = 0
        if self.scope is not None:
            cast(dict[str, Any], self.scope)[CUT] = self._cut
        self._clock.arm(self.limits.body_timeout_of(self.url.decode("latin-1")))
        super().on_headers_complete()

    def on_chunk_header(self) -> None:
        self._chunks += 1

    def on_body(self, body: bytes) -> None:
        self._body_in_read += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._clock.disarm()
        if self.scope is not None:  # the application reads the body without waiting
            cast(dict[str, Any], self.scope)[BODY_RECEIVED] = True
        # the read being fed ends a body: its bytes are not head bytes of the next request
        self._in_head, self._head_bytes, self._began, self._ended = True, 0, True, True
        super().on_message_complete()
        if self._idle():
            # The body finished arriving after its response (the route never read it): the
            # connection is idle from now on.
            self._clock.arm(self.limits.keepalive_timeout)

    # uvicorn hooks

    def send_400_response(self, msg: str) -> None:
        if self._head_refusal is not None:
            self._refuse(self._head_refusal)
        else:
            super().send_400_response(msg)

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start a pipelined request
        if self._expired and not self.transport.is_closing():
            self.transport.close()
        elif self._in_head and self._idle():
            self._clock.arm(self.limits.keepalive_timeout)

    # bounds

    def _idle(self) -> bool:
        """No request is under way: its response is complete, its body read, none waits."""
        cycle = self.cycle
        return (
            cycle is not None
            and cycle.response_complete
            and not self.pipeline
            and not self.transport.is_closing()
        )

    def _refuse(self, why: str) -> None:
        """431 and the connection closed; nothing more of the request reaches the
        application. A response already under way is cut instead (nothing can follow it)."""
        self._head_refusal = why
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if self._in_head or cycle is None or not cycle.response_started:
            self.transport.write(head_refusal(why))
        self._linger()

    def _linger(self) -> None:
        """Close once the answer has gone: the sending side at once, the receiving side after
        `LINGER_SECONDS` of discarding what the client still sends (closing with its bytes
        unread would reset the connection, and the client could lose the answer unread)."""
        transport = self.transport
        if transport.can_write_eof():
            transport.write_eof()
            self.loop.call_later(LINGER_SECONDS, transport.close)
        else:
            transport.close()

    async def _cut(self) -> None:
        """The response under way cannot be completed: what it wrote so far goes out, and the
        connection closes now; returns once it is lost (uvicorn has marked the request
        disconnected then)."""
        transport = cast(CoalescingTransport, self.transport)
        if not transport.is_closing():
            transport.flush()
        # `abort` even when closing: a `close` waits for a caller that never reads
        transport.abort()
        if not self._gone:
            if self._lost is None:
                self._lost = self.loop.create_future()
            await self._lost

    def _send_stalled(self) -> None:
        """The caller read nothing of its answer for the send deadline: the connection is
        aborted (a close would wait for the caller to read what is buffered); uvicorn marks
        the request disconnected, and whoever waits on the caller hears it went away."""
        log.info("the caller read nothing for %g s: connection aborted", self.limits.send_timeout)
        self.transport.abort()

    def _deadline_passed(self) -> None:
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self._expired = True
        else:
            self.transport.close()


class _HeadTooLarge(Exception):
    """Raised from a parser callback to stop reading a head over its bounds."""


async def cut_response(scope: Scope) -> None:
    """End the response under way on `scope` without completing it: its connection closed at
    once, returning once it is lost. Under a server without the hook (`CUT`), the server
    closes the connection itself when the call returns incomplete."""
    cut = scope.get(CUT)
    if cut is not None:
        await cut()


def head_refusal(why: str) -> bytes:
    """The 431 problem+json answer to a head over its bounds."""
    body = json.dumps(
        {
            "type": "urn:nvcf:problem-details:request-header-fields-too-large",
            "title": "Request Header Fields Too Large",
            "status": 431,
            "detail": why,
        }
    ).encode()
    return (
        b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
        b"content-type: application/problem+json\r\n"
        b"content-length: %d\r\n"
        b"x-content-type-options: nosniff\r\n"
        b"connection: close\r\n\r\n%s" % (len(body), body)
    )


def uvicorn_keepalive(limits: ConnectionLimits) -> int:
    """uvicorn's own keep-alive time (`timeout_keep_alive`), a whole second past the
    protocol's: a backstop, never the first to close an idle connection."""
    return math.ceil(limits.keepalive_timeout) + 1


def bounded_protocol(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """The protocol class for `uvicorn.run(http=...)`, bound to `limits`."""
    attributes = {"limits": limits}
    return type(BoundedHttpToolsProtocol.__name__, (BoundedHttpToolsProtocol,), attributes)
