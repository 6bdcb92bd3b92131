"""The front protocol (core/front.py) over real connections: what its express lane claims from
the head is answered there; everything else reaches the ASGI application through uvicorn's
protocol with the bytes the client sent, in order; a connection handed over for a request of
the lane's kind comes back once idle; the connection bounds hold on both sides.

The lane here is a small fake with the real `HeadExpress` shape: it claims `POST /fast/...`,
declines `/fast/no...` from the head and `/fast/later...` only once the body is in, answers
`/fast/hold...` when the test says so, and hands `/fast/resume...` on to a task with a cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import uvicorn
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from service.core.errors import RequestTimeout
from service.core.front import Front, FrontProtocol, Headers, http_protocol
from service.core.server import ConnectionLimits
from tests.support.server import in_loop_server

WAIT = 5.0


class Lane:
    head_prefixes = (b"POST /fast/",)

    def __init__(self) -> None:
        self.held: list[tuple[bytes, Front]] = []
        self.ran: list[bytes] = []

    # the uvicorn protocol's express lane: nothing is claimed there
    def claim(self, scope: Any) -> bool:
        return False

    def start(self, cycle: RequestResponseCycle, app: Any) -> None:
        raise AssertionError("not claimed")

    def claim_head(self, url: bytes, headers: Headers) -> object | None:
        return None if url.startswith(b"/fast/no") else url

    def run(self, claimed: object, headers: Headers, body: bytes, front: Front) -> bool:
        assert isinstance(claimed, bytes)
        self.ran.append(claimed)
        if claimed.startswith(b"/fast/later"):
            return False
        if claimed.startswith(b"/fast/hold"):
            self.held.append((body, front))
            return True
        if claimed.startswith(b"/fast/resume"):
            front.resume(lambda cycle: _answer_in_task(cycle, body))
            return True
        answer(front, b"front:" + body)
        return True


def answer(front: Front, body: bytes) -> None:
    lines = b"x-by: front\r\ncontent-length: %d\r\n" % len(body)
    front.write(200, lines, body)


def _answer_in_task(cycle: RequestResponseCycle, body: bytes) -> Coroutine[Any, Any, None]:
    async def run() -> None:
        assert cycle.scope["path"].startswith(("/fast/resume", "/fast/hold"))
        out = b"task:" + body
        headers = [(b"x-by", b"task"), (b"content-length", str(len(out)).encode())]
        await cycle.send({"type": "http.response.start", "status": 200, "headers": headers})
        await cycle.send({"type": "http.response.body", "body": out})

    return run()


async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
    """Echoes method, path and body, marked as the application's answer (408: the body
    was late)."""
    if scope["type"] != "http":
        return
    body = b""
    status = 200
    try:
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
    except RequestTimeout:
        status = 408
    out = f"asgi:{scope['method']} {scope['path']}:".encode() + body
    headers = [(b"x-by", b"asgi"), (b"content-length", str(len(out)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": out})


@contextlib.asynccontextmanager
async def serving(lane: Lane, **limits: Any) -> AsyncIterator[uvicorn.Server]:
    bounds = {
        "header_timeout": 10.0,
        "body_timeout": 10.0,
        "keepalive_timeout": 10.0,
        "max_connections": 100,
    } | limits
    async with in_loop_server(asgi, ConnectionLimits(**bounds), lane) as server:
        try:
            yield server
        finally:
            for writer in _opened:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
            _opened.clear()


#: the test's connections, closed when its server stops
_opened: list[asyncio.StreamWriter] = []


async def connect(
    server: uvicorn.Server,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.config.port)
    _opened.append(writer)
    return reader, writer


def post(path: str, body: bytes = b"", *extra: str) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
    return (head + "".join(f"{h}\r\n" for h in extra) + "\r\n").encode() + body


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), WAIT)
    return status, headers, body


async def closed(reader: asyncio.StreamReader) -> bytes:
    """What the server still sends before it closes the connection (a timeout fails)."""
    return await asyncio.wait_for(reader.read(), WAIT)


async def until_held(lane: Lane, count: int = 1) -> None:
    for _ in range(500):
        if len(lane.held) >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the lane holds no request")


def by(answer: tuple[int, dict[str, str], bytes]) -> tuple[int, str, bytes]:
    status, headers, body = answer
    return status, headers["x-by"], body


async def test_claimed_requests_are_answered_by_the_front_and_the_rest_by_the_application() -> None:
    lane = Lane()
    async with serving(lane) as server:
        reader, writer = await connect(server)
        writer.write(post("/fast/a", b"1"))
        status, headers, body = await read_answer(reader)
        assert (status, headers["x-by"], body) == (200, "front", b"front:1")
        assert "date" in headers and "server" in headers  # the server's own, as uvicorn's
        # declined from its head: the application has it, bytes as sent; then the connection
        # (handed over for a request of the lane's kind) comes back
        writer.write(post("/fast/no", b"2"))
        assert by(await read_answer(reader)) == (200, "asgi", b"asgi:POST /fast/no:2")
        writer.write(post("/fast/b", b"3"))
        assert by(await read_answer(reader)) == (200, "front", b"front:3")
        # declined once its body is in: replayed whole to the application
        writer.write(post("/fast/later", b"4"))
        assert by(await read_answer(reader)) == (200, "asgi", b"asgi:POST /fast/later:4")
        writer.write(post("/fast/c", b"5"))
        assert by(await read_answer(reader)) == (200, "front", b"front:5")
        # a request of another kind: the application's, and the connection stays with it
        writer.write(b"GET /other HTTP/1.1\r\nHost: x\r\n\r\n")
        assert by(await read_answer(reader)) == (200, "asgi", b"asgi:GET /other:")
        writer.write(post("/fast/d", b"6"))
        assert by(await read_answer(reader)) == (200, "asgi", b"asgi:POST /fast/d:6")
    assert lane.ran == [b"/fast/a", b"/fast/b", b"/fast/later", b"/fast/c"]


async def test_pipelined_requests_are_answered_in_order_whoever_answers_them() -> None:
    lane = Lane()
    async with serving(lane) as server:
        reader, writer = await connect(server)
        writer.write(
            post("/fast/a", b"1")
            + post("/fast/hold", b"2")
            + post("/fast/b", b"3")
            + post("/fast/no", b"4")
            + post("/fast/c", b"5", "Connection: close")
        )
        assert by(await read_answer(reader)) == (200, "front", b"front:1")
        for _ in range(500):  # the held request is under way; the ones behind it wait
            if lane.held:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert lane.ran == [b"/fast/a", b"/fast/hold"]
        body, front = lane.held.pop()
        answer(front, b"held:" + body)
        answers = [by(await read_answer(reader)) for _ in range(4)]
        assert answers == [
            (200, "front", b"held:2"),
            (200, "front", b"front:3"),
            (200, "asgi", b"asgi:POST /fast/no:4"),
            (200, "asgi", b"asgi:POST /fast/c:5"),
        ]
        assert await closed(reader) == b""  # Connection: close


async def test_a_body_in_pieces_is_waited_for_and_other_framing_handed_over() -> None:
    lane = Lane()
    async with serving(lane) as server:
        reader, writer = await connect(server)
        request = post("/fast/a", b"0123456789")
        for piece in (request[:7], request[7:40], request[40:-3], request[-3:]):
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.02)
        assert by(await read_answer(reader)) == (200, "front", b"front:0123456789")
        # chunked: handed over before its body is looked at, and decoded by uvicorn's protocol
        writer.write(
            b"POST /fast/chunked HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
        )
        assert by(await read_answer(reader)) == (200, "asgi", b"asgi:POST /fast/chunked:abcde")
        # HTTP/1.0: handed over too
        writer.write(b"POST /fast/old HTTP/1.0\r\nContent-Length: 1\r\n\r\nz")
        assert by(await read_answer(reader)) == (200, "asgi", b"asgi:POST /fast/old:z")
        assert await closed(reader) == b""
        # an upgrade: handed over (uvicorn's protocol knows no such upgrade and answers it)
        reader, writer = await connect(server)
        writer.write(post("/fast/up", b"", "Connection: Upgrade", "Upgrade: other"))
        assert by(await read_answer(reader)) == (200, "asgi", b"asgi:POST /fast/up:")
    assert lane.ran == [b"/fast/a"]


async def test_a_malformed_head_is_answered_400_by_uvicorns_protocol() -> None:
    async with serving(Lane()) as server:
        reader, writer = await connect(server)
        writer.write(b"POST /fast/a HTTP/1.1\r\nHost x\r\nContent-Length: 0\r\n\r\n")
        data = await closed(reader)
        assert data.startswith(b"HTTP/1.1 400 ")


async def test_a_resumed_request_is_answered_by_its_task_then_the_connection_comes_back() -> None:
    lane = Lane()
    async with serving(lane) as server:
        reader, writer = await connect(server)
        writer.write(post("/fast/resume", b"r"))
        assert by(await read_answer(reader)) == (200, "task", b"task:r")
        writer.write(post("/fast/a", b"1"))
        assert by(await read_answer(reader)) == (200, "front", b"front:1")
    # resumed, the request was not run again by the lane
    assert lane.ran == [b"/fast/resume", b"/fast/a"]


async def test_the_connection_bounds_hold_on_the_front() -> None:
    lane = Lane()
    bounds = {"header_timeout": 0.3, "body_timeout": 0.3, "keepalive_timeout": 0.3}
    async with serving(lane, max_connections=2, **bounds) as server:
        # a head that never completes: closed
        reader, writer = await connect(server)
        writer.write(b"POST /fast/a HTTP/1.1\r\nHost: x\r\n")
        assert await closed(reader) == b""
        # a body that never completes: handed over, answered as the application's way
        # answers any late body (408), then closed
        reader, writer = await connect(server)
        writer.write(b"POST /fast/a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nab")
        assert by(await read_answer(reader)) == (408, "asgi", b"asgi:POST /fast/a:ab")
        assert await closed(reader) == b""
        # idle after an answer: closed
        reader, writer = await connect(server)
        writer.write(post("/fast/a", b"1"))
        assert by(await read_answer(reader)) == (200, "front", b"front:1")
        assert await closed(reader) == b""
        # an answer under way is not cut short (the lane bounds its own time): given, then
        # the connection idles out
        reader, writer = await connect(server)
        writer.write(post("/fast/hold", b"h"))
        for _ in range(500):
            if lane.held:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)
        body, front = lane.held.pop()
        answer(front, b"front:" + body)
        assert by(await read_answer(reader)) == (200, "front", b"front:h")
        assert await closed(reader) == b""
        # over the connection limit: refused
        for _ in range(2):
            await connect(server)
        reader, writer = await connect(server)
        assert (await closed(reader)).startswith(b"HTTP/1.1 503 ")


async def test_shutdown_closes_an_idle_front_connection_and_lets_requests_under_way_finish() -> (
    None
):
    lane = Lane()
    async with serving(lane) as server:
        idle_reader, idle_writer = await connect(server)
        idle_writer.write(post("/fast/a", b"1"))
        assert by(await read_answer(idle_reader)) == (200, "front", b"front:1")
        reader, writer = await connect(server)
        writer.write(post("/fast/hold", b"h"))
        await until_held(lane)
        # one to be resumed by a task after the shutdown began
        resumed_reader, resumed_writer = await connect(server)
        resumed_writer.write(post("/fast/hold", b"r"))
        await until_held(lane, 2)
        # and a request whose body is still arriving
        late_reader, late_writer = await connect(server)
        late = post("/fast/late", b"0123")
        late_writer.write(late[:-2])
        await asyncio.sleep(0.05)
        server.should_exit = True
        assert await closed(idle_reader) == b""
        (body, front), (resumed_body, resumed_front) = lane.held
        answer(front, body)
        status, headers, _ = await read_answer(reader)
        assert status == 200 and headers["connection"] == "close"
        assert await closed(reader) == b""
        assert resumed_front.resume(lambda cycle: _answer_in_task(cycle, resumed_body))
        status, headers, body = await read_answer(resumed_reader)
        assert (status, headers["connection"], body) == (200, "close", b"task:r")
        assert await closed(resumed_reader) == b""
        late_writer.write(late[-2:])
        status, headers, body = await read_answer(late_reader)
        assert (status, headers["connection"], body) == (200, "close", b"front:0123")
        assert await closed(late_reader) == b""


async def test_one_answer_per_request_and_expect_100_continue_handed_over() -> None:
    lane = Lane()
    async with serving(lane) as server:
        reader, writer = await connect(server)
        writer.write(post("/fast/hold", b"h"))
        await until_held(lane)
        _, front = lane.held.pop()
        answer(front, b"first")
        answer(front, b"second")  # a second answer to the same request is no answer
        writer.write(post("/fast/a", b"1"))
        assert by(await read_answer(reader)) == (200, "front", b"first")
        assert by(await read_answer(reader)) == (200, "front", b"front:1")
        # a client waiting for 100 Continue: uvicorn's protocol has it (and sends the 100)
        writer.write(
            b"POST /fast/e HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nExpect: 100-continue\r\n\r\n"
        )
        line = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
        assert line.startswith(b"HTTP/1.1 100 ")
        writer.write(b"e")
        assert by(await read_answer(reader)) == (200, "asgi", b"asgi:POST /fast/e:e")
    assert lane.ran == [b"/fast/hold", b"/fast/a"]


async def test_a_resumed_request_is_not_refused_at_the_limit_and_needs_its_caller() -> None:
    lane = Lane()
    async with serving(lane, max_connections=2) as server:
        reader, writer = await connect(server)
        writer.write(post("/fast/hold", b"1"))
        await until_held(lane)
        _, filler = await connect(server)  # the limit is reached
        body, front = lane.held.pop()
        assert front.resume(lambda cycle: _answer_in_task(cycle, body))
        assert by(await read_answer(reader)) == (200, "task", b"task:1")
        writer.close()
        filler.close()
        for _ in range(500):
            if not server.server_state.connections:
                break
            await asyncio.sleep(0.01)
        # the caller goes away while its request is under way: nothing to resume with
        reader, writer = await connect(server)
        writer.write(post("/fast/hold", b"2"))
        await until_held(lane)
        open_now = len(server.server_state.connections)
        writer.close()
        for _ in range(500):
            if len(server.server_state.connections) < open_now:
                break
            await asyncio.sleep(0.01)
        body, front = lane.held.pop()
        resumed: list[bytes] = []
        assert front.resume(lambda cycle: resumed.append(body)) is False  # type: ignore[func-returns-value]
        assert resumed == []


def test_the_front_is_used_only_for_a_lane_that_claims_heads() -> None:
    limits = ConnectionLimits(
        header_timeout=1, body_timeout=1, keepalive_timeout=1, max_connections=1
    )
    assert issubclass(http_protocol(limits, Lane()), FrontProtocol)
    assert not issubclass(http_protocol(limits, None), FrontProtocol)
