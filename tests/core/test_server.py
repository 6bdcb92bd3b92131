"""The serve commands' start-up: objects alive once the application is built are frozen out
of the cyclic garbage collector's reach (`NVCF_GC_FREEZE`); the server's bounded protocol."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Iterator

import httpx
import pytest
from starlette.types import ASGIApp, Receive, Scope, Send

from service.core.server import CoalescingTransport, ConnectionLimits, freeze_startup_objects
from tests.support.server import in_loop_server


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


@pytest.mark.usefixtures("unfrozen")
def test_start_up_objects_are_frozen_out_of_the_collector_when_asked() -> None:
    assert freeze_startup_objects(False) is False
    assert gc.get_freeze_count() == 0
    assert freeze_startup_objects(True) is True
    assert gc.get_freeze_count() > 0
    # what is created afterwards is collected as before
    cycle: list[object] = []
    cycle.append(cycle)
    del cycle
    assert gc.collect() >= 1


async def test_a_large_body_is_never_counted_as_a_request_head() -> None:
    """The read that ends a body (here up to several hundred KiB at once) is body, not the
    next request's head: a large upload is not refused 431 (the head bound is 64 KiB)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        size, more = 0, True
        while more:
            message = await receive()
            size += len(message.get("body", b""))
            more = message.get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(size).encode()})

    limits = ConnectionLimits(
        header_timeout=10, body_timeout=10, keepalive_timeout=5, max_connections=10
    )
    async with in_loop_server(app, limits) as server:
        base = f"http://127.0.0.1:{server.config.port}"
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            for size in (1024 * 1024, 8 * 1024 * 1024):
                resp = await client.put("/upload", content=b"x" * size)
                assert resp.status_code == 200 and resp.text == str(size)


def test_uploads_have_a_longer_body_time() -> None:
    limits = ConnectionLimits(
        header_timeout=10,
        body_timeout=60,
        keepalive_timeout=5,
        max_connections=10,
        long_body_prefix="/storage/",
        long_body_timeout=3600,
    )
    assert limits.body_timeout_of("/storage/assets/x?sig=1") == 3600
    assert limits.body_timeout_of("/v2/nvcf/assets") == 60
    plain = ConnectionLimits(
        header_timeout=1, body_timeout=60, keepalive_timeout=1, max_connections=1
    )
    assert plain.body_timeout_of("/storage/assets/x") == 60


async def test_the_protocol_says_when_a_body_has_arrived_whole() -> None:
    """A body that came with its head is marked received before the application reads it
    (its reads need no deadline); one still on its way is not, until it has come."""
    from service.core.server import BODY_RECEIVED

    seen: list[tuple[bool, bool]] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        before = BODY_RECEIVED in scope
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        seen.append((before, BODY_RECEIVED in scope))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    limits = ConnectionLimits(
        header_timeout=10, body_timeout=10, keepalive_timeout=5, max_connections=10
    )
    async with in_loop_server(app, limits) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.config.port)
        head = b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 4\r\n\r\n"
        writer.write(head + b"body")
        await reader.readuntil(b"\r\n\r\n")
        writer.write(head + b"bo")  # half the body now, the rest once the app waits for it
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.write(b"dy")
        await reader.readuntil(b"\r\n\r\n")
        writer.close()
    assert seen == [(True, True), (False, True)]


