"""A worker's answer is streamed through as it arrives: driven at the ASGI level against a
real upstream whose event stream advances only when the test says so."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.types import Message

from service.invocation import answers
from service.invocation.store import Outcome
from tests.support.app import AppClient, ClientFactory
from tests.support.asgi import Exchange, scope
from tests.support.e2e import eventually
from tests.support.invocation import deployed, invocation_app, pexec_url, sample, spec
from tests.support.upstream import UpstreamServer


@pytest.fixture
def upstream() -> Iterator[UpstreamServer]:
    server = UpstreamServer().start()
    yield server
    server.stop()


def event(chunk: bytes) -> dict[str, Any]:
    text = chunk.decode()
    assert text.startswith("data: ") and text.endswith("\n\n"), text
    return dict(json.loads(text[len("data: ") :]))


async def test_event_stream_goes_through_unbuffered(
    client_factory: ClientFactory, tmp_path: Path, upstream: UpstreamServer
) -> None:
    client: AppClient = await invocation_app(client_factory, tmp_path, upstream=upstream.url)
    fn = await deployed(client)
    body = json.dumps({"stream": True}).encode()
    exchange = Exchange(body)
    call = asyncio.ensure_future(
        client.app(
            scope(pexec_url(fn), body, accept="text/event-stream"),
            exchange.receive,
            exchange.send,
        )
    )
    start = await asyncio.wait_for(exchange.sent.get(), 30)
    assert start["type"] == "http.response.start" and start["status"] == 200
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    assert headers["content-type"] == "text/event-stream"
    assert headers["nvcf-status"] == "fulfilled"
    # Event 0 arrives while the worker has not yet written event 1.
    assert event(await exchange.next_chunk())["index"] == 0
    upstream.next_event()
    assert event(await exchange.next_chunk())["index"] == 1
    upstream.next_event()
    assert event(await exchange.next_chunk())["echo"] == {"stream": True}
    assert await exchange.next_chunk() == b""
    await asyncio.wait_for(call, 30)


async def test_a_caller_hanging_up_ends_the_stream_and_frees_the_instance(
    client_factory: ClientFactory, tmp_path: Path, upstream: UpstreamServer
) -> None:
    client: AppClient = await invocation_app(client_factory, tmp_path, upstream=upstream.url)
    fn = await deployed(client)
    exchange = Exchange(b"{}")
    call = asyncio.ensure_future(
        client.app(
            scope(pexec_url(fn), b"{}", accept="text/event-stream"),
            exchange.receive,
            exchange.send,
        )
    )
    await asyncio.wait_for(exchange.sent.get(), 30)
    assert event(await exchange.next_chunk())["index"] == 0
    exchange.hang_up()
    await asyncio.wait_for(call, 30)
    labels = {"function_id": fn["id"], "version_id": fn["versionId"]}

    async def freed() -> bool:
        text = (await client.get("/metrics")).text
        return (
            sample(text, "nvcf_invocation_in_flight", **labels) == 0
            and sample(text, "nvcf_invocation_requests_total", outcome="errored", **labels) == 1
        )

    await eventually(freed)
    # The instance takes the next request.
    resp = await client.post(pexec_url(fn), json={"after": True})
    assert resp.status_code == 200 and resp.json()["echo"] == {"after": True}


async def hang_up_while_answered(
    client: AppClient, upstream: UpstreamServer, path: str, body: bytes
) -> None:
    """A caller hangs up while the worker's answer (a declared megabyte) trickles in; the
    application returns, the worker's connection is cut."""
    exchange = Exchange(body)
    call = asyncio.ensure_future(
        client.app(scope(path, body, x_upstream_trickle="1000000"), exchange.receive, exchange.send)
    )
    assert await asyncio.to_thread(upstream.trickling.wait, 30)
    exchange.hang_up()
    await asyncio.wait_for(call, 10)
    assert await asyncio.to_thread(upstream.trickle_cut.wait, 10)


async def slot_is_free(client: AppClient, fn: dict[str, Any]) -> None:
    """The instance's one slot is free (nothing in flight), and it serves the next request."""
    labels = {"function_id": fn["id"], "version_id": fn["versionId"]}

    async def freed() -> bool:
        text = (await client.get("/metrics")).text
        return sample(text, "nvcf_invocation_in_flight", **labels) == 0

    await eventually(freed, seconds=10)
    resp = await client.post(pexec_url(fn), json={"after": True})
    assert resp.status_code == 200 and resp.json()["echo"] == {"after": True}


