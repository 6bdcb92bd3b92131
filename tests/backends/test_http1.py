"""The invocation plane's HTTP/1.1 client (service/backends/http1.py) against small raw
servers: keep-alive reuse, a kept-alive connection the server closed, chunked and
connection-delimited answers, HEAD, the two kinds of failure, and the bounds of what follows
an answer's head (chunk framing, trailers)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Awaitable, Callable

import httptools
import pytest

from service.backends.http1 import HIGH_WATER, AnswerBounds, Http1Endpoint, Http1Pool, _Connection
from service.backends.worker import WorkerFailed, WorkerResponse, WorkerUnreachable

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RawServer:
    """An asyncio server with a handler per connection; counts connections."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        finally:
            writer.close()

    async def __aenter__(self) -> RawServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes] | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head, await reader.readexactly(length)


async def keep_alive_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while (request := await read_request(reader)) is not None:
        head, body = request
        answer = head.split(b"\r\n")[0] + b"|" + body
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(answer), answer))
        await writer.drain()


@pytest.fixture
async def pool() -> AsyncIterator[Http1Pool]:
    p = Http1Pool()
    yield p
    await p.aclose()


async def call(endpoint: Http1Endpoint, method: str = "POST", body: bytes = b"x") -> bytes:
    response = await endpoint.send(method, "/echo?q=1", [("X-Test", "1")], body)
    try:
        return await response.read(1 << 20)
    finally:
        await response.aclose()


async def test_connections_are_kept_alive_and_reused(pool: Http1Pool) -> None:
    async with RawServer(keep_alive_echo) as server:
        endpoint = Http1Endpoint(server.url + "/prefix", pool)
        for i in range(3):
            assert await call(endpoint, body=str(i).encode()) == (
                b"POST /prefix/echo?q=1 HTTP/1.1|" + str(i).encode()
            )
        assert server.connections == 1


async def test_answers_are_freed_without_the_cyclic_garbage_collector(pool: Http1Pool) -> None:
    async with RawServer(keep_alive_echo) as server:
        endpoint = Http1Endpoint(server.url, pool)
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds stays in gc.garbage
        try:
            for _ in range(3):
                assert await call(endpoint) == b"POST /echo?q=1 HTTP/1.1|x"
            gc.collect()
            parsers = [o for o in gc.garbage if isinstance(o, httptools.HttpResponseParser)]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
        assert parsers == []


async def test_a_kept_alive_connection_the_server_closed_is_replaced(pool: Http1Pool) -> None:
    async def one_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await keep_alive_echo_once(reader, writer)

    async with RawServer(one_then_close) as server:
        endpoint = Http1Endpoint(server.url, pool)
        assert await call(endpoint) == b"POST /echo?q=1 HTTP/1.1|x"
        await asyncio.sleep(0.05)  # the server has closed its side meanwhile
        assert await call(endpoint) == b"POST /echo?q=1 HTTP/1.1|x"
        assert server.connections == 2


async def keep_alive_echo_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    request = await read_request(reader)
    assert request is not None
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 25\r\n\r\nPOST /echo?q=1 HTTP/1.1|x")
    await writer.drain()


async def test_chunked_answers_stream_and_connection_delimited_ones_end_with_it(
    pool: Http1Pool,
) -> None:
    gate = asyncio.Event()

    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await gate.wait()
        writer.write(b"6\r\nsecond\r\n0\r\n\r\n")
        await writer.drain()

    async with RawServer(chunked) as server:
        response = await Http1Endpoint(server.url, pool).send("GET", "/", [], b"")
        chunks = response.iter_bytes()
        assert await chunks.__anext__() == b"first"  # before the server wrote the rest
        gate.set()
        assert [c async for c in chunks] == [b"second"]
        await response.aclose()

    async def until_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it")
        await writer.drain()

    async with RawServer(until_close) as server:
        assert await call(Http1Endpoint(server.url, pool)) == b"all of it"


