"""The inline invocation path (invocation/inline.py) over real connections: the server's
express lane answers the common invocation itself, in one write, and hands everything else to
the general path — queued, retried, detached, refused — with the same answers."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.app import NvcfApp
from service.core.server import ConnectionLimits
from service.invocation import answers
from service.invocation import inline as inline_module
from service.invocation.inline import InlineInvocation
from tests.support.api import assert_problem
from tests.support.app import ADMIN_KEY, ClientFactory
from tests.support.e2e import V
from tests.support.invocation import deployed, invocation_app, pexec_url, sample, spec
from tests.support.server import free_port, in_loop_server
from tests.support.upstream import UpstreamServer

SUFFIX = "invocation.localhost"
AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture
def upstream() -> Iterator[UpstreamServer]:
    server = UpstreamServer().start()
    yield server
    server.stop()


@contextlib.asynccontextmanager
async def serving(app: NvcfApp) -> AsyncIterator[str]:
    """The application behind the real server stack of `nvcf-server serve` (its protocol,
    with the application's express lane), in this event loop."""
    limits = ConnectionLimits(
        header_timeout=10, body_timeout=10, keepalive_timeout=5, max_connections=100
    )
    async with in_loop_server(app, limits, app.express) as server:
        yield f"http://127.0.0.1:{server.config.port}"


def inline_of(app: NvcfApp) -> InlineInvocation:
    assert app.front_door is not None and app.front_door.inline is not None
    return app.front_door.inline


async def served_app(
    client_factory: ClientFactory, tmp_path: Path, upstream: UpstreamServer, **overrides: Any
) -> tuple[Any, dict[str, Any]]:
    client = await invocation_app(
        client_factory, tmp_path, upstream=upstream.url, invoke_host_suffix=SUFFIX, **overrides
    )
    fn = await deployed(client, specs=[spec(maxRequestConcurrency=1)])
    return client, fn


@contextlib.asynccontextmanager
async def warmed(
    client: Any, fn: dict[str, Any]
) -> AsyncIterator[tuple[httpx.AsyncClient, InlineInvocation]]:
    """A connection to the served application whose caller and route one request has read
    (the next ones can take the inline path), and that path."""
    async with serving(client.app) as base, httpx.AsyncClient(base_url=base, headers=AUTH) as http:
        assert (await http.post(pexec_url(fn), json={})).status_code == 200
        yield http, inline_of(client.app)


def _shape(resp: httpx.Response) -> tuple[int, Any, set[str]]:
    """What a caller sees of an answer, without the values that differ per request."""
    names = set(resp.headers) - {"date"}
    return resp.status_code, resp.json(), names


@pytest.mark.parametrize("inline", [True, False])
async def test_the_common_invocation_is_answered_by_the_express_lane(
    client_factory: ClientFactory, tmp_path: Path, upstream: UpstreamServer, inline: bool
) -> None:
    client, fn = await served_app(client_factory, tmp_path, upstream, invoke_inline=inline)
    app: NvcfApp = client.app
    assert (app.express is not None) is inline
    async with serving(app) as base, httpx.AsyncClient(base_url=base, headers=AUTH) as http:
        # the first request of a key verifies it and reads the route: the general path
        first = await http.post(pexec_url(fn), json={"n": 0})
        assert first.status_code == 200, first.text
        answers = [
            await http.post(pexec_url(fn), json={"n": 1}),
            await http.post(pexec_url(fn, version=False), json={"n": 2}),
            await http.post("/echo", json={"n": 3}, headers={"Host": f"{fn['id']}.{SUFFIX}"}),
            await http.post("/echo", json={"n": 4}, headers={"function-id": fn["id"]}),
        ]
    for n, resp in enumerate(answers, 1):
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["echo"] == {"n": n} and body["path"] == "/echo"
        seen = {k.lower(): v for k, v in body["headers"].items()}
        assert seen["nvcf-reqid"] == resp.headers["nvcf-reqid"]
        assert seen["nvcf-function-id"] == fn["id"]
        assert resp.headers["nvcf-status"] == "fulfilled"
        assert resp.headers["x-request-id"] and resp.headers["x-upstream"] == "yes"
        assert int(resp.headers["content-length"]) == len(resp.content)
    assert _shape(answers[0])[2] == _shape(first)[2]  # the same headers either way
    if inline:
        # the pexec routes are each read once; the transparent ones share them after
        assert inline_of(app).answered >= 2
        # with the worker's connection kept alive, answered from callbacks, without a task
        assert inline_of(app).untasked >= 2
    metrics = (await client.get("/metrics")).text
    labels = {"function_id": fn["id"], "version_id": fn["versionId"]}
    assert sample(metrics, "nvcf_invocation_requests_total", outcome="fulfilled", **labels) == 5
    route = "/v2/nvcf/pexec/functions/{functionId}/versions/{functionVersionId}"
    assert sample(metrics, "nvcf_http_requests_total", route=route, status="200") == 2
    assert sample(metrics, "nvcf_http_requests_total", route="<transparent invocation>") == 2


async def test_what_the_inline_path_does_not_take_goes_the_general_way(
    client_factory: ClientFactory, tmp_path: Path, upstream: UpstreamServer
) -> None:
    client, fn = await served_app(client_factory, tmp_path, upstream)
    async with warmed(client, fn) as (http, inline):
        answered = inline.answered
        assert (await http.post(pexec_url(fn), json={})).status_code == 200
        assert inline.answered == answered + 1
        handed = inline.handed_over
        # a client request id, a query string, another credential: the general path
        own = "0d5b6a52-4c7e-4d1f-9a57-2f7f3b1e6a10"
        resp = await http.post(pexec_url(fn), json={}, headers={"X-Request-Id": own})
        assert resp.status_code == 200 and resp.headers["x-request-id"] == own
        assert (await http.post(pexec_url(fn) + "?a=1", json={})).status_code == 200
        resp = await http.post(pexec_url(fn), json={}, headers={"Authorization": "Bearer nvapi-x"})
        assert_problem(resp, 401)
        assert resp.headers["nvcf-status"] == "errored"
        # a header named twice (its values are not folded here): the general path
        twice = [("X-Twice", "a"), ("X-Twice", "b")]
        resp = await http.post(pexec_url(fn), json={"twice": 1}, headers=twice)
        assert resp.status_code == 200 and resp.json()["echo"] == {"twice": 1}
        assert inline.handed_over == handed + 4 and inline.answered == answered + 1

        # the only instance is busy (maxRequestConcurrency 1): the next request queues
        upstream.hold()
        first = asyncio.create_task(http.post(pexec_url(fn), json={"i": 1}))
        second = asyncio.create_task(http.post(pexec_url(fn), json={"i": 2}))
        for _ in range(500):
            depth = (await client.get(f"{V}/queues/functions/{fn['id']}")).json()
            if upstream.arrived >= 4 and depth["queues"][0]["queueDepth"] == 1:
                break
            await asyncio.sleep(0.01)
        assert depth["queues"][0]["queueDepth"] == 1
        upstream.release()
        assert [(await t).json()["echo"]["i"] for t in (first, second)] == [1, 2]
        assert inline.answered == answered + 2 and inline.handed_over == handed + 5


async def test_a_slow_worker_is_detached_after_the_poll_time_then_polled(
    client_factory: ClientFactory, tmp_path: Path, upstream: UpstreamServer
) -> None:
    client, fn = await served_app(client_factory, tmp_path, upstream)
    async with warmed(client, fn) as (http, inline):
        assert (await http.post(pexec_url(fn), json={})).status_code == 200  # endpoint known
        answered, followed = inline.answered, inline.followed
        upstream.hold()
        resp = await http.post(pexec_url(fn), json={"slow": 1}, headers={"NVCF-POLL-SECONDS": "1"})
        assert inline.answered == answered + 1
        # begun from callbacks (the worker's connection was idle), followed in a task once
        # the poll time passed
        assert inline.followed == followed + 1
        assert resp.status_code == 202, resp.text
        rid = resp.headers["nvcf-reqid"]
        assert resp.headers["nvcf-status"] == "pending-evaluation"
        assert resp.json() == {"reqId": rid, "status": "pending-evaluation"}
        pending = await http.get(f"{V}/pexec/status/{rid}", headers={"NVCF-POLL-SECONDS": "1"})
        assert pending.status_code == 202
        upstream.release()
        done = await http.get(f"{V}/pexec/status/{rid}")
        assert done.status_code == 200, done.text
        assert done.json()["echo"] == {"slow": 1} and done.headers["nvcf-status"] == "fulfilled"
        # the connection that got the 202 serves the next request
        assert (await http.post(pexec_url(fn), json={})).status_code == 200


async def test_a_front_request_whose_caller_left_goes_on_and_frees_its_instance(
    client_factory: ClientFactory, tmp_path: Path, upstream: UpstreamServer
) -> None:
    client, fn = await served_app(client_factory, tmp_path, upstream)
    async with warmed(client, fn) as (http, inline):
        assert (await http.post(pexec_url(fn), json={})).status_code == 200  # endpoint known
        fronted, followed = inline.fronted, inline.followed
        upstream.hold()
        port = int(str(http.base_url).rstrip("/").rsplit(":", 1)[1])
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            f"POST {pexec_url(fn)} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN_KEY}\r\n"
            "NVCF-POLL-SECONDS: 1\r\nContent-Length: 2\r\n\r\n{}".encode()
        )
        for _ in range(500):
            if upstream.arrived and inline.fronted == fronted + 1:
                break
            await asyncio.sleep(0.01)
        assert inline.fronted == fronted + 1  # taken by the front protocol
        writer.close()  # the caller leaves; the poll time passes: followed without a caller
        for _ in range(500):
            if inline.followed == followed + 1:
                break
            await asyncio.sleep(0.01)
        assert inline.followed == followed + 1
        upstream.release()
        # the only instance (maxRequestConcurrency 1) was freed once the worker answered
        resp = await http.post(pexec_url(fn), json={"next": 1}, headers={"NVCF-POLL-SECONDS": "5"})
        assert resp.status_code == 200 and resp.json()["echo"] == {"next": 1}


