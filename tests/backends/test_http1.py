"""The invocation plane's HTTP/1.1 client (service/backends/http1.py) against small raw
servers: keep-alive reuse, a kept-alive connection the server closed, chunked and
connection-delimited answers, HEAD, and the two kinds of failure."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Awaitable, Callable

import httptools
import pytest

from service.backends.http1 import HIGH_WATER, Http1Endpoint, Http1Pool, _Connection
from service.backends.worker import WorkerExchange, WorkerFailed, WorkerUnreachable

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
        # the connection goes on (kept alive), and the callback way skips them too
        exchange = endpoint.begin("POST", "/", b"", b"y")
        assert exchange is not None
        await settled(exchange)
        head = exchange.head()
        assert head is not None and head[0] == 201
        assert [name for name, _ in head[1]] == [b"content-length", b"x-final"]
        assert exchange.take_body() == b"ok"
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


async def settled(exchange: WorkerExchange) -> int:
    """Waits, by the exchange's callback alone, until it has settled; how many calls."""
    done = asyncio.Event()
    calls = 0

    def notify() -> None:
        nonlocal calls
        calls += 1
        if exchange.settled and not exchange.arriving(1 << 16):
            done.set()

    exchange.listen(notify)
    await asyncio.wait_for(done.wait(), 30)
    exchange.listen(None)
    return calls


async def test_a_request_begun_without_waiting_is_followed_by_callbacks(pool: Http1Pool) -> None:
    async with RawServer(keep_alive_echo) as server:
        endpoint = Http1Endpoint(server.url, pool)
        # nothing is open yet: the caller must send the ordinary way
        assert endpoint.begin("POST", "/echo", b"x-test: 1\r\n", b"a") is None
        assert await call(endpoint) == b"POST /echo?q=1 HTTP/1.1|x"
        exchange = endpoint.begin("POST", "/echo", b"x-test: 1\r\n", b"b")
        assert exchange is not None
        assert await settled(exchange) >= 1
        response = exchange.response_now()
        assert response is not None and response.status == 200
        assert dict(response.raw_headers)[b"content-length"] == b"21"
        assert response.complete_body() == b"POST /echo HTTP/1.1|b"
        # the connection went back: the next request begins on it again
        again = endpoint.begin("GET", "/echo", b"", b"")
        assert again is not None
        await settled(again)
        answer = again.response_now()
        assert answer is not None and answer.complete_body() == b"GET /echo HTTP/1.1|"
        assert server.connections == 1


async def test_a_begun_request_whose_head_comes_first_is_arriving_until_its_body_has(
    pool: Http1Pool,
) -> None:
    body_sent = asyncio.Event()

    async def head_then_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await read_request(reader) is not None:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\n")
            await writer.drain()
            await body_sent.wait()
            body_sent.clear()
            writer.write(b"done")
            await writer.drain()

    async with RawServer(head_then_body) as server:
        endpoint = Http1Endpoint(server.url, pool)
        body_sent.set()
        assert await call(endpoint) == b"done"
        exchange = endpoint.begin("POST", "/", b"", b"")
        assert exchange is not None
        head = asyncio.Event()
        exchange.listen(lambda: head.set() if exchange.settled else None)
        await asyncio.wait_for(head.wait(), 30)
        assert exchange.arriving(1 << 16) and not exchange.arriving(3)  # larger than allowed
        body_sent.set()
        await settled(exchange)
        response = exchange.response_now()
        assert response is not None and response.complete_body() == b"done"


async def test_a_begun_request_is_taken_whole_from_its_head_and_body(pool: Http1Pool) -> None:
    async with RawServer(keep_alive_echo) as server:
        endpoint = Http1Endpoint(server.url, pool)
        await call(endpoint)
        exchange = endpoint.begin("POST", "/echo", b"", b"abc")
        assert exchange is not None
        assert exchange.head() is None and exchange.take_body() is None  # nothing came yet
        await settled(exchange)
        head = exchange.head()
        assert head is not None and head[0] == 200
        assert dict(head[1])[b"content-length"] == b"23"
        assert exchange.take_body() == b"POST /echo HTTP/1.1|abc"
        # taken: the connection is free for the next request
        assert endpoint.begin("GET", "/echo", b"", b"") is not None
        assert server.connections == 1


async def test_a_begun_request_whose_time_is_up_is_told_once_and_a_settled_one_never(
    pool: Http1Pool,
) -> None:
    release = asyncio.Event()

    async def slow_second(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        count = 0
        while await read_request(reader) is not None:
            count += 1
            if count == 3:
                await release.wait()
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await writer.drain()

    async with RawServer(slow_second) as server:
        endpoint = Http1Endpoint(server.url, pool)
        await call(endpoint)
        loop = asyncio.get_running_loop()
        expired: list[str] = []
        # answered within its time: its expiry never comes, though the time passes after
        quick = endpoint.begin("GET", "/", b"", b"")
        assert quick is not None
        done = asyncio.Event()
        quick.listen(
            lambda: done.set() if quick.settled else None,
            until=loop.time() + 0.2,
            on_expiry=lambda: expired.append("quick"),
        )
        await asyncio.wait_for(done.wait(), 30)
        quick.listen(None)
        assert quick.take_body() == b"ok"
        # the next one on the same connection: not answered within its time
        slow = endpoint.begin("GET", "/", b"", b"")
        assert slow is not None
        notified: list[bool] = []
        slow.listen(
            lambda: notified.append(True),
            until=loop.time() + 0.05,
            on_expiry=lambda: expired.append("slow"),
        )
        await asyncio.sleep(0.4)
        assert expired == ["slow"]  # once, and not the first request's
        release.set()
        response = await slow.response()  # followed the ordinary way from here
        assert response.status == 200 and await response.read(10) == b"ok"
        await response.aclose()
        assert notified == [] and server.connections == 1


async def test_a_begun_request_on_a_connection_the_server_drops_is_sent_again(
    pool: Http1Pool,
) -> None:
    async def answer_one_then_drop(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await keep_alive_echo_once(reader, writer)
        await read_request(reader)  # the second request on this connection is dropped

    async with RawServer(answer_one_then_drop) as server:
        endpoint = Http1Endpoint(server.url, pool)
        assert await call(endpoint) == b"POST /echo?q=1 HTTP/1.1|x"
        exchange = endpoint.begin("POST", "/echo?q=1", b"", b"x")
        assert exchange is not None
        await settled(exchange)
        assert exchange.response_now() is None  # nothing came back: awaited, it is sent again
        response = await exchange.response()
        assert await response.read(1 << 10) == b"POST /echo?q=1 HTTP/1.1|x"
        await response.aclose()
        assert server.connections == 2


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
    exchange = endpoint.begin("GET", "/big", b"", b"")
    assert exchange is not None
    body = b"x" * (HIGH_WATER + 1000)
    # the whole answer in one read: complete, and more than HIGH_WATER waiting to be taken
    conn.data_received(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
    assert transport.paused and exchange.settled
    response = exchange.response_now()
    assert response is not None and response.complete_body() == body
    # back in the pool, reading again: the next request's answer is read
    assert not transport.paused
    again = endpoint.begin("GET", "/small", b"", b"")
    assert again is not None
    conn.data_received(b"HTTP/1.1 204 No Content\r\n\r\n")
    answer = again.response_now()
    assert answer is not None and answer.status == 204
