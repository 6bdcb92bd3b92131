"""The LLM gateway in front of a real OpenAI-compatible server (a simulated cluster's
`upstream`, tests/support/openai_worker.py), with the real `openai` client: events relayed as
the worker sends them, the body the worker gets, its errors passed on, and a caller closing a
stream mid-way, or hanging up before a whole answer, freeing the instance's slot."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from service.core.server import ConnectionLimits
from tests.support.app import ADMIN_KEY, AppClient, ClientFactory
from tests.support.asgi import Exchange, scope
from tests.support.e2e import V, eventually
from tests.support.invocation import deployed, invocation_app, sample, spec
from tests.support.openai_worker import OpenAIWorker
from tests.support.server import in_loop_server
from tests.support.upstream import UpstreamServer

URIS = ["/v1/chat/completions", "/v1/responses", "/v1/embeddings"]
LLM_FN: dict[str, Any] = {
    "name": "upstream-llm",
    "inferenceUrl": "/",
    "functionType": "LLM",
    "models": [{"name": "served-model", "llmConfig": {"uris": URIS}}],
}
LIMITS = ConnectionLimits(
    header_timeout=10, body_timeout=10, keepalive_timeout=5, max_connections=50
)
ASK: list[ChatCompletionMessageParam] = [{"role": "user", "content": "relay these words"}]


@pytest.fixture
def worker() -> Iterator[OpenAIWorker]:
    worker = OpenAIWorker().start()
    yield worker
    worker.stop()


@contextlib.asynccontextmanager
async def gateway(app: AppClient) -> AsyncIterator[openai.AsyncOpenAI]:
    async with in_loop_server(app.app, LIMITS) as server:
        base = f"http://127.0.0.1:{server.config.port}/v2/nvcf/llm/v1"
        async with openai.AsyncOpenAI(base_url=base, api_key=ADMIN_KEY, max_retries=0) as client:
            yield client


async def test_events_arrive_as_the_worker_sends_them_and_the_body_is_rewritten(
    client_factory: ClientFactory, tmp_path: Path, worker: OpenAIWorker
) -> None:
    app = await invocation_app(client_factory, tmp_path, upstream=worker.url)
    fn = await deployed(app, **LLM_FN)
    worker.gate()
    async with gateway(app) as client:
        stream = await client.chat.completions.create(
            model=f"{fn['id']}/served-model", messages=ASK, stream=True, temperature=0.5
        )
        chunks = aiter(stream)
        first = await anext(chunks)  # the worker has sent only its first event so far
        assert first.choices[0].delta.role == "assistant"
        pieces = []
        for _ in range(4):
            worker.next_event()
            chunk = await anext(chunks)
            pieces.append(chunk.choices[0].delta.content)
        assert pieces == ["Echo:", " relay", " these", " words"]
        for _ in range(2):
            worker.next_event()
        rest = [c async for c in chunks]  # the stop chunk, then [DONE] ends the stream
        assert rest[-1].choices[0].finish_reason == "stop"

    sent = worker.requests[-1]
    assert sent.path == "/v1/chat/completions"
    assert sent.body["model"] == "served-model"
    assert sent.body["temperature"] == 0.5 and sent.body["messages"] == ASK
    headers = {k.lower(): v for k, v in sent.headers.items()}
    assert "authorization" not in headers
    assert len(headers["x-cache-affinity-key"]) == 64
    assert headers["nvcf-function-id"] == fn["id"]


async def test_responses_are_asked_as_streams_and_worker_errors_pass_on(
    client_factory: ClientFactory, tmp_path: Path, worker: OpenAIWorker
) -> None:
    app = await invocation_app(client_factory, tmp_path, upstream=worker.url)
    fn = await deployed(app, **LLM_FN)
    model = f"{fn['id']}/served-model"
    async with gateway(app) as client:
        answer = await client.responses.create(model=model, input="whole answer please")
        assert answer.output_text == "Echo: whole answer please"
        assert worker.requests[-1].body["stream"] is True
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(
                model=model, messages=ASK, extra_body={"x_status": 400}
            )
        assert refused.value.body == {
            "message": "as asked",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
        with pytest.raises(openai.InternalServerError):
            await client.embeddings.create(model=model, input="x", extra_body={"x_status": 500})
    # a worker streaming what was not asked as a stream: passed on as it is
    body = {"model": model, "messages": ASK, "x_force_stream": True}
    resp = await app.post("/v2/nvcf/llm/v1/chat/completions", json=body)
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert resp.text.endswith("data: [DONE]\n\n")


async def test_a_caller_closing_a_stream_frees_the_slot(
    client_factory: ClientFactory, tmp_path: Path, worker: OpenAIWorker
) -> None:
    app = await invocation_app(
        client_factory, tmp_path, upstream=worker.url, invoke_queue_timeout_seconds=30
    )
    fn = await deployed(app, **LLM_FN, specs=[spec(maxRequestConcurrency=1)])
    model = f"{fn['id']}/served-model"
    worker.gate()
    async with gateway(app) as client:
        stream = await client.chat.completions.create(model=model, messages=ASK, stream=True)
        await anext(aiter(stream))
        await stream.close()  # the caller hangs up mid-way
        # the one slot is free again: served at once, not after the worker's stream
        done = await client.embeddings.create(model=model, input="next")
        assert len(done.data) == 1


async def test_a_caller_hanging_up_before_the_whole_answer_frees_the_slot(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    """A non-streamed answer is read whole before the caller gets it: a caller hanging up
    meanwhile ends the worker request and frees the slot at once."""
    upstream = UpstreamServer().start()
    try:
        app = await invocation_app(
            client_factory, tmp_path, upstream=upstream.url, invoke_queue_timeout_seconds=1
        )
        fn = await deployed(app, **LLM_FN, specs=[spec(maxRequestConcurrency=1)])
        path = "/v2/nvcf/llm/v1/chat/completions"
        # (in the body: the gateway forwards a fixed set of headers)
        ask = {"model": f"{fn['id']}/served-model", "messages": ASK, "x_upstream_trickle": 10**6}
        body = json.dumps(ask).encode()
        exchange = Exchange(body)
        call = asyncio.ensure_future(app.app(scope(path, body), exchange.receive, exchange.send))
        assert await asyncio.to_thread(upstream.trickling.wait, 30)
        exchange.hang_up()
        await asyncio.wait_for(call, 10)
        assert await asyncio.to_thread(upstream.trickle_cut.wait, 10)
        labels = {"function_id": fn["id"], "version_id": fn["versionId"]}

        async def freed() -> bool:
            text = (await app.get("/metrics")).text
            return sample(text, "nvcf_invocation_in_flight", **labels) == 0

        await eventually(freed, seconds=10)
        after = {"model": f"{fn['id']}/served-model", "input": "next"}
        assert (await app.post("/v2/nvcf/llm/v1/embeddings", json=after)).status_code == 200
    finally:
        upstream.stop()


@pytest.mark.parametrize("raw", ["NaN", "[" * 5000 + "]" * 5000, '{"prompt_tokens": 1e999}'])
async def test_d24_a_usage_the_one_parser_refuses_is_not_counted_and_cuts_nothing(
    client_factory: ClientFactory, tmp_path: Path, worker: OpenAIWorker, raw: str
) -> None:
    app = await invocation_app(client_factory, tmp_path, upstream=worker.url)
    fn = await deployed(app, **LLM_FN)
    model = f"{fn['id']}/served-model"
    body = {"model": model, "messages": ASK, "stream": True, "x_raw": raw}
    resp = await app.post("/v2/nvcf/llm/v1/chat/completions", json=body)
    assert resp.status_code == 200
    assert f'"usage":{raw}}}' in resp.text  # the whole stream, the bad chunk included
    assert resp.text.endswith("data: [DONE]\n\n")
    async with gateway(app) as client:
        whole = await client.chat.completions.with_raw_response.create(
            model=model, messages=ASK, extra_body={"x_raw": raw}
        )
        assert whole.status_code == 200  # relayed as the worker wrote it
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(
                model=model, messages=ASK, extra_body={"x_status": 400, "x_raw": raw}
            )
        assert refused.value.status_code == 400


async def test_the_worker_gets_nvcfs_fixed_headers_and_the_resolved_priority(
    client_factory: ClientFactory, tmp_path: Path, worker: OpenAIWorker
) -> None:
    app = await invocation_app(client_factory, tmp_path, upstream=worker.url)
    priority = {"priority": {"defaultPriority": 7, "perAccountPriority": {"other": 1}}}
    fn = await deployed(app, **LLM_FN, llmInvocationConfig=priority)
    model = f"{fn['id']}/served-model"
    mine = {"x-cache-affinity-key": "chosen-by-me", "x-custom": "1", "x-routing-key": "forged"}
    async with gateway(app) as client:
        await client.chat.completions.create(
            model=model, messages=ASK, prompt_cache_key="conv-1", extra_headers=mine
        )
        sent = {k.lower(): v for k, v in worker.requests[-1].headers.items()}
        assert len(sent["x-cache-affinity-key"]) == 64  # the gateway's hash, not the caller's
        assert "x-custom" not in sent and "authorization" not in sent
        assert (sent["x-routing-key"], sent["x-model"]) == (fn["id"], "served-model")
        assert sent["x-priority"] == "7"  # the default: the caller's account has no override
        assert sent["x-routing-method"] == "power-of-two"
        assert int(sent["x-token-estimate"]) >= int(sent["x-input-tokens"]) > 0
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(
                model=model, messages=ASK, extra_headers={"X-Priority": "0"}
            )
        assert "X-Priority is a reserved header" in str(refused.value.body)
    count = len(worker.requests)
    body = {"model": model, "input": "x"}
    resp = await app.post("/v2/nvcf/llm/v1/embeddings", json=body, headers={"x-priority": ""})
    assert resp.status_code == 400 and len(worker.requests) == count  # present, even empty


async def test_a_waiting_request_of_a_lower_priority_value_is_served_first(
    client_factory: ClientFactory, tmp_path: Path, worker: OpenAIWorker
) -> None:
    app = await invocation_app(
        client_factory,
        tmp_path,
        upstream=worker.url,
        invoke_queue_timeout_seconds=30,
        invoke_route_cache_seconds=0,
    )
    config = {"priority": {"defaultPriority": 7}}
    fn = await deployed(
        app, **LLM_FN, llmInvocationConfig=config, specs=[spec(maxRequestConcurrency=1)]
    )
    model = f"{fn['id']}/served-model"
    dispatcher = app.app.state.invocation.dispatcher
    vid = uuid.UUID(fn["versionId"])

    async def depth(n: int) -> bool:
        return bool(dispatcher.depth_now(vid) == n)

    worker.gate()
    async with gateway(app) as client:
        holder = await client.chat.completions.create(model=model, messages=ASK, stream=True)
        await anext(aiter(holder))  # the one slot is taken
        later = asyncio.ensure_future(client.embeddings.create(model=model, input="priority 7"))
        await eventually(lambda: depth(1))
        update = {"llmInvocationConfig": {"priority": {"defaultPriority": 0}}}
        resp = await app.put(f"{V}/functions/{fn['id']}/versions/{fn['versionId']}", json=update)
        assert resp.status_code == 200, resp.text
        first = asyncio.ensure_future(client.embeddings.create(model=model, input="priority 0"))
        await eventually(lambda: depth(2))
        await holder.close()  # the slot is free: the lower value takes it, then the other
        await asyncio.gather(first, later)
    inputs = [r.body["input"] for r in worker.requests if r.path.endswith("/embeddings")]
    assert inputs == ["priority 0", "priority 7"]
