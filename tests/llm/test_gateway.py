"""The LLM gateway end to end (issue 28): the real `openai` package, unmodified, against the
server on a real connection, an LLM function deployed on the simulated cluster whose embedded
worker answers as a tiny model — chat completions with and without streaming, responses,
embeddings, the models list, with the sync and the async client; errors raised as the
client's own exception types."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from service.core.server import ConnectionLimits
from tests.support.api import bearer, create_fn, new_key
from tests.support.app import ADMIN_KEY, AppClient, ClientFactory
from tests.support.client_cli import served
from tests.support.e2e import eventually
from tests.support.invocation import deployed, invocation_app, sample, spec
from tests.support.server import in_loop_server

SUFFIX = "invocation.localhost"
URIS = ["/v1/chat/completions", "/v1/responses", "/v1/embeddings"]
LLM_FN: dict[str, Any] = {
    "name": "tiny-llm",
    "inferenceUrl": "/",
    "functionType": "LLM",
    "models": [
        {"name": "tiny/chat", "llmConfig": {"uris": URIS, "routingMethod": "round_robin"}},
        {"name": "embed-only", "llmConfig": {"uris": ["/v1/embeddings"]}},
    ],
}
LIMITS = ConnectionLimits(
    header_timeout=10, body_timeout=10, keepalive_timeout=5, max_connections=50
)


@contextlib.asynccontextmanager
async def serving(client: AppClient) -> AsyncIterator[str]:
    async with in_loop_server(client.app, LIMITS) as server:
        yield f"http://127.0.0.1:{server.config.port}"


@pytest.fixture
async def app(client_factory: ClientFactory, tmp_path: Path) -> AppClient:
    return await invocation_app(client_factory, tmp_path, invoke_host_suffix=SUFFIX)


def async_client(base: str, key: str = ADMIN_KEY) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base}/v2/nvcf/llm/v1", api_key=key, max_retries=0)


async def test_openai_clients_chat_stream_embed_respond_and_list(app: AppClient) -> None:
    fn = await deployed(app, **LLM_FN)
    model = f"{fn['id']}/tiny/chat"
    async with serving(app) as base, contextlib.AsyncExitStack() as stack:
        client = async_client(base)
        stack.push_async_callback(client.close)
        chat = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hello there world"}]
        )
        assert chat.choices[0].message.content == "Echo: hello there world"
        assert chat.model == "tiny/chat"  # the worker got the model's own name
        assert chat.usage is not None and chat.usage.prompt_tokens == 3

        stream = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "one two three"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        pieces, usage = [], None
        async for chunk in stream:
            if chunk.choices:
                pieces.append(chunk.choices[0].delta.content or "")
            if chunk.usage is not None:
                usage = chunk.usage
        assert "".join(pieces) == "Echo: one two three"
        assert usage is not None and usage.completion_tokens == 4

        emb = await client.embeddings.create(model=f"{fn['id']}/embed-only", input=["a", "b c"])
        assert [len(d.embedding) for d in emb.data] == [16, 16]
        assert emb.data[0].embedding != emb.data[1].embedding

        # responses: the worker is always asked to stream; a non-streaming caller gets the
        # terminal object
        response = await client.responses.create(model=model, input="say this")
        assert response.output_text == "Echo: say this"
        assert response.usage is not None and response.usage.output_tokens == 3
        events = await client.responses.create(model=model, input="stream me", stream=True)
        kinds = [e.type async for e in events]
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        assert "response.output_text.delta" in kinds

        listed = await client.models.list()
        assert sorted(m.id for m in listed.data) == sorted([model, f"{fn['id']}/embed-only"])

        # the sync client, unmodified, in a thread (the server runs in this loop)
        def sync_chat() -> str:
            sync = openai.OpenAI(
                base_url=f"{base}/v2/nvcf/llm/v1", api_key=ADMIN_KEY, max_retries=0
            )
            try:
                done = sync.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": "sync call"}]
                )
                return str(done.choices[0].message.content)
            finally:
                sync.close()

        assert await asyncio.to_thread(sync_chat) == "Echo: sync call"


async def test_the_llm_host_serves_the_same_routes(app: AppClient) -> None:
    fn = await deployed(app, **LLM_FN)
    body = {"model": f"{fn['id']}/tiny/chat", "messages": [{"role": "user", "content": "x"}]}
    resp = await app.post("/v1/chat/completions", json=body, headers={"Host": f"llm.{SUFFIX}:8080"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"] == "Echo: x"
    session = resp.headers["x-multi-turn-session-id"]
    again = await app.post(
        "/v1/chat/completions",
        json={**body, "prompt_cache_key": "conv-7"},
        headers={"Host": f"llm.{SUFFIX}"},
    )
    assert again.headers["x-multi-turn-session-id"] == "conv-7"
    assert session != "conv-7"
    # another host is not the gateway's
    other = await app.get("/v1/models", headers={"Host": "llm.elsewhere.example"})
    assert other.status_code == 404 and other.headers["content-type"] == "application/problem+json"


async def test_the_org_aliases_and_a_leading_double_slash_reach_the_gateway(
    app: AppClient,
) -> None:
    # as every /v2/nvcf route is served under them (an absolute URL: "//v2/..." names no host)
    fn = await deployed(app, **LLM_FN)
    body = {"model": f"{fn['id']}/tiny/chat", "messages": [{"role": "user", "content": "x"}]}
    org = fn["ncaId"]
    for path in (
        f"/v2/orgs/{org}/nvcf/llm/v1/chat/completions",
        f"/v2/orgs/{org}/teams/t/nvcf/llm/v1/chat/completions/",
        "//v2/nvcf/llm/v1/chat/completions",
    ):
        resp = await app.post(f"http://nvcf.test{path}", json=body)
        assert resp.status_code == 200, (path, resp.text)
        assert resp.json()["choices"][0]["message"]["content"] == "Echo: x"
    # the org in the path is checked against the caller's, the refusal in OpenAI's shape
    resp = await app.post("/v2/orgs/elsewhere/nvcf/llm/v1/chat/completions", json=body)
    assert resp.status_code == 403, resp.text
    assert "elsewhere" in resp.json()["error"]["message"]


async def test_errors_are_openais_and_the_client_raises_its_own_types(app: AppClient) -> None:
    fn = await deployed(app, **LLM_FN)
    plain = await deployed(app)  # not an LLM function
    async with serving(app) as base, contextlib.AsyncExitStack() as stack:
        client = async_client(base)
        stack.push_async_callback(client.close)
        ask: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
        with pytest.raises(openai.NotFoundError) as missing:
            await client.chat.completions.create(model=f"{uuid.uuid4()}/tiny/chat", messages=ask)
        assert missing.value.code == "model_not_found"
        with pytest.raises(openai.BadRequestError) as unprefixed:
            await client.chat.completions.create(model="gpt-4o", messages=ask)
        body = unprefixed.value.body
        assert isinstance(body, dict) and body["message"] == "model prefix is required"
        with pytest.raises(openai.NotFoundError) as not_llm:
            await client.chat.completions.create(model=f"{plain['id']}/m", messages=ask)
        assert "not an LLM function" in not_llm.value.message
        with pytest.raises(openai.BadRequestError) as bad:
            await client.chat.completions.create(model=f"{fn['id']}/tiny/chat", messages=[])
        assert bad.value.param == "messages"
        reader = await new_key(app, ["list_functions"])
        for key, error in [
            ("nvapi-not-a-key", openai.AuthenticationError),
            (reader, openai.PermissionDeniedError),
        ]:
            async with async_client(base, key=key) as other:
                with pytest.raises(error):
                    await other.models.list()

    # an LLM function not deployed: no version can serve it now
    idle = await create_fn(app, **LLM_FN)
    body = {"model": f"{idle['id']}/tiny/chat", "messages": [{"role": "user", "content": "x"}]}
    unavailable = await app.post("/v2/nvcf/llm/v1/chat/completions", json=body)
    assert unavailable.status_code == 503, unavailable.text
    assert unavailable.json()["error"]["code"] == "model_not_available"
    # no key at all (the openai client always sends one)
    anonymous = await app.get("/v2/nvcf/llm/v1/models", headers={"Authorization": ""})
    assert anonymous.status_code == 401, anonymous.text
    assert anonymous.json()["error"]["code"] == "invalid_api_key"
    # the raw shape, and routes the gateway does not serve
    for method, path, status in [
        ("POST", "/v2/nvcf/llm/v1/completions", 404),
        ("GET", "/v2/nvcf/llm/v1/chat/completions", 405),
    ]:
        resp = await app.request(method, path, json={})
        assert resp.status_code == status
        assert set(resp.json()["error"]) == {"message", "type", "param", "code"}
        assert resp.json()["message"] == resp.json()["error"]["message"]  # NVCF's place
    # made-up names never become metrics series
    metrics = (await app.get("/metrics")).text
    assert sample(metrics, "nvcf_llm_requests_total", model="ghost") == 0
    assert sample(metrics, "nvcf_llm_requests_total", endpoint="/v1/completions") == 0
    assert sample(metrics, "nvcf_llm_requests_total", endpoint="other", status="404") == 1
    huge = await app.post(
        "/v2/nvcf/llm/v1/chat/completions",
        content=b"{" + b" " * (6 * 1024 * 1024) + b"}",
        headers={"content-type": "application/json"},
    )
    assert huge.status_code == 413 and "error" in huge.json()


async def test_every_answer_is_one_the_openapi_document_declares(app: AppClient) -> None:
    """Each route's successes and refusals: a status its operation declares, in a content type
    declared for that status (OpenAI's error object, not problem+json)."""
    doc = app.app.openapi()
    fn = await deployed(app, **LLM_FN, specs=[spec()])
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    sent: list[tuple[str, str, Any, dict[str, str]]] = [
        ("GET", "/v1/models", None, {}),
        ("GET", "/v1/models", None, {"Authorization": ""}),
        ("POST", "/v1/chat/completions", {"model": f"{fn['id']}/tiny/chat", **chat}, {}),
        (
            "POST",
            "/v1/chat/completions",
            {**chat, "stream": True, "model": f"{fn['id']}/tiny/chat"},
            {},
        ),
        ("POST", "/v1/chat/completions", {"model": f"{uuid.uuid4()}/ghost", **chat}, {}),
        ("POST", "/v1/chat/completions", {"model": f"{fn['id']}/tiny/chat"}, {}),
        (
            "POST",
            "/v1/chat/completions",
            {"model": f"{fn['id']}/tiny/chat", **chat},
            {"x-multi-turn-session-id": "\x01"},
        ),
        ("POST", "/v1/embeddings", {"model": f"{fn['id']}/embed-only", "input": "x"}, {}),
        ("POST", "/v1/embeddings", {"model": f"{fn['id']}/embed-only", "input": []}, {}),
        ("POST", "/v1/responses", {"model": f"{fn['id']}/tiny/chat", "input": "hi"}, {}),
        ("POST", "/v1/responses", {"model": f"{fn['id']}/embed-only", "input": "hi"}, {}),
    ]
    seen: set[int] = set()
    for method, path, body, headers in sent:
        resp = await app.request(method, "/v2/nvcf/llm" + path, json=body, headers=headers)
        responses = doc["paths"]["/v2/nvcf/llm" + path][method.lower()]["responses"]
        assert str(resp.status_code) in responses, (path, resp.status_code, resp.text)
        kind = resp.headers["content-type"].split(";")[0]
        assert kind in responses[str(resp.status_code)]["content"], (path, kind)
        seen.add(resp.status_code)
    assert seen == {200, 400, 401, 404}


async def test_a_token_rate_limit_refuses_the_request_that_would_exceed_it(
    app: AppClient,
) -> None:
    limited = {
        **LLM_FN,
        "models": [{"name": "m", "llmConfig": {"uris": URIS, "tokenRateLimit": "40-M"}}],
    }
    fn = await deployed(app, **limited)
    async with serving(app) as base, contextlib.AsyncExitStack() as stack:
        client = async_client(base)
        stack.push_async_callback(client.close)
        model = f"{fn['id']}/m"
        ask: list[ChatCompletionMessageParam] = [{"role": "user", "content": "short"}]
        # estimated at max_tokens + input: refused before any worker sees it
        with pytest.raises(openai.RateLimitError) as refused:
            await client.chat.completions.create(model=model, messages=ask, max_tokens=100)
        assert refused.value.response.headers["retry-after"]
        assert "Request too large" in refused.value.message
        # charged 3 + 30 first, then corrected to what the worker used (1 + 2 tokens)
        await client.chat.completions.create(model=model, messages=ask, max_tokens=30)
        await client.chat.completions.create(model=model, messages=ask, max_tokens=30)
        # a stream whose usage corrects the estimate too
        stream = await client.chat.completions.create(
            model=model,
            messages=ask,
            max_tokens=30,
            stream=True,
            stream_options={"include_usage": True},
        )
        async for _ in stream:
            pass
        used = 3 * 3
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(model=model, messages=ask, max_tokens=40 - used)
    metrics = (await app.get("/metrics")).text
    assert sample(metrics, "nvcf_llm_tokens_total", function_id=fn["id"], token_type="output") == 6
    assert (
        sample(metrics, "nvcf_llm_requests_total", function_id=fn["id"], model="m", status="429")
        == 2
    )
    assert sample(metrics, "nvcf_llm_time_to_first_token_seconds_count", model="m") == 1


async def test_answers_that_count_tokens_carry_nvcfs_rate_limit_headers(app: AppClient) -> None:
    limited = {
        **LLM_FN,
        "models": [
            {"name": "m", "llmConfig": {"uris": URIS, "tokenRateLimit": "5000-H,40-M"}},
            {"name": "free", "llmConfig": {"uris": URIS}},
        ],
    }
    fn = await deployed(app, **limited)
    ask: list[ChatCompletionMessageParam] = [{"role": "user", "content": "short"}]
    async with serving(app) as base, async_client(base) as client:
        model = f"{fn['id']}/m"
        whole = await client.chat.completions.with_raw_response.create(
            model=model, messages=ask, max_tokens=30
        )
        streamed = await client.chat.completions.with_raw_response.create(
            model=model, messages=ask, max_tokens=3, stream=True
        )
        with pytest.raises(openai.RateLimitError) as refused:
            await client.chat.completions.create(model=model, messages=ask, max_tokens=100)
        free = await client.chat.completions.with_raw_response.create(
            model=f"{fn['id']}/free", messages=ask
        )
    # the minute's window (the shortest) as of the charge: 40 - (3 + 30); the next one's
    # after the worker's usage gave most of that back
    assert whole.headers["x-ratelimit-remaining-tokens"] == "7"
    assert int(streamed.headers["x-ratelimit-remaining-tokens"]) > 7
    for headers in (whole.headers, streamed.headers):
        assert headers["x-ratelimit-limit-tokens"] == "40"
        assert re.fullmatch(r"(\d+ms|\d+(\.\d+)?s|1m0s)", headers["x-ratelimit-reset-tokens"])
        assert headers["x-should-retry"] == "false"
    headers = refused.value.response.headers
    assert headers["x-ratelimit-limit-tokens"] == "40"
    assert headers["x-should-retry"] == "true" and int(headers["retry-after"]) <= 60
    assert "x-ratelimit-limit-tokens" not in free.headers  # nothing counted


async def test_each_account_is_refused_at_its_own_token_limits_counted_from_usage(
    client_factory: ClientFactory, tmp_path: Path
) -> None:
    """accountInputTokenRateLimit/accountOutputTokenRateLimit (NVIDIA/nvcf PR #1658): the
    workers' reported usage counted per account over every model; once a window has counted
    its limit the next request is a 429 before any worker, naming the limit; another account
    with a higher limit (the setting's) goes on."""
    app = await invocation_app(
        client_factory, tmp_path, llm_account_output_token_rate_limit="1000-M"
    )
    fn = await deployed(app, **LLM_FN)
    shared = {"authorizedParties": [{"ncaId": "team-low"}, {"ncaId": "team-high"}]}
    resp = await app.post(f"/v2/nvcf/authorizations/functions/{fn['id']}", json=shared)
    assert resp.status_code == 200, resp.text
    limits = {"accountInputTokenRateLimit": "2-M,1000-MO"}
    resp = await app.post("/v2/nvcf/accounts/team-low", json={"name": "low", **limits})
    assert resp.json()["account"]["accountOutputTokenRateLimit"] == "1000-M"  # the setting's
    low = bearer(await new_key(app, ["invoke_function"], "team-low"))
    high = bearer(await new_key(app, ["invoke_function"], "team-high"))

    async def chat(headers: dict[str, str]) -> httpx.Response:
        # the tiny model counts "short" as 1 input token and answers 2 ("Echo: short")
        body = {
            "model": f"{fn['id']}/tiny/chat",
            "messages": [{"role": "user", "content": "short"}],
        }
        return await app.post("/v2/nvcf/llm/v1/chat/completions", json=body, headers=headers)

    assert [(await chat(low)).status_code for _ in range(2)] == [200, 200]
    refused = await chat(low)
    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert error["code"] == "rate_limit_exceeded" and error["type"] == "tokens"
    assert error["message"].startswith(
        "Rate limit reached for account `team-low` on input tokens (accountInputTokenRateLimit "
        "2-M): 2 tokens counted of 2 in this window. Please try again in "
    )
    assert int(refused.headers["retry-after"]) <= 60
    assert [(await chat(high)).status_code for _ in range(3)] == [200] * 3

    # a lower output limit judges the tokens already counted in its window (3 answers × 2)
    resp = await app.patch(
        "/v2/nvcf/accounts/team-high", json={"accountOutputTokenRateLimit": "7-M"}
    )
    assert resp.json()["account"]["accountInputTokenRateLimit"] == ""  # the setting's: none
    assert (await chat(high)).status_code == 200  # 6 counted, under 7: on, then 8
    error = (await chat(high)).json()["error"]
    assert (
        "on output tokens (accountOutputTokenRateLimit 7-M): 8 tokens counted" in (error["message"])
    )
    # "" lifts the account's limit whatever the setting says
    await app.patch("/v2/nvcf/accounts/team-high", json={"accountOutputTokenRateLimit": ""})
    assert (await chat(high)).status_code == 200
    # refused before a worker: only the 7 requests let through were answered (2 tokens each)
    text = (await app.get("/metrics")).text
    assert sample(text, "nvcf_llm_tokens_total", function_id=fn["id"], token_type="output") == 14
    assert sample(text, "nvcf_llm_requests_total", function_id=fn["id"], status="429") == 2


async def test_a_model_the_caller_cannot_see_is_not_found(app: AppClient) -> None:
    fn = await deployed(app, **LLM_FN)
    other = await new_key(app, ["invoke_function"], "other-account")
    body = {"model": f"{fn['id']}/tiny/chat", "messages": [{"role": "user", "content": "x"}]}
    resp = await app.post("/v2/nvcf/llm/v1/chat/completions", json=body, headers=bearer(other))
    assert resp.status_code == 404, resp.text
    assert resp.json()["error"]["code"] == "model_not_found"
    listed = await app.get("/v2/nvcf/llm/v1/models", headers=bearer(other))
    assert listed.json() == {"object": "list", "data": []}


async def test_the_version_the_gateway_checks_is_the_one_resolved_for_the_engine(
    app: AppClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One resolution per request: the gateway checks (model, tokens, preferred instance) the
    version the engine admits, never one it looked up beforehand on its own."""
    fn = await deployed(app, **LLM_FN)
    routes = app.app.state.invocation.routes
    resolve = routes.resolve
    resolved: list[uuid.UUID] = []

    async def counted(principal: Any, function_id: uuid.UUID, version_id: Any, key: str) -> Any:
        resolved.append(function_id)
        return await resolve(principal, function_id, version_id, key)

    monkeypatch.setattr(routes, "resolve", counted)
    body = {"model": f"{fn['id']}/tiny/chat", "messages": [{"role": "user", "content": "x"}]}
    resp = await app.post("/v2/nvcf/llm/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    assert resolved == [uuid.UUID(fn["id"])]


async def test_d25_a_trailing_slash_names_the_same_route(app: AppClient) -> None:
    fn = await deployed(app, **LLM_FN)
    ask = {"model": f"{fn['id']}/tiny/chat"}
    for path, body in [
        ("chat/completions/", {**ask, "messages": [{"role": "user", "content": "x"}]}),
        ("responses/", {**ask, "input": "x"}),
        ("embeddings//", {**ask, "input": "x"}),
    ]:
        resp = await app.post(f"/v2/nvcf/llm/v1/{path}", json=body)
        assert resp.status_code == 200, resp.text
    assert (await app.get("/v2/nvcf/llm/v1/models/")).status_code == 200
    refused = await app.get("/v2/nvcf/llm/v1/embeddings/")
    assert refused.status_code == 405 and refused.json()["error"]["code"] == "method_not_allowed"


async def test_an_undeclared_model_or_path_passes_unless_the_allowlist_refuses_it(
    client_factory: ClientFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ask: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
    for allowlist in (False, True):
        folder = tmp_path / str(allowlist)
        folder.mkdir()
        app = await invocation_app(client_factory, folder, llm_model_allowlist=allowlist)
        fn = await deployed(app, **LLM_FN)
        async with serving(app) as base, async_client(base) as client:
            if not allowlist:  # NVCF's default: through to the worker, and logged
                for model in ("embed-only", "ghost"):
                    answer = await client.chat.completions.create(
                        model=f"{fn['id']}/{model}", messages=ask
                    )
                    assert answer.choices[0].message.content == "Echo: hi"
                assert "does not declare /v1/chat/completions" in caplog.text
                assert "declares no model 'ghost'" in caplog.text
                continue
            with pytest.raises(openai.BadRequestError) as path:
                await client.chat.completions.create(model=f"{fn['id']}/embed-only", messages=ask)
            assert path.value.code == "unsupported_endpoint"
            assert 'model "embed-only" does not support /v1/chat/completions' in path.value.message
            with pytest.raises(openai.NotFoundError) as ghost:
                await client.chat.completions.create(model=f"{fn['id']}/ghost", messages=ask)
            assert ghost.value.code == "model_not_found"


async def test_errors_read_the_same_by_openais_client_and_by_nvcfs_shape(app: AppClient) -> None:
    fn = await deployed(app, **LLM_FN)
    model = f"{fn['id']}/tiny/chat"
    bad = {"model": model, "messages": []}
    async with serving(app) as base, async_client(base) as client:
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(model=model, messages=[])
        async with httpx.AsyncClient(base_url=base, headers=bearer(ADMIN_KEY)) as plain:
            resp = await plain.post("/v2/nvcf/llm/v1/chat/completions", json=bad)
    text = resp.json()["message"]  # what a client of NVCF's `{"message"}` reads
    assert "'messages' must be a non-empty array" in text
    body = refused.value.body
    assert isinstance(body, dict) and body["message"] == text
    assert refused.value.param == "messages"


async def test_a_session_sticks_to_one_of_three_instances_without_it_requests_spread(
    app: AppClient,
) -> None:
    fn = await deployed(
        app,
        specs=[spec(minInstances=3, maxInstances=3)],
        **{
            **LLM_FN,
            "models": [
                {"name": "chat", "llmConfig": {"uris": URIS[:1]}},
                {"name": "emb", "llmConfig": {"uris": URIS[2:], "routingMethod": "round_robin"}},
            ],
        },
    )
    url = "/v2/nvcf/llm/v1"

    async def served_by(path: str, body: dict[str, Any]) -> str:
        resp = await app.post(f"{url}{path}", json=body)
        assert resp.status_code == 200, resp.text
        return resp.headers["x-sim-instance-id"]

    # round robin (embeddings have no session): each of the three in turn, once all run
    async def cycles() -> bool:
        emb = {"model": f"{fn['id']}/emb", "input": "x"}
        return len({await served_by("/embeddings", emb) for _ in range(3)}) == 3

    await eventually(cycles)

    turns: list[dict[str, str]] = []
    homes = set()
    for turn in range(10):
        turns.append({"role": "user", "content": f"turn {turn}"})
        body = {"model": f"{fn['id']}/chat", "messages": turns, "prompt_cache_key": "conv-1"}
        homes.add(await served_by("/chat/completions", body))
        turns.append({"role": "assistant", "content": "ok"})
    assert len(homes) == 1

    spread = set()
    for turn in range(10):
        body = {"model": f"{fn['id']}/chat", "messages": [{"role": "user", "content": f"q{turn}"}]}
        spread.add(await served_by("/chat/completions", body))
    assert len(spread) > 1


def test_the_openai_client_against_the_real_server_process(tmp_path: Path) -> None:
    """`nvcf-server serve` in its own process (the built-in simulated catalog) and the sync
    client streaming through the gateway's prefix."""
    with served(tmp_path / "server") as url:
        api = httpx.Client(base_url=f"{url}/v2/nvcf", headers=bearer(ADMIN_KEY), timeout=30)
        with api:
            fn = api.post("/functions", json={**LLM_FN, "containerImage": "nvcr.io/a/b:1"})
            fn.raise_for_status()
            created = fn.json()["function"]
            spec_body = {
                "deploymentSpecifications": [
                    {
                        "gpu": "H100",
                        "instanceType": "NCP.GPU.H100_1x",
                        "minInstances": 1,
                        "maxInstances": 1,
                    }
                ]
            }
            dep = f"/deployments/functions/{created['id']}/versions/{created['versionId']}"
            api.post(dep, json=spec_body).raise_for_status()
            version = f"/functions/{created['id']}/versions/{created['versionId']}"
            for _ in range(600):
                if api.get(version).json()["function"]["status"] == "ACTIVE":
                    break
                time.sleep(0.1)
        client = openai.OpenAI(base_url=f"{url}/v2/nvcf/llm/v1", api_key=ADMIN_KEY, max_retries=0)
        with client:
            stream = client.chat.completions.create(
                model=f"{created['id']}/tiny/chat",
                messages=[{"role": "user", "content": "from another process"}],
                stream=True,
            )
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            assert text == "Echo: from another process"
            with pytest.raises(openai.NotFoundError):
                client.embeddings.create(model=f"{uuid.uuid4()}/nope", input="x")
