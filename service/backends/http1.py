"""A lean keep-alive HTTP/1.1 client for workers reached over plain HTTP (a simulated
cluster's upstream, a Service by cluster DNS): the hot path of every invocation.

httpx costs more per request than the rest of an invocation together (request and URL
models, cookie extraction, the connection pool's bookkeeping); this client writes the request
in one write and parses the answer with httptools (uvicorn's C parser), streaming the body as
it arrives. Connections are kept per host and port and reused. A reused connection the
server closed while idle shows up as an end of stream before any byte of the answer: the
request is sent again once on a new connection (nothing reached the worker). A refused
connection is `WorkerUnreachable`; anything after the request was written is `WorkerFailed`.
HTTPS goes through httpx (`HttpxEndpoint`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import deque
from collections.abc import AsyncIterator, Sequence
from urllib.parse import urlsplit

import httptools

from service.backends.worker import (
    CONNECT_TIMEOUT,
    WorkerEndpoint,
    WorkerFailed,
    WorkerResponse,
    WorkerUnreachable,
)

#: idle connections kept per worker address
MAX_IDLE = 512
READ_SIZE = 65536
_CLOSED = "the worker closed the connection without answering"
#: request headers the client writes itself
_OWN = frozenset({"host", "content-length", "transfer-encoding", "connection"})


class _Answer:
    """httptools callbacks for one response."""

    __slots__ = (
        "body",
        "chunked",
        "complete",
        "headers",
        "headers_done",
        "keep_alive",
        "length",
        "parser",
    )

    def __init__(self) -> None:
        self.parser: httptools.HttpResponseParser | None = None
        self.keep_alive = False
        self.headers: list[tuple[str, str]] = []
        self.body: deque[bytes] = deque()
        self.headers_done = False
        self.complete = False
        self.length: int | None = None
        self.chunked = False

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1")
        text = value.decode("latin-1")
        lowered = key.lower()
        if lowered == "content-length":
            with contextlib.suppress(ValueError):
                self.length = int(text)
        elif lowered == "transfer-encoding" and "chunked" in text.lower():
            self.chunked = True
        self.headers.append((key, text))

    def on_headers_complete(self) -> None:
        self.headers_done = True
        # asked now: once the message is complete the parser no longer knows; then the
        # reference is dropped, so that answer and parser (which holds our callbacks) are
        # freed by reference counting instead of waiting for the cyclic garbage collector
        parser, self.parser = self.parser, None
        self.keep_alive = parser is not None and parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self.body.append(bytes(body))

    def on_message_complete(self) -> None:
        self.complete = True


class _Connection:
    __slots__ = ("reader", "reused", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.reused = False

    @property
    def usable(self) -> bool:
        return not self.writer.is_closing() and not self.reader.at_eof()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class Http1Pool:
    """Keep-alive connections per (host, port); `aclose()` closes the idle ones."""

    def __init__(self, *, max_idle: int = MAX_IDLE) -> None:
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._max_idle = max_idle

    async def connect(self, host: str, port: int) -> _Connection:
        idle = self._idle.get((host, port))
        while idle:
            conn = idle.pop()
            if conn.usable:
                conn.reused = True
                return conn
            conn.close()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                reader, writer = await asyncio.open_connection(host, port, limit=READ_SIZE)
        except TimeoutError as exc:
            raise WorkerUnreachable(
                f"connecting to {host}:{port} timed out after {CONNECT_TIMEOUT:g} s"
            ) from exc
        except ConnectionRefusedError as exc:
            raise WorkerUnreachable(f"connecting to {host}:{port}: connection refused") from exc
        except OSError as exc:
            reason = str(exc) or type(exc).__name__
            raise WorkerUnreachable(f"connecting to {host}:{port}: {reason}") from exc
        return _Connection(reader, writer)

    def give_back(self, host: str, port: int, conn: _Connection) -> None:
        idle = self._idle.setdefault((host, port), [])
        if len(idle) < self._max_idle and conn.usable:
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
        parser: httptools.HttpResponseParser,
        answer: _Answer,
        *,
        head: bool,
    ) -> None:
        self.status = parser.get_status_code()
        self.headers = answer.headers
        self._pool = pool
        self._address = address
        self._conn: _Connection | None = conn
        self._parser = parser
        self._answer = answer
        self._keep = answer.keep_alive and not head
        if head or self.status in (204, 304) or 100 <= self.status < 200:
            answer.complete = True
            answer.body.clear()

    async def iter_bytes(self) -> AsyncIterator[bytes]:
        answer = self._answer
        while True:
            while answer.body:
                yield answer.body.popleft()
            if answer.complete:
                self._finish()
                return
            conn = self._conn
            if conn is None:
                raise WorkerFailed("the answer was already read")
            try:
                data = await conn.reader.read(READ_SIZE)
            except OSError as exc:
                self._drop()
                raise WorkerFailed(f"reading the answer: {exc.strerror or exc}") from exc
            if not data:
                if answer.length is None and not answer.chunked:
                    answer.complete = True  # the answer ends with the connection
                    self._keep = False
                    continue
                self._drop()
                raise WorkerFailed("the worker closed the connection in the middle of its answer")
            try:
                self._parser.feed_data(data)
            except httptools.HttpParserError as exc:
                self._drop()
                raise WorkerFailed(f"the worker's answer is not valid HTTP: {exc}") from exc

    def complete_body(self) -> bytes | None:
        answer = self._answer
        if not answer.complete:
            return None
        body = b"".join(answer.body)
        answer.body.clear()
        self._finish()
        return body

    def _finish(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._keep:
            self._pool.give_back(*self._address, conn)
        else:
            conn.close()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

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
        target = self._prefix + (path if path.startswith("/") else "/" + path)
        lines = [f"{method} {target} HTTP/1.1".encode("latin-1"), b"host: " + self._host_header]
        for name, value in headers:
            if name.lower() not in _OWN:
                lines.append(f"{name}: {value}".encode("latin-1"))
        if body or method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
            lines.append(b"content-length: " + str(len(body)).encode())
        request = b"\r\n".join(lines) + b"\r\n\r\n" + body
        for attempt in (0, 1):
            conn = await self._pool.connect(self._host, self._port)
            try:
                return await self._exchange(conn, request, head=method == "HEAD")
            except _StaleConnection:
                conn.close()
                if attempt:
                    raise WorkerFailed(
                        "the worker closed the connection without answering"
                    ) from None
        raise AssertionError("unreachable")

    async def _exchange(self, conn: _Connection, request: bytes, *, head: bool) -> WorkerResponse:
        answer = _Answer()
        parser = httptools.HttpResponseParser(answer)
        answer.parser = parser
        try:
            conn.writer.write(request)
            received = False
            while not answer.headers_done:
                data = await conn.reader.read(READ_SIZE)
                if not data:
                    if conn.reused and not received:
                        raise _StaleConnection
                    raise WorkerFailed(_CLOSED)
                received = True
                parser.feed_data(data)
        except (_StaleConnection, WorkerFailed):
            conn.close()
            raise
        except httptools.HttpParserError as exc:
            conn.close()
            raise WorkerFailed(f"the worker's answer is not valid HTTP: {exc}") from exc
        except OSError as exc:
            conn.close()
            if conn.reused and not answer.headers:
                raise _StaleConnection from exc
            raise WorkerFailed(f"sending the request: {exc.strerror or exc}") from exc
        return _Http1Response(self._pool, (self._host, self._port), conn, parser, answer, head=head)

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


class _StaleConnection(Exception):
    """A kept-alive connection the server had closed: nothing was processed."""
