"""A lean keep-alive HTTP/1.1 client for workers reached over plain HTTP (a simulated
cluster's upstream, a Service by cluster DNS): the hot path of every invocation.

httpx costs more per request than the rest of an invocation together (request and URL
models, cookie extraction, the connection pool's bookkeeping); this client writes the request
in one write and parses the answer with httptools (uvicorn's C parser) right in its protocol's
`data_received` (no stream buffers between the socket and the parser), waking the waiting
request once the head has arrived and streaming the body as it arrives (reading pauses while
more than `HIGH_WATER` bytes wait to be taken). Connections are kept per host and port and
reused while fresh. A refused connection is `WorkerUnreachable`; anything after the request
was written is `WorkerFailed`, and the request is never written again (the worker may have
received it). An answer is taken only as it is framed: a head over its bounds (and, after the
head, chunk-size lines or a trailer section over the same bounds), a status outside 200-599
(or 101), bytes past the end of the answer or fewer than it declared fail the request, and the
connection is never reused. Trailer fields are read past, never kept: they are not headers.
HTTPS goes through httpx (`HttpxEndpoint`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools

from service.backends.worker import (
    CONNECT_TIMEOUT,
    WorkerEndpoint,
    WorkerFailed,
    WorkerResponse,
    WorkerUnreachable,
    header_lines,
)

#: idle connections kept per worker address
MAX_IDLE = 512
#: bytes of an answer's body waiting to be taken before reading pauses (resumes below a quarter)
HIGH_WATER = 256 * 1024
_CLOSED = "the worker closed the connection without answering"
#: a worker answer's head (status line and headers, interim answers included): its bytes,
#: counted by reads (so at most one read more), and its header lines; beyond, 502. The same
#: bounds hold after the head for the bytes between body bytes (chunk-size lines with their
#: extensions, the trailer section) and for the trailer's lines.
MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 100


@dataclass(frozen=True)
class AnswerBounds:
    """What a worker answer's head may hold (`NVCF_INVOKE_WORKER_MAX_HEAD_BYTES`, `..._HEADERS`)."""

    max_head_bytes: int = MAX_HEAD_BYTES
    max_headers: int = MAX_HEADERS


#: seconds an idle connection is reused for (below the shortest keep-alive time of common
#: servers: gunicorn's 2 s)
IDLE_SECONDS = 1.5
#: request headers the client writes itself
_OWN = frozenset({"host", "content-length", "transfer-encoding", "connection"})


class _Answer:
    """One response as its connection's parser reads it."""

    __slots__ = (
        "arrived",
        "body",
        "buffered",
        "chunked",
        "complete",
        "head_bytes",
        "header_count",
        "headers_done",
        "keep_alive",
        "length",
        "raw_headers",
        "status",
        "trailer_count",
    )

    def __init__(self) -> None:
        self.status = 0
        self.keep_alive = False
        #: as they came (names in the worker's case)
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.body: deque[bytes] = deque()
        self.buffered = 0
        self.headers_done = False
        #: bytes read while its head was incomplete (after it: read with no body byte since
        #: the last body bytes), and its header lines so far
        self.head_bytes = 0
        self.header_count = 0
        self.complete = False
        self.length: int | None = None
        self.chunked = False
        #: body bytes arrived (all told), and trailer lines so far
        self.arrived = 0
        self.trailer_count = 0

    def take(self) -> bytes:
        """The body arrived so far, whole, no longer kept here."""
        body = b"".join(self.body)
        self.body.clear()
        self.buffered = 0
        return body


