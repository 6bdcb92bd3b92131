"""The gateway's request bodies (service/llm/schemas.py) and its errors in OpenAI's shape
(service/llm/errors.py)."""

from __future__ import annotations

import json
import uuid

import pytest

from service.core.errors import FieldError, TooManyRequests, ValidationFailed
from service.llm.errors import OpenAIError, from_domain
from service.llm.schemas import MAX_EMBEDDING_INPUTS, parse_request

FID = uuid.UUID("7f0c9c5e-3a43-4d55-8a5e-6a3b1f0e9d21")
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
EMBEDDINGS = "/v1/embeddings"


def raw(**body: object) -> bytes:
    return json.dumps({"model": f"{FID}/meta/llama-3", **body}).encode()


def error_of(path: str, body: bytes) -> OpenAIError:
    with pytest.raises(OpenAIError) as info:
        parse_request(path, body)
    return info.value


def test_only_model_is_rewritten_and_everything_else_passes_unchanged() -> None:
    extra = {
        "messages": [{"role": "user", "content": "héllo ☃"}],
        "temperature": 0.25,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "vendor_field": {"nested": [1, 2, {"x": None}]},
    }
    parsed = parse_request(CHAT, raw(**extra))
    assert parsed.ref.function_id == FID and parsed.ref.name == "meta/llama-3"
    assert parsed.stream is True
    sent = json.loads(parsed.worker_body())
    assert sent == {"model": "meta/llama-3", **extra}
    assert json.loads(parsed.worker_body(stream=True))["stream"] is True


def test_each_endpoint_accepts_its_documented_shapes() -> None:
    assert parse_request(RESPONSES, raw(input="hi")).stream is False
    assert parse_request(RESPONSES, raw(input=[{"role": "user", "content": "x"}])).body
    assert parse_request(RESPONSES, raw(conversation={"id": "c"}, input="x")).body
    assert parse_request(EMBEDDINGS, raw(input="text")).body
    assert parse_request(EMBEDDINGS, raw(input=["a"] * MAX_EMBEDDING_INPUTS)).body


@pytest.mark.parametrize(
    ("path", "body", "param", "words"),
    [
        (CHAT, raw(), "messages", "is required"),
        (CHAT, raw(messages=[]), "messages", "must be a non-empty array"),
        (CHAT, raw(messages=["hi"]), "messages", "message objects"),
        (CHAT, raw(messages=[{}], stream="yes"), "stream", "boolean"),
        (CHAT, raw(messages=[{}], max_tokens=-1), "max_tokens", "≥ 0"),
        (CHAT, raw(messages=[{}], prompt_cache_key="k" * 257), "prompt_cache_key", "256 bytes"),
        (CHAT, raw(messages=[{}], prompt_cache_key="a\nb"), "prompt_cache_key", "control"),
        (RESPONSES, raw(input=5), "input", "string or an array"),
        (RESPONSES, raw(conversation=[1]), "conversation", "conversation id"),
        (EMBEDDINGS, raw(input=""), "input", "must not be empty"),
        (EMBEDDINGS, raw(input=[]), "input", "must not be empty"),
        (EMBEDDINGS, raw(input=[1, 2]), "input", "array of strings"),
        (EMBEDDINGS, raw(input=["a", ""]), "input", "empty strings"),
        (EMBEDDINGS, raw(input=["a"] * (MAX_EMBEDDING_INPUTS + 1)), "input", "at most 2048"),
        (EMBEDDINGS, json.dumps({"input": "x"}).encode(), "model", "required"),
        (EMBEDDINGS, json.dumps({"model": 4, "input": "x"}).encode(), "model", "string"),
    ],
)
def test_bad_bodies_are_openai_400s_naming_the_field(
    path: str, body: bytes, param: str, words: str
) -> None:
    error = error_of(path, body)
    assert error.status == 400 and error.param == param
    assert words in error.message
    answer = error.body()["error"]
    assert isinstance(answer, dict) and answer["type"] == "invalid_request_error"


def test_every_violation_is_in_the_message() -> None:
    error = error_of(CHAT, json.dumps({"model": 1, "stream": 2, "messages": 3}).encode())
    for field in ("'model'", "'stream'", "'messages'"):
        assert field in error.message


def test_unparseable_deep_or_non_object_bodies_are_400s() -> None:
    assert error_of(CHAT, b"{not json").status == 400
    assert error_of(CHAT, b"[1, 2]").status == 400
    assert error_of(CHAT, b'{"x": NaN}').status == 400
    deep = b'{"model": "m", "messages": [{}], "x": ' + b"[" * 100 + b"]" * 100 + b"}"
    error = error_of(CHAT, deep)
    assert error.status == 400 and "nested" in error.message
    assert error_of(CHAT, b"[" * 100_000).status == 400


def test_a_model_that_cannot_exist_here_is_404() -> None:
    error = error_of(CHAT, json.dumps({"model": "gpt/4o", "messages": [{}]}).encode())
    assert error.status == 404 and error.code == "model_not_found"


def test_a_model_without_its_prefix_or_none_is_nvcfs_400() -> None:
    for body, message in [
        ({"model": "gpt-4o", "messages": [{}]}, "model prefix is required"),
        ({"messages": [{}]}, "model is required"),
        ({"model": "", "messages": [{}]}, "model is required"),
    ]:
        error = error_of(CHAT, json.dumps(body).encode())
        assert (error.status, error.message, error.param) == (400, message, "model")
        assert error.body()["message"] == message


def test_platform_errors_keep_status_and_retry_after_in_openai_shape() -> None:
    limited = from_domain(TooManyRequests(detail="over the limit", headers={"Retry-After": "3"}))
    assert limited.status == 429 and limited.headers == {"Retry-After": "3"}
    assert limited.body() == {
        "error": {
            "message": "over the limit",
            "type": "rate_limit_exceeded",
            "param": None,
            "code": "rate_limit_exceeded",
        },
        "message": "over the limit",
    }
    bad = from_domain(
        ValidationFailed.of([FieldError("a", "is wrong"), FieldError("b", "is also wrong")])
    )
    assert bad.status == 400 and bad.param == "a" and "b: is also wrong" in bad.message
    response = OpenAIError(401, "no key").response("req-1")
    assert response.status_code == 401 and response.headers["x-request-id"] == "req-1"
    assert json.loads(bytes(response.body))["error"]["code"] == "invalid_api_key"
    long = OpenAIError(500, "x" * 10_000).body()["error"]
    assert isinstance(long, dict) and len(long["message"]) == 4096