async def test_a_refusing_worker_is_handed_to_the_general_path(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"  # nothing listens: connections are refused
    client = await invocation_app(client_factory, tmp_path, upstream=nobody)
    fn = await deployed(client)
    inline = inline_of(client.app)
    async with serving(client.app) as base, httpx.AsyncClient(base_url=base, headers=AUTH) as http:
        assert_problem(await http.post(pexec_url(fn), json={}), 502)  # the general path
        answered = inline.answered
        resp = await http.post(pexec_url(fn), json={})
        assert inline.answered == answered + 1
        problem = assert_problem(resp, 502)
        assert "could not be reached" in str(problem["detail"])
        assert "connection refused" in str(problem["detail"])
        assert resp.headers["nvcf-status"] == "errored" and resp.headers["x-request-id"]
    metrics = (await client.get("/metrics")).text
    labels = {"function_id": fn["id"], "version_id": fn["versionId"]}
    assert sample(metrics, "nvcf_invocation_requests_total", outcome="errored", **labels) == 2
    assert sample(metrics, "nvcf_invocation_in_flight", **labels) == 0


async def test_pipelined_requests_and_connection_close_on_the_express_lane(
    client_factory: ClientFactory, tmp_path: Path, upstream: UpstreamServer
) -> None:
    client, fn = await served_app(client_factory, tmp_path, upstream)
    inline = inline_of(client.app)
    async with serving(client.app) as base:
        port = int(base.rsplit(":", 1)[1])
        async with httpx.AsyncClient(base_url=base, headers=AUTH) as http:
            assert (await http.post(pexec_url(fn), json={})).status_code == 200
        answered = inline.answered

        def request(n: int, close: bool = False) -> bytes:
            body = json.dumps({"n": n}).encode()
            head = (
                f"POST {pexec_url(fn)} HTTP/1.1\r\nHost: nvcf\r\n"
                f"Authorization: Bearer {ADMIN_KEY}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n" + ("Connection: close\r\n" if close else "")
            )
            return head.encode() + b"\r\n" + body

        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request(1) + request(2) + request(3, close=True))
        raw = await asyncio.wait_for(reader.read(), 30)  # until the server closes
        writer.close()
    answers = raw.split(b"HTTP/1.1 ")[1:]
    assert [a[:3] for a in answers] == [b"200"] * 3
    echoes = [json.loads(a.split(b"\r\n\r\n", 1)[1])["echo"]["n"] for a in answers]
    assert echoes == [1, 2, 3]
    assert b"connection: close" in answers[2].lower() and b"connection: close" not in answers[0]
    assert inline.answered == answered + 3