@pytest.mark.parametrize(
    ("route", "overrides"),
    [
        ("pexec", {}),
        ("exec", {}),
        # over NVCF_INVOKE_RESULT_MAX_BYTES: the engine reads it into the object store
        ("pexec", {"invoke_result_max_bytes": 1000}),
    ],
    ids=["pexec-known-length", "exec", "large-result"],
)
async def test_a_caller_hanging_up_while_the_answer_comes_frees_the_instance(
    client_factory: ClientFactory,
    tmp_path: Path,
    upstream: UpstreamServer,
    route: str,
    overrides: dict[str, Any],
) -> None:
    client = await invocation_app(
        client_factory,
        tmp_path,
        upstream=upstream.url,
        invoke_queue_timeout_seconds=1,
        **overrides,
    )
    fn = await deployed(client, specs=[spec(maxRequestConcurrency=1)])
    if route == "exec":
        path = pexec_url(fn).replace("/pexec/", "/exec/")
        body = json.dumps({"requestBody": {}}).encode()
    else:
        path, body = pexec_url(fn), b"{}"
    await hang_up_while_answered(client, upstream, path, body)
    await slot_is_free(client, fn)


async def test_a_caller_hanging_up_in_the_queue_leaves_it(
    client_factory: ClientFactory, tmp_path: Path, upstream: UpstreamServer
) -> None:
    client = await invocation_app(client_factory, tmp_path, upstream=upstream.url)
    fn = await deployed(client, specs=[spec(maxRequestConcurrency=1)])
    queue = f"/v2/nvcf/queues/functions/{fn['id']}/versions/{fn['versionId']}"

    async def depth() -> int:
        return int((await client.get(queue)).json()["queues"][0]["queueDepth"])

    holder = Exchange(b"{}")  # its answer trickles: the one slot is held
    held = asyncio.ensure_future(
        client.app(
            scope(pexec_url(fn), b"{}", x_upstream_trickle="1000000"), holder.receive, holder.send
        )
    )
    assert await asyncio.to_thread(upstream.trickling.wait, 30)
    waiting = Exchange(b"{}")
    queued = asyncio.ensure_future(
        client.app(scope(pexec_url(fn), b"{}"), waiting.receive, waiting.send)
    )

    async def one_waits() -> bool:
        return await depth() == 1

    await eventually(one_waits, seconds=10)
    waiting.hang_up()
    await asyncio.wait_for(queued, 10)
    assert await depth() == 0
    assert upstream.arrived == 1  # it never reached the worker
    holder.hang_up()
    await asyncio.wait_for(held, 10)
    await slot_is_free(client, fn)


async def _exec_answer(body: bytes, status: int = 200) -> tuple[int, dict[str, Any]]:
    """What `send_exec` answers for a worker's `body`."""
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    outcome = Outcome(status, ((b"content-type", b"application/json"),), body)
    await answers.send_exec(send, {"path": "/x"}, uuid.uuid4(), outcome)
    start, whole = sent
    return start["status"], json.loads(whole["body"])


@pytest.mark.parametrize(
    "body",
    [
        b'{"score": NaN}',
        b"[Infinity]",
        b"[" * 5000 + b"]" * 5000,
        b'{"deep": ' + b"[" * 100 + b"]" * 100 + b"}",
        b'{"text": "\\ud800"}',
        b'{"text": "a\\u0000b"}',
    ],
)
async def test_d24_a_worker_answer_exec_cannot_reencode_is_a_502(body: bytes) -> None:
    status, answer = await _exec_answer(body)
    assert status == 502
    assert (answer["status"], answer["errorCode"]) == ("errored", 502)
    assert "cannot be relayed" in answer["response"]["detail"]


async def test_exec_answers_a_workers_text_and_json_as_they_are() -> None:
    assert (await _exec_answer(b'{"ok": [1.5, "\\u00e9"]}'))[1]["response"] == {"ok": [1.5, "é"]}
    assert (await _exec_answer(b"plain {text"))[1]["response"] == "plain {text"
    status, answer = await _exec_answer(b"not json", 418)
    assert (status, answer["response"]) == (418, "not json")