class _Recorder(asyncio.Transport):
    """The writes a transport receives (what reaches the socket)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 0


async def test_writes_of_one_loop_step_leave_in_one_send_and_close_flushes_first() -> None:

    raw = _Recorder()
    transport = CoalescingTransport(raw, asyncio.get_running_loop())
    transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    transport.write(b"ok")
    assert raw.writes == [] and transport.get_write_buffer_size() == 40
    await asyncio.sleep(0)
    assert raw.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"]
    transport.write(b"x" * CoalescingTransport.FLUSH_BYTES)  # large: at once
    assert len(raw.writes) == 2
    transport.write(b"bye")
    transport.close()
    assert raw.writes[-1] == b"bye" and raw.closed
    with pytest.raises(ConnectionResetError):  # the peer is gone: the writer hears it
        transport.write(b"late")


def _recording_app(seen: list[list[tuple[bytes, bytes]]]) -> ASGIApp:
    """An application that reads the whole body and answers 200 with its size, recording
    the headers it was given."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(list(scope["headers"]))
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            size += len(message.get("body", b""))
            more = message.get("more_body", False)
        answer = str(size).encode()
        length = [(b"content-length", str(len(answer)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": length})
        await send({"type": "http.response.body", "body": answer})

    return app


BOUNDED = ConnectionLimits(
    header_timeout=10,
    body_timeout=10,
    keepalive_timeout=5,
    max_connections=10,
    max_head_bytes=16 * 1024,
    max_headers=20,
)
CHUNKED = b"POST /x HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n"


async def _exchange(port: int, *parts: bytes) -> bytes:
    """Send `parts` (until the server stops reading) while reading what it answers until it
    closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def send() -> None:
        with contextlib.suppress(ConnectionError):
            for part in parts:
                writer.write(part)
                await writer.drain()

    sending = asyncio.create_task(send())
    try:
        answer = b""
        with contextlib.suppress(ConnectionError):
            while chunk := await asyncio.wait_for(reader.read(65536), 30):
                answer += chunk
        return answer
    finally:
        sending.cancel()
        writer.close()


@pytest.mark.parametrize(
    ("name", "parts"),
    [
        # D17: one trailer field of 8 MiB, sent in 64 KiB writes
        ("a long trailer field", [CHUNKED + b"0\r\nx-trailer: ", *[b"a" * 65536] * 128]),
        ("too many trailer lines", [CHUNKED + b"0\r\n" + b"x-t: 1\r\n" * 21 + b"\r\n"]),
        ("a long chunk extension", [CHUNKED + b"1;ext=", *[b"a" * 65536] * 128]),
    ],
)
async def test_a_chunked_bodys_framing_is_bounded_like_a_head(
    name: str, parts: list[bytes]
) -> None:
    """D17: a chunked request's trailer section (and its chunk lines) were gathered without
    bound, in quadratic time, before the route could answer: now over the head's bounds it is
    answered 431 and the connection closed, and the route never gets the body."""
    seen: list[list[tuple[bytes, bytes]]] = []
    async with in_loop_server(_recording_app(seen), BOUNDED) as server:
        answer = await _exchange(server.config.port, *parts)
        assert answer.startswith(b"HTTP/1.1 431 "), (name, answer[:200])
        assert b"application/problem+json" in answer and b"connection: close" in answer
        async with httpx.AsyncClient(timeout=10) as client:  # the server serves on
            resp = await client.post(f"http://127.0.0.1:{server.config.port}/y", content=b"abc")
            assert resp.text == "3"


async def test_many_small_chunks_and_a_short_trailer_are_a_normal_body() -> None:
    """The framing bound leaves room for each chunk's own line: a body sent in 20,000 chunks of
    one byte, with a trailer, arrives whole."""
    seen: list[list[tuple[bytes, bytes]]] = []
    body = b"1\r\nx\r\n" * 20_000 + b"0\r\nx-checksum: abc\r\n\r\n"
    head = b"POST /x HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    async with in_loop_server(_recording_app(seen), BOUNDED) as server:
        answer = await _exchange(server.config.port, head, body)
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"\r\n\r\n20000")


async def test_trailer_fields_never_become_header_fields() -> None:
    """D22: uvicorn appended a request's trailer fields to its headers, so an `Authorization`
    or `function-id` sent only as a trailer authenticated or routed the request. Trailers are
    dropped; the headers are the head's alone."""
    seen: list[list[tuple[bytes, bytes]]] = []
    trailer = b"0\r\nauthorization: Bearer nvapi-x\r\nfunction-id: f\r\nhost: evil\r\n\r\n"
    head = b"POST /x HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    async with in_loop_server(_recording_app(seen), BOUNDED) as server:
        answer = await _exchange(server.config.port, head + b"2\r\nok\r\n" + trailer)
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"\r\n\r\n2")
    assert seen == [
        [(b"host", b"t"), (b"transfer-encoding", b"chunked"), (b"connection", b"close")]
    ]