async def test_an_answer_still_arriving_is_streamed_by_a_task_of_its_own(
    client_factory: ClientFactory, tmp_path: Path, upstream: UpstreamServer
) -> None:
    client, fn = await served_app(client_factory, tmp_path, upstream)
    async with warmed(client, fn) as (http, inline):
        assert (await http.post(pexec_url(fn), json={})).status_code == 200  # endpoint known
        untasked, followed = inline.untasked, inline.followed
        headers = {"Accept": "text/event-stream"}
        async with http.stream("POST", pexec_url(fn), json={"s": 1}, headers=headers) as resp:
            assert resp.status_code == 200 and resp.headers["nvcf-status"] == "fulfilled"
            events = (json.loads(e[5:]) async for e in resp.aiter_lines() if e.startswith("data:"))
            assert (await anext(events))["index"] == 0
            upstream.next_event()  # event 1 is written only now: the answer is streamed
            assert (await anext(events))["index"] == 1
            upstream.next_event()
            rest = [e async for e in events]
        assert rest[-1]["echo"] == {"s": 1}
        assert (inline.untasked, inline.followed) == (untasked, followed + 1)
        # and the instance was freed: the next request is answered from callbacks again
        assert (await http.post(pexec_url(fn), json={})).status_code == 200
        assert inline.untasked == untasked + 1