class _Connection(asyncio.Protocol):
    """One keep-alive connection to a worker. Its one parser (made with the connection:
    making one per answer looks its callbacks up each time) is fed in `data_received`, and
    its callbacks, the connection's own, fill the current answer; the request waiting on the
    connection is woken by whatever happens."""

    # the parser callbacks it has none for, named (the parser looks each up: a missing
    # attribute would cost an AttributeError made and dropped)
    on_status = on_chunk_header = on_chunk_complete = None

    def __init__(
        self, max_head_bytes: int = MAX_HEAD_BYTES, max_headers: int = MAX_HEADERS
    ) -> None:
        self.max_head_bytes = max_head_bytes
        self.max_headers = max_headers
        self.transport: asyncio.Transport | None = None
        self.reused = False
        #: loop time it was last given back idle
        self.idle_since = 0.0
        #: the stream ended (end of file, or the connection was lost)
        self.ended = False
        #: why the answer cannot be read any further (not valid HTTP), or the socket's error
        self.invalid: str | None = None
        self.lost: str | None = None
        #: bytes arrived since the current request was sent
        self.received = False
        #: made at `connection_made`, dropped at `connection_lost` (it holds the connection)
        self.parser: httptools.HttpResponseParser | None = None
        #: the answer being read, between `begin` and `end`
        self.answer: _Answer | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        #: the message being read is an interim (1xx) answer
        self._interim = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.parser = httptools.HttpResponseParser(self)

    def data_received(self, data: bytes) -> None:
        parser, answer = self.parser, self.answer
        if parser is None or answer is None or self.invalid is not None:
            self.ended = True  # bytes nobody asked for: the connection cannot be reused
            self.close()
            return
        self.received = True
        after_head, arrived = answer.headers_done, answer.arrived
        try:
            parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self.invalid is None:
                self.invalid = f"the worker's answer is not valid HTTP: {exc}"
            self.close()
        if self.invalid is not None or answer.complete:
            pass
        elif not answer.headers_done:
            answer.head_bytes += len(data)
            if answer.head_bytes > self.max_head_bytes:
                self.invalid = f"the worker's answer head is over {self.max_head_bytes} bytes"
                self.close()
        elif after_head:
            # a read with no body byte is all framing (a chunk-size line and its extensions,
            # the trailer section): counted until body bytes come again, bounded like a head
            # (httptools gathers a trailer line whole, by concatenation)
            if answer.arrived > arrived:
                answer.head_bytes = 0
            else:
                answer.head_bytes += len(data)
                if answer.head_bytes > self.max_head_bytes:
                    self.invalid = (
                        "the worker's answer has over "
                        f"{self.max_head_bytes} bytes of chunk framing or trailer fields"
                    )
                    self.close()
        if answer.buffered > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool | None:
        self.ended = True
        self._wake()
        return None  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        self.parser = None
        if isinstance(exc, OSError):
            self.lost = exc.strerror or str(exc)
        self._wake()

    # httptools callbacks: the current answer's parts

    def _refuse(self, why: str) -> None:
        """The answer cannot be taken as it is: the parser stops here and the request fails."""
        self.invalid = why
        raise _Refused(why)

    def on_message_begin(self) -> None:
        answer = self.answer
        assert answer is not None  # (fed only while there is one)
        if answer.complete:
            self._refuse("the worker sent bytes past the end of its answer")

    def on_header(self, name: bytes, value: bytes) -> None:
        answer = self.answer
        assert answer is not None
        if answer.headers_done:  # a trailer field: read past, never a header
            answer.trailer_count += 1
            if answer.trailer_count > self.max_headers:
                self._refuse(f"the worker's answer has over {self.max_headers} trailer lines")
            return
        answer.header_count += 1
        if answer.header_count > self.max_headers:
            self._refuse(f"the worker's answer has over {self.max_headers} header lines")
        lowered = name.lower()
        if lowered == b"content-length":
            with contextlib.suppress(ValueError):
                answer.length = int(value)
        elif lowered == b"transfer-encoding" and value.lower().find(b"chunked") >= 0:
            answer.chunked = True
        answer.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        answer, parser = self.answer, self.parser
        assert answer is not None and parser is not None
        status = parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            # an interim answer (103 Early Hints, an unasked 100 Continue): not the answer;
            # the final one follows on the connection
            self._interim = True
            answer.raw_headers = []
            answer.length, answer.chunked = None, False
            return
        if not 200 <= status <= 599:
            # 101: no request to a worker asks to switch protocols
            self._refuse(f"the worker answered with status {status}, which is not an answer")
        answer.headers_done = True
        answer.head_bytes = 0  # from now on: the framing bytes between body bytes
        # asked now: once the message is complete the parser has moved on to the next
        answer.status = status
        answer.keep_alive = parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        answer = self.answer
        assert answer is not None
        chunk = bytes(body)
        answer.body.append(chunk)
        answer.buffered += len(chunk)
        answer.arrived += len(chunk)

    def on_message_complete(self) -> None:
        answer = self.answer
        assert answer is not None
        if self._interim:
            self._interim = False
            return
        answer.complete = True

    # the request's side

    def begin(self, answer: _Answer) -> None:
        self.answer, self.received = answer, False

    def end(self) -> None:
        """The current answer is over: the connection reads again if it had paused."""
        self.answer = None
        if self._paused:
            self._paused = False
            if self.transport is not None:
                self.transport.resume_reading()

    async def wait(self) -> None:
        """Until something happens on the connection (bytes, end of stream)."""
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def taken(self, answer: _Answer) -> None:
        """Body bytes were taken: reading resumes once few are left waiting."""
        if self._paused and answer.buffered <= HIGH_WATER // 4 and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    @property
    def usable(self) -> bool:
        transport = self.transport
        return (
            transport is not None
            and not transport.is_closing()
            and not self.ended
            and self.invalid is None
        )

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def discard(self) -> None:
        """Done with for good: the answer is over and the connection closed."""
        self.end()
        self.close()