async def test_head_has_no_body(pool: Http1Pool) -> None:
    async def head(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    async with RawServer(head) as server:
        response = await Http1Endpoint(server.url, pool).send("HEAD", "/", [], b"")
        assert response.status == 200 and await response.read(100) == b""


async def test_interim_answers_are_not_the_answer(pool: Http1Pool) -> None:
    async def hints_then_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await read_request(reader) is not None:
            writer.write(b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.02)  # the interim head arrives alone first
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            writer.write(b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\nx-final: 1\r\n\r\nok")
            await writer.drain()

    async with RawServer(hints_then_answer) as server:
        endpoint = Http1Endpoint(server.url, pool)
        response = await endpoint.send("POST", "/", [], b"x")
        assert response.status == 201
        assert response.headers == [("content-length", "2"), ("x-final", "1")]
        assert await response.read(100) == b"ok"
        await response.aclose()
        # the connection goes on (kept alive)
        again = await endpoint.send("POST", "/", [], b"y")
        assert again.status == 201 and await again.read(100) == b"ok"
        await again.aclose()
        assert server.connections == 1


async def test_refused_is_unreachable_and_a_broken_answer_failed(pool: Http1Pool) -> None:
    async with RawServer(keep_alive_echo) as server:
        url = server.url
    with pytest.raises(WorkerUnreachable, match="connection refused"):
        await call(Http1Endpoint(url, pool))

    async def half(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly this")
        await writer.drain()

    async with RawServer(half) as server:
        with pytest.raises(WorkerFailed, match="in the middle of its answer"):
            await call(Http1Endpoint(server.url, pool))

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    async with RawServer(silent) as server:
        with pytest.raises(WorkerFailed, match="without answering"):
            await call(Http1Endpoint(server.url, pool))

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()

    async with RawServer(garbage) as server:
        with pytest.raises(WorkerFailed, match="not valid HTTP"):
            await call(Http1Endpoint(server.url, pool))


async def test_a_large_answer_is_read_no_faster_than_it_is_taken(pool: Http1Pool) -> None:
    size = 4 << 20

    async def large(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size)
        for _ in range(size // 65536):
            writer.write(b"x" * 65536)
            await writer.drain()

    async with RawServer(large) as server:
        response = await Http1Endpoint(server.url, pool).send("GET", "/", [], b"")
        chunks = response.iter_bytes()
        got = len(await chunks.__anext__())
        await asyncio.sleep(0.3)  # the server could have sent it all by now
        waiting = response._answer.buffered  # type: ignore[attr-defined]
        assert waiting <= HIGH_WATER + (1 << 20) < size
        got += sum([len(c) async for c in chunks])
        assert got == size
        await response.aclose()


class _Transport(asyncio.Transport):
    """A transport that remembers what was written and whether reading is paused."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.paused = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


async def test_a_connection_paused_by_a_large_answer_reads_again_once_given_back(
    pool: Http1Pool,
) -> None:
    endpoint = Http1Endpoint("http://127.0.0.1:9", pool)
    conn, transport = _Connection(), _Transport()
    conn.connection_made(transport)
    pool.give_back("127.0.0.1", 9, conn)
    sending = asyncio.create_task(endpoint.send("GET", "/big", [], b""))
    await asyncio.sleep(0)  # written on the idle connection
    body = b"x" * (HIGH_WATER + 1000)
    # the whole answer in one read: complete, and more than HIGH_WATER waiting to be taken
    conn.data_received(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
    response = await sending
    assert transport.paused
    assert response.complete_body() == body
    # back in the pool, reading again: the next request's answer is read
    assert not transport.paused
    sending = asyncio.create_task(endpoint.send("GET", "/small", [], b""))
    await asyncio.sleep(0)
    conn.data_received(b"HTTP/1.1 204 No Content\r\n\r\n")
    assert (await sending).status == 204


async def test_the_answer_bounds_are_the_pools() -> None:
    async def twenty_headers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await read_request(reader) is not None:
            lines = b"".join(b"x-h%d: v\r\n" % i for i in range(20))
            writer.write(b"HTTP/1.1 200 OK\r\n" + lines + b"content-length: 0\r\n\r\n")
            await writer.drain()

    async with RawServer(twenty_headers) as server:
        roomy = Http1Pool(bounds=AnswerBounds(max_headers=30))
        response = await Http1Endpoint(server.url, roomy).send("GET", "/", [], b"")
        assert response.status == 200
        await response.aclose()
        strict = Http1Pool(bounds=AnswerBounds(max_headers=10))
        with pytest.raises(WorkerFailed, match="over 10 header lines"):
            await Http1Endpoint(server.url, strict).send("GET", "/", [], b"")
        await roomy.aclose()
        await strict.aclose()


class _ClosingTransport(_Transport):
    """A `_Transport` that also remembers being closed."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


async def _on_fed_connection(
    pool: Http1Pool, conn: _Connection, first: bytes
) -> tuple[_ClosingTransport, Awaitable[object]]:
    """A GET written on `conn` (an idle connection of `pool`), and `first` fed as the first
    read of its answer: (the transport, the `send` under way)."""
    transport = _ClosingTransport()
    conn.connection_made(transport)
    pool.give_back("127.0.0.1", 9, conn)
    sending = asyncio.create_task(
        Http1Endpoint("http://127.0.0.1:9", pool).send("GET", "/", [], b"")
    )
    await asyncio.sleep(0)  # written on the idle connection
    conn.data_received(first)
    return transport, sending


CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"


@pytest.mark.parametrize(
    ("after", "between", "end"),
    [
        (b"5\r\nhello\r\n0\r\nx-trailer: ", b"a", b"\r\n\r\n"),  # one trailer line
        (b"5\r\nhello\r\n0\r\n", b"x: 1\r\n", b"\r\n"),  # many short ones
        (b"5\r\nhello\r\n5;ext=", b"e", b"\r\nworld\r\n0\r\n\r\n"),  # a chunk extension
    ],
    ids=["trailer", "trailer-lines", "chunk-extension"],
)
async def test_d18_framing_after_the_head_is_bounded_like_the_head(
    after: bytes, between: bytes, end: bytes
) -> None:
    """D18: a chunked answer's trailer section (or a chunk-size line) over the head's byte
    bound fails the answer, and the connection is closed, never reused."""
    pool = Http1Pool(bounds=AnswerBounds(max_head_bytes=4096, max_headers=10_000))
    conn = _Connection(4096, 10_000)
    transport, sending = await _on_fed_connection(pool, conn, CHUNKED_HEAD + after)
    response = await sending
    assert isinstance(response, WorkerResponse)
    chunks = response.iter_bytes()
    assert await chunks.__anext__() == b"hello"
    fed = 0
    while fed <= 3 * 4096 and not transport.closed:  # reads of 1 KiB, 12 KiB at most
        conn.data_received(between * (1024 // len(between)))
        fed += 1024
    conn.data_received(end)  # were it taken, the answer would end here
    with pytest.raises(WorkerFailed, match="over 4096 bytes"):
        async for _ in chunks:
            pass
    assert transport.closed and pool.idle("127.0.0.1", 9) is None
    await pool.aclose()


async def test_d18_trailer_lines_are_bounded_like_header_lines() -> None:
    """D18: more trailer lines than NVCF_INVOKE_WORKER_MAX_HEADERS fail the answer."""
    pool = Http1Pool(bounds=AnswerBounds(max_headers=10))
    trailer = b"".join(b"x-t%d: v\r\n" % i for i in range(11))
    first = CHUNKED_HEAD + b"5\r\nhello\r\n0\r\n" + trailer + b"\r\n"
    transport, sending = await _on_fed_connection(pool, _Connection(max_headers=10), first)
    with pytest.raises(WorkerFailed, match="over 10 trailer lines"):
        response = await sending
        assert isinstance(response, WorkerResponse)
        await response.read(100)
    assert transport.closed
    await pool.aclose()


async def test_d23_trailers_never_become_headers(pool: Http1Pool) -> None:
    """D23: a worker's trailer fields are dropped, never added to its answer's headers."""
    trailer = b"set-cookie: s=1\r\nlocation: /elsewhere\r\nx-request-id: forged\r\n\r\n"
    first = CHUNKED_HEAD + b"2\r\nok\r\n0\r\n" + trailer
    transport, sending = await _on_fed_connection(pool, _Connection(), first)
    response = await sending
    assert isinstance(response, WorkerResponse)
    assert await response.read(100) == b"ok"
    assert response.headers == [("transfer-encoding", "chunked")]
    await response.aclose()
    assert not transport.closed  # the answer was whole: the connection goes on


async def test_a_framing_error_in_the_heads_own_read_fails_before_the_head(
    pool: Http1Pool,
) -> None:
    """A valid head and a broken chunk in one read: the answer fails before its head is
    handed over (the caller gets a 502, not a 200 cut short)."""
    first = CHUNKED_HEAD + b"5\r\nhello\r\nzz\r\n"
    transport, sending = await _on_fed_connection(pool, _Connection(), first)
    with pytest.raises(WorkerFailed, match="not valid HTTP"):
        await sending
    assert transport.closed