@pytest.mark.parametrize("transparent", [False, True])
async def test_a_body_arriving_after_its_head(
    client_factory: ClientFactory, tmp_path: Path, upstream: UpstreamServer, transparent: bool
) -> None:
    """A pexec POST: the front protocol waits for its body, then answers from callbacks. A
    transparent-mode request (by uvicorn's protocol) goes the ordinary way, which reads the
    body as it comes."""
    client, fn = await served_app(client_factory, tmp_path, upstream)
    inline = inline_of(client.app)
    async with serving(client.app) as base:
        async with httpx.AsyncClient(base_url=base, headers=AUTH) as http:
            for _ in range(2):  # the routes, then the worker's endpoint, known
                assert (await http.post(pexec_url(fn), json={})).status_code == 200
                transparent_host = {"Host": f"{fn['id']}.{SUFFIX}"}
                resp = await http.post("/echo", json={}, headers=transparent_host)
                assert resp.status_code == 200
        untasked, answered, fronted = inline.untasked, inline.answered, inline.fronted
        port = int(base.rsplit(":", 1)[1])
        body = b'{"late": true}'
        path, host = ("/echo", f"{fn['id']}.{SUFFIX}") if transparent else (pexec_url(fn), "x")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {ADMIN_KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        )
        await writer.drain()
        await asyncio.sleep(0.1)  # the head alone is read first
        writer.write(body)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        answer = json.loads(await asyncio.wait_for(reader.readexactly(length), 30))
        writer.close()
    assert head.startswith(b"HTTP/1.1 200") and answer["echo"] == {"late": True}
    assert inline.answered == answered + 1
    if transparent:
        # the inline path of the ASGI stack read the body as it came: no callbacks
        assert (inline.untasked, inline.fronted) == (untasked, fronted)
    else:
        assert (inline.untasked, inline.fronted) == (untasked + 1, fronted + 1)


@pytest.mark.parametrize("where", ["starting", "answering"])
async def test_an_error_on_the_express_lane_is_a_500_and_frees_the_instance(
    client_factory: ClientFactory,
    tmp_path: Path,
    upstream: UpstreamServer,
    monkeypatch: pytest.MonkeyPatch,
    where: str,
) -> None:
    client, fn = await served_app(client_factory, tmp_path, upstream)
    async with warmed(client, fn) as (http, inline):
        assert (await http.post(pexec_url(fn), json={})).status_code == 200  # endpoint known

        def broken(*args: object) -> bytes:
            raise RuntimeError("a bug")

        # while the request starts (in the server's parser callback), or once the worker's
        # answer is in (in the worker connection's data callback)
        if where == "starting":
            monkeypatch.setattr(inline_module, "request_lines", broken)
        else:
            monkeypatch.setattr(answers, "whole_lines", broken)
        answered = inline.answered
        resp = await http.post(pexec_url(fn), json={})
        assert resp.status_code == 500 and resp.text == "Internal Server Error"
        assert inline.answered == answered + 1  # it was the express lane's
        monkeypatch.undo()
        # the only instance (maxRequestConcurrency 1) was freed and the connection serves on
        # (after an error on the answer, on a new worker connection, then from callbacks)
        untasked = inline.untasked
        assert (await http.post(pexec_url(fn), json={"n": 1})).json()["echo"] == {"n": 1}
        assert (await http.post(pexec_url(fn), json={"n": 2})).json()["echo"] == {"n": 2}
        assert inline.untasked >= untasked + 1
