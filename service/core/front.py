"""The front protocol: every connection of `nvcf-server serve/invoke` starts here.

A request the application's `HeadExpress` claims from its head alone (the invocation plane's
hot path) is read, begun and answered here, from callbacks, without uvicorn's request cycle,
scope or task. The first request it does not claim — and anything unusual about one it did —
hands the connection to uvicorn's protocol (`BoundedHttpToolsProtocol`, server.py), which
gets the bytes of that request and of anything after it exactly as the client sent them and
serves the connection from then on. A request already under way when it is handed over (its
answer turned out to need a task: streamed, late, failed) goes on there: the protocol's
`resume` continues it from the cycle the replayed bytes make, instead of starting it anew.

What this protocol reads itself, it frames itself (and the HTTP parser checks): a head ending
in CRLF CRLF, then exactly `Content-Length` bytes — a request with `Transfer-Encoding`, no or
several lengths, a length over `BODY_MAX`, an HTTP version other than 1.1 or an upgrade is
handed over before its body is looked at. Requests that arrive behind one under way
(pipelined) wait in the buffer, in order. The connection limits are those of server.py: at
most `max_connections` (a connection over it is handed over at once, to be refused), a head
within `header_timeout` of the connection or the last answer, a body within `body_timeout`,
`keepalive_timeout` of idleness between requests.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol, cast

import httptools
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE
from uvicorn.server import ServerState

from service.core.numbers import natural
from service.core.server import (
    BoundedHttpToolsProtocol,
    ConnectionLimits,
    Deadline,
    Express,
    Resume,
    bounded_protocol,
)

log = logging.getLogger("nvcf.server")

#: a head longer than this is not looked at here (uvicorn's protocol has it)
HEAD_MAX = 16 * 1024
#: a body longer than this is not read here (uvicorn's protocol streams it)
BODY_MAX = 256 * 1024
#: bytes of requests waiting behind the one under way before reading pauses
WAITING_MAX = 256 * 1024

#: a request's headers by (lower-cased) name, in their order; a request naming a header twice
#: is not the front's
Headers = dict[bytes, bytes]


class HeadExpress(Express, Protocol):
    """An express lane (server.py) that also claims requests from their head."""

    #: the request-line starts of the requests it may claim (anything else is handed over
    #: before it is parsed)
    head_prefixes: tuple[bytes, ...]

    def claim_head(self, url: bytes, headers: Headers) -> object | None:
        """What to run for a POST request of this URL and headers, if it is this lane's; None
        hands it over."""
        ...

    def run(self, claimed: object, headers: Headers, body: bytes, front: Front) -> bool:
        """Begin a claimed request, its body complete: True when it is under way (it then
        ends with `front.write` or `front.resume`), False to hand it over instead."""
        ...


class Front(Protocol):
    """What a `HeadExpress` is given to answer a request with."""

    def writable(self) -> bool:
        """Whether an answer may be written now (the connection takes writes)."""
        ...

    def write(self, status: int, lines: bytes, body: bytes) -> None:
        """The whole answer: status, header lines (each ending in CRLF; the server's own
        headers and `connection: close` are added) and body, in one write."""
        ...

    def abort(self) -> None:
        """No answer can be given: the connection is closed."""
        ...

    def resume(self, resume: Resume) -> bool:
        """The request goes on with uvicorn's protocol, given its cycle (see the module
        docstring); False when the caller's connection is gone (there is no cycle to make:
        the lane ends the request as one whose caller went away)."""
        ...


class FrontProtocol(asyncio.Protocol):
    """See the module docstring; bound by `http_protocol`."""

    limits: ClassVar[ConnectionLimits]
    express: ClassVar[HeadExpress]
    fallback: ClassVar[type[BoundedHttpToolsProtocol]]

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.config = config
        self.server_state = server_state
        self.app_state = app_state
        self.loop = _loop or asyncio.get_event_loop()
        self.connections = server_state.connections
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self._clock = Deadline(self.loop, self._deadline_passed)
        #: bytes received and not yet taken as a request
        self._buffer = b""
        #: the request under way (its bytes, replayed if it is handed over)
        self._request = b""
        self._busy = False
        #: of the request being read: its head's length, URL, headers, body length, claim
        self._head = 0
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._index: Headers = {}
        self._length = 0
        self._claimed: object | None = None
        self._keep_alive = True
        self._paused_reading = False
        self._paused_writing = False
        self._lost = False
        self._handed_over = False
        #: answered, nothing of a next request yet (the keep-alive time runs)
        self._idle = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        if len(self.connections) >= self.limits.max_connections:
            self._hand_over(adopted=False)  # to be refused there
            return
        self.connections.add(self)  # type: ignore[arg-type]
        self._clock.arm(self.limits.header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._clock.cancel()
        self.connections.discard(self)

    def pause_writing(self) -> None:
        self._paused_writing = True

    def resume_writing(self) -> None:
        self._paused_writing = False

    def data_received(self, data: bytes) -> None:
        if self._buffer:
            self._buffer += data
        else:
            self._buffer = data
            if self._idle:  # a later request's first bytes: its head is due in time
                self._idle = False
                self._clock.arm(self.limits.header_timeout)
        if not self._busy:
            self._next()
        elif len(self._buffer) > WAITING_MAX and not self._paused_reading:
            self._paused_reading = True
            self._transport.pause_reading()

    def shutdown(self) -> None:
        """The server shuts down: closed now when idle, else after the answer to the request
        under way (or whose body is arriving)."""
        if self._busy or self._head:
            self._keep_alive = False
        else:
            self._transport.close()

    # reading requests

    def _next(self) -> None:
        """Take the next request from the buffer, if it is all there (or hand over)."""
        buffer = self._buffer
        if not buffer:
            return
        if not self._head:
            if not buffer.startswith(self.express.head_prefixes):
                if not any(p.startswith(buffer) for p in self.express.head_prefixes):
                    self._hand_over()
                return  # the request line so far could still be one of them
            end = buffer.find(b"\r\n\r\n", 0, HEAD_MAX)
            if end < 0:
                if len(buffer) >= HEAD_MAX or buffer.find(b"\n\n") >= 0:
                    self._hand_over()  # too long, or lines not ended as this takes them
                return
            self._head = end + 4
            self._url, self._headers = b"", []
            try:
                self.parser.feed_data(buffer[: self._head])
            except (httptools.HttpParserError, httptools.HttpParserUpgrade):
                self._hand_over()  # uvicorn's protocol answers it
                return
            if self._claimed is None:
                self._hand_over()
                return
            if len(buffer) < self._head + self._length:
                self._clock.arm(self.limits.body_timeout)  # the body is due in time
        end = self._head + self._length
        if len(buffer) < end:
            return
        body = buffer[self._head : end]
        try:
            if body:
                self.parser.feed_data(body)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            self._hand_over()
            return
        self._request, self._buffer = buffer[:end], buffer[end:]
        claimed, headers = self._claimed, self._index
        self._head, self._claimed = 0, None
        self._busy = True
        self._clock.disarm()
        try:
            taken = self.express.run(claimed, headers, body, self)
        except Exception as exc:  # the ordinary way answers it (a 500 if it fails there too)
            log.error("Exception in the front protocol's express lane", exc_info=exc)
            taken = False
        if not taken:
            self._hand_over()

    # httptools parser callbacks (the head only: the claim is made when it is complete; what
    # they fill is emptied before each head is fed)

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        parser = self.parser
        if (
            parser.get_method() != b"POST"
            or parser.get_http_version() != "1.1"
            or parser.should_upgrade()
        ):
            return
        headers = self._headers
        index = self._index = dict(headers)
        length = _content_length(index) if len(index) == len(headers) else None
        if length is None or length > BODY_MAX:
            return
        self._claimed = self.express.claim_head(self._url, index)
        self._length = length
        self._keep_alive = self._keep_alive and parser.should_keep_alive()

    # answering (Front)

    def writable(self) -> bool:
        return not self._paused_writing

    def write(self, status: int, lines: bytes, body: bytes) -> None:
        if not self._busy:
            return  # answered already
        if not self._lost:
            default = self.server_state.default_headers
            self._transport.write(whole_answer(status, default, lines, self._keep_alive, body))
        self._answered()

    def abort(self) -> None:
        self._transport.close()
        if self._busy:
            self._answered()

    def resume(self, resume: Resume) -> bool:
        if self._lost:
            self._busy = False
            return False
        self._hand_over(resume)
        return True

    def _answered(self) -> None:
        self.server_state.total_requests += 1
        self._busy = False
        self._request = b""
        if self._lost or self._transport.is_closing():
            return
        if not self._keep_alive:
            self._transport.close()
            return
        if self._paused_reading:
            self._paused_reading = False
            self._transport.resume_reading()
        if self._buffer:
            # a request waiting behind this one: once what this one holds is released
            self._clock.arm(self.limits.header_timeout)
            self.loop.call_soon(self._waiting)
        else:
            self._idle = True
            self._clock.arm(self.limits.keepalive_timeout)

    def _waiting(self) -> None:
        if not self._busy and not self._handed_over and not self._lost:
            self._next()

    # handing over

    def _hand_over(self, resume: Resume | None = None, *, adopted: bool = True) -> None:
        """The connection to uvicorn's protocol, with the bytes of the request under way (if
        any) and all after it."""
        self._handed_over = True
        self._clock.cancel()
        self.connections.discard(self)
        transport = self._transport
        protocol = self.fallback(
            config=self.config,
            server_state=self.server_state,
            app_state=self.app_state,
            _loop=self.loop,
        )
        protocol.resume = resume
        protocol.adopted = adopted  # it takes this connection's place: not refused
        data = self._request + self._buffer
        if self._keep_alive and data.startswith(self.express.head_prefixes):
            protocol.home = type(self).come_back  # a request of the kind this one takes
        protocol.connection_made(transport)
        transport.set_protocol(protocol)
        if self._paused_writing:
            protocol.pause_writing()
        if self._paused_reading:
            transport.resume_reading()
        self._request = self._buffer = b""
        if data:
            protocol.data_received(data)
        if not self._keep_alive:
            protocol.shutdown()  # told already (shutdown, a deadline): closed after its answer

    @classmethod
    def come_back(cls, protocol: BoundedHttpToolsProtocol) -> None:
        """A connection handed over returns, idle between requests, from `protocol`."""
        front = cls(
            config=protocol.config,
            server_state=protocol.server_state,
            app_state=protocol.app_state,
            _loop=protocol.loop,
        )
        front.transport = protocol.transport
        front.connections.add(front)  # type: ignore[arg-type]
        front._paused_writing = protocol.flow.write_paused
        front._idle = True
        front._clock.arm(front.limits.keepalive_timeout)
        protocol.transport.set_protocol(front)

    @property
    def _transport(self) -> asyncio.Transport:
        assert self.transport is not None
        return self.transport

    def _deadline_passed(self) -> None:
        if self._busy:
            self._keep_alive = False  # closed once the answer under way is written
        elif self._head:
            # a claimed request's body is late: uvicorn's protocol has it from here, and
            # answers it as it answers any late body (408), within a body time of its own
            self._hand_over()
        elif not self._transport.is_closing():
            self._transport.close()


def whole_answer(
    status: int,
    default_headers: Sequence[tuple[bytes, bytes]],
    lines: bytes,
    keep_alive: bool,
    body: bytes,
) -> bytes:
    """A whole HTTP/1.1 answer as uvicorn's protocol writes one: status line, the server's own
    headers, header `lines` (each ending in CRLF), `connection: close` unless kept alive."""
    if _server_lines[0] is not default_headers:
        # uvicorn makes a new list of them every second (its date header): as lines once
        server = b"".join([name + b": " + value + b"\r\n" for name, value in default_headers])
        _server_lines[:] = [default_headers, server]
    return b"".join(
        (
            STATUS_LINE.get(status) or b"HTTP/1.1 %d \r\n" % status,
            _server_lines[1],
            lines,
            b"" if keep_alive else b"connection: close\r\n",
            b"\r\n",
            body,
        )
    )


#: the server's own headers last written, and as header lines
_server_lines: list[Any] = [None, b""]


def _content_length(headers: Headers) -> int | None:
    """The body length a request's headers give, if they give one, no other framing and no
    `Expect` (a client waiting for `100 Continue` goes to uvicorn's protocol, which sends
    it)."""
    value = headers.get(b"content-length")
    length = None if value is None else natural(value)
    if length is None or b"transfer-encoding" in headers or b"expect" in headers:
        return None
    return length


def http_protocol(limits: ConnectionLimits, express: Express | None) -> type[asyncio.Protocol]:
    """The protocol class for `uvicorn.run(http=...)`: the front protocol when the express
    lane claims requests from their head, else uvicorn's (bounded) protocol."""
    fallback = bounded_protocol(limits, express)
    if express is None or not hasattr(express, "claim_head"):
        return fallback
    attributes = {"limits": limits, "express": express, "fallback": fallback}
    return type(FrontProtocol.__name__, (FrontProtocol,), attributes)