class Http1Pool:
    """Keep-alive connections per (host, port); `aclose()` closes the idle ones. A connection
    idle for `IDLE_SECONDS` is not reused (a worker may be closing it just then, and a request
    written is never sent again); the bounds of a worker's answer head apply to each."""

    def __init__(
        self,
        *,
        max_idle: int = MAX_IDLE,
        bounds: AnswerBounds | None = None,
    ) -> None:
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._max_idle = max_idle
        bounds = bounds or AnswerBounds()
        self._factory = functools.partial(_Connection, bounds.max_head_bytes, bounds.max_headers)

    def idle(self, host: str, port: int) -> _Connection | None:
        """A kept-alive connection to (host, port) ready for a request, if there is one."""
        idle = self._idle.get((host, port))
        if not idle:
            return None
        oldest = asyncio.get_running_loop().time() - IDLE_SECONDS
        while idle:
            conn = idle.pop()
            if conn.usable and conn.idle_since >= oldest:
                conn.reused = True
                return conn
            conn.close()
        return None

    async def connect(self, host: str, port: int) -> _Connection:
        conn = self.idle(host, port)
        if conn is not None:
            return conn
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                _, conn = await loop.create_connection(self._factory, host, port)
        except TimeoutError as exc:
            raise WorkerUnreachable(
                f"connecting to {host}:{port} timed out after {CONNECT_TIMEOUT:g} s"
            ) from exc
        except ConnectionRefusedError as exc:
            raise WorkerUnreachable(f"connecting to {host}:{port}: connection refused") from exc
        except OSError as exc:
            reason = str(exc) or type(exc).__name__
            raise WorkerUnreachable(f"connecting to {host}:{port}: {reason}") from exc
        return conn

    def give_back(self, host: str, port: int, conn: _Connection) -> None:
        conn.end()
        idle = self._idle.setdefault((host, port), [])
        if len(idle) < self._max_idle and conn.usable:
            conn.idle_since = asyncio.get_running_loop().time()
            idle.append(conn)
        else:
            conn.close()

    async def aclose(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()


class _Http1Response(WorkerResponse):
    def __init__(
        self,
        pool: Http1Pool,
        address: tuple[str, int],
        conn: _Connection,
        answer: _Answer,
        *,
        head: bool,
    ) -> None:
        self.status = answer.status
        self._raw = answer.raw_headers
        self._headers: list[tuple[str, str]] | None = None
        self._pool = pool
        self._address = address
        self._conn: _Connection | None = conn
        self._answer = answer
        self._keep = answer.keep_alive and not head
        if head or self.status in (101, 204, 304):
            answer.complete = True
            answer.body.clear()

    @property
    def raw_headers(self) -> list[tuple[bytes, bytes]]:
        return self._raw

    @property
    def headers(self) -> list[tuple[str, str]]:
        if self._headers is None:
            raw = self._raw
            self._headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in raw]
        return self._headers

    @headers.setter
    def headers(self, value: list[tuple[str, str]]) -> None:
        self._headers = value

    async def iter_bytes(self) -> AsyncIterator[bytes]:
        answer = self._answer
        while True:
            conn = self._conn
            while answer.body:
                chunk = answer.body.popleft()
                answer.buffered -= len(chunk)
                if conn is not None:
                    conn.taken(answer)
                yield chunk
            if answer.complete:
                self._finish()
                return
            if conn is None:
                raise WorkerFailed("the answer was already read")
            if conn.invalid is not None:
                self._drop()
                raise WorkerFailed(conn.invalid)
            if conn.ended:
                if answer.length is None and not answer.chunked:
                    answer.complete = True  # the answer ends with the connection
                    self._keep = False
                    continue
                self._drop()
                if conn.lost is not None:
                    raise WorkerFailed(f"reading the answer: {conn.lost}")
                raise WorkerFailed("the worker closed the connection in the middle of its answer")
            await conn.wait()

    def complete_body(self) -> bytes | None:
        answer = self._answer
        if not answer.complete:
            return None
        body = answer.take()
        self._finish()
        return body

    def _finish(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._keep:
            self._pool.give_back(*self._address, conn)
        else:
            conn.discard()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.discard()

    async def aclose(self) -> None:
        if self._answer.complete and not self._answer.body:
            self._finish()
        else:
            self._drop()  # not read to the end: the connection cannot be reused


@functools.lru_cache(maxsize=4096)
def _address(base_url: str) -> tuple[str, int, str, bytes]:
    """(host, port, path prefix, Host header) of a plain HTTP base URL, parsed once per URL
    (an endpoint is made for every request)."""
    parts = urlsplit(base_url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"{base_url!r} is not a plain HTTP address")
    return parts.hostname, parts.port or 80, parts.path, parts.netloc.encode("latin-1")


class Http1Endpoint(WorkerEndpoint):
    """A worker at `http://host:port[/prefix]`, through `pool`."""

    def __init__(self, base_url: str, pool: Http1Pool, *, health_url: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.health_url = health_url
        self._host, self._port, self._prefix, self._host_header = _address(self.base_url)
        self._pool = pool

    async def send(
        self, method: str, path: str, headers: Sequence[tuple[str, str]], body: bytes
    ) -> WorkerResponse:
        request = self._request(method, path, headers, body)
        return await self._send(request, head=method == "HEAD")

    def _request(
        self, method: str, path: str, headers: Sequence[tuple[str, str]], body: bytes
    ) -> bytes:
        return self._message(method, path, header_lines(headers, _OWN), body)

    def _message(self, method: str, path: str, lines: bytes, body: bytes) -> bytes:
        """The request: its line, `Host`, the header `lines` (none of `_OWN`), the length."""
        target = self._prefix + (path if path.startswith("/") else "/" + path)
        length = b""
        if body or method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
            length = b"content-length: %d\r\n" % len(body)
        start = f"{method} {target} HTTP/1.1\r\nhost: ".encode("latin-1")
        return b"".join((start, self._host_header, b"\r\n", lines, length, b"\r\n", body))

    async def _send(self, request: bytes, *, head: bool) -> WorkerResponse:
        conn = await self._pool.connect(self._host, self._port)
        return await self._head(conn, self._write(conn, request), head=head)

    @staticmethod
    def _write(conn: _Connection, request: bytes) -> _Answer:
        answer = _Answer()
        conn.begin(answer)
        assert conn.transport is not None
        conn.transport.write(request)
        return answer

    async def _head(
        self,
        conn: _Connection,
        answer: _Answer,
        *,
        head: bool,
    ) -> WorkerResponse:
        """The answer once its head has arrived. A request once written is never sent again:
        the worker may have received it, even when its connection was a reused one that
        ended before any byte of the answer."""
        while not answer.headers_done:
            if conn.invalid is not None:
                conn.discard()
                raise WorkerFailed(conn.invalid)
            if conn.ended:
                conn.discard()
                if conn.lost is not None and not conn.received:
                    raise WorkerFailed(f"sending the request: {conn.lost}")
                raise WorkerFailed(_CLOSED)
            try:
                await conn.wait()
            except BaseException:  # cancelled (a deadline): the answer will never be read
                conn.discard()
                raise
        if conn.invalid is not None and not answer.complete:
            # broken in the read that ended its head (a bad chunk, a trailer over its bounds):
            # failed before anything of it is handed over, so the caller gets a 502
            conn.discard()
            raise WorkerFailed(conn.invalid)
        return self._response(conn, answer, head=head)

    def _response(
        self,
        conn: _Connection,
        answer: _Answer,
        *,
        head: bool,
    ) -> WorkerResponse:
        """The answer on `conn`, its head arrived."""
        return _Http1Response(self._pool, (self._host, self._port), conn, answer, head=head)

    async def health(self) -> int:
        if self.health_url is None:
            raise WorkerFailed("the function declares no health endpoint")
        parts = urlsplit(self.health_url)
        endpoint = Http1Endpoint(f"http://{parts.netloc}", self._pool)
        response = await endpoint.send("GET", parts.path or "/", [], b"")
        try:
            await response.read(1 << 20)
        finally:
            await response.aclose()
        return response.status


class _Refused(Exception):
    """Raised from a parser callback: the answer breaks a rule (`_Connection.invalid`)."""
