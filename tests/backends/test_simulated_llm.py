"""The simulated worker's tiny model (service/backends/simulated/llm.py, worker.py): OpenAI's
shapes on the three routes, streamed when asked, deterministic, the answering instance named."""

from __future__ import annotations

import json

from service.backends.simulated import llm
from service.backends.simulated.worker import INSTANCE_HEADER, SimulatedWorkers


def events(chunks: list[bytes]) -> list[str]:
    return [c.decode().split("data: ", 1)[1].strip() for c in chunks]


def test_chat_answers_and_streams_the_same_reply_with_usage() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "a b"}],
    }
    whole = llm.chat_completion(body)
    assert whole["choices"][0]["message"]["content"] == "Echo: a b"
    assert whole["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    streamed = events(list(llm.chat_chunks({**body, "stream_options": {"include_usage": True}})))
    assert streamed[-1] == "[DONE]"
    chunks = [json.loads(e) for e in streamed[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "Echo: a b"
    assert chunks[-1]["usage"]["completion_tokens"] == 3
    assert "usage" not in json.loads(events(list(llm.chat_chunks(body)))[-2])


def test_responses_and_embeddings_have_openais_shapes() -> None:
    response = llm.response_object({"model": "m", "input": "hello world"})
    assert response["output"][0]["content"][0]["text"] == "Echo: hello world"
    streamed = [c.decode() for c in llm.response_events({"input": "hi"})]
    assert streamed[0].startswith("event: response.created")
    assert streamed[-1].startswith("event: response.completed")
    emb = llm.embeddings({"model": "m", "input": ["a", "b"]})
    vectors = [d["embedding"] for d in emb["data"]]
    assert [len(v) for v in vectors] == [llm.DIMENSIONS] * 2 and vectors[0] != vectors[1]
    assert vectors[0] == llm.embeddings({"input": "a"})["data"][0]["embedding"]


async def test_the_worker_answers_the_routes_and_names_the_instance() -> None:
    workers = SimulatedWorkers(running=lambda _ns: True)
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "q"}]}).encode()
    answer = await workers.answer("sr-abc", "POST", "/base/v1/chat/completions", [], body)
    assert answer.status == 200 and (INSTANCE_HEADER, "abc") in answer.headers
    content = b"".join([c async for c in answer.iter_bytes()])
    assert json.loads(content)["choices"][0]["message"]["content"] == "Echo: q"
    streamed = json.dumps({"model": "m", "input": "s", "stream": True}).encode()
    answer = await workers.answer("sr-abc", "POST", "/v1/responses", [], streamed)
    assert ("content-type", "text/event-stream") in answer.headers
    assert b"response.completed" in b"".join([c async for c in answer.iter_bytes()])
    bad = await workers.answer("sr-abc", "POST", "/v1/embeddings", [], b"[1]")
    assert bad.status == 400
    echo = await workers.answer("sr-abc", "POST", "/echo", [], b"{}")
    assert echo.status == 200 and INSTANCE_HEADER not in dict(echo.headers)
