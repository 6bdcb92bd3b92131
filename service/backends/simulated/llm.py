"""A tiny deterministic "model" speaking OpenAI's API: what the simulated worker answers on
`/v1/chat/completions`, `/v1/responses` and `/v1/embeddings`, so that an OpenAI client pointed
at `make run` sees an LLM function answer (and stream) without a GPU.

The reply is derived from the prompt (the last user message, or the input): "Echo: " and the
prompt's words, one token per word; input tokens are the prompt's words too. Embeddings are
DIMENSIONS numbers from the SHA-256 of each input. Streams are OpenAI's chunk shapes — chat
`chat.completion.chunk`s then `[DONE]` (a `usage` chunk first when `stream_options.
include_usage`), Responses' typed events ending with `response.completed` carrying the whole
response and its usage.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from typing import Any

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
EMBEDDINGS = "/v1/embeddings"
PATHS = (CHAT, RESPONSES, EMBEDDINGS)
DIMENSIONS = 16
#: the most words a reply has (a long prompt is cut)
MAX_REPLY_WORDS = 256


def _text(value: Any) -> str:
    """The text in a message content or an input: strings, or parts' `text`."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return " ".join(_text(v) for v in value)
    if isinstance(value, dict):
        return _text(value.get("text") or value.get("content") or "")
    return ""


def prompt_of(path: str, body: dict[str, Any]) -> str:
    if path == CHAT:
        messages = [m for m in body.get("messages") or () if isinstance(m, dict)]
        users = [m for m in messages if m.get("role") == "user"] or messages
        return _text(users[-1].get("content")) if users else ""
    return _text(body.get("input"))


def reply_words(prompt: str) -> list[str]:
    words = prompt.split()[:MAX_REPLY_WORDS]
    return ["Echo:", *words]


def _tokens(words: list[str]) -> list[str]:
    return [w if i == 0 else " " + w for i, w in enumerate(words)]


def _ids(body: dict[str, Any], prefix: str) -> str:
    digest = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()
    return f"{prefix}-{digest[:24]}"


def chat_completion(body: dict[str, Any]) -> dict[str, Any]:
    prompt = prompt_of(CHAT, body)
    words = reply_words(prompt)
    return {
        "id": _ids(body, "chatcmpl"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": str(body.get("model", "")),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": " ".join(words)},
                "finish_reason": "stop",
            }
        ],
        "usage": _usage(len(prompt.split()), len(words)),
    }


def _usage(given: int, produced: int) -> dict[str, int]:
    return {"prompt_tokens": given, "completion_tokens": produced, "total_tokens": given + produced}


def chat_chunks(body: dict[str, Any]) -> Iterator[bytes]:
    """The SSE events of a streamed chat completion, one per token."""
    prompt = prompt_of(CHAT, body)
    words = reply_words(prompt)
    base = {
        "id": _ids(body, "chatcmpl"),
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": str(body.get("model", "")),
    }
    first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
    yield _data({**base, "choices": [first]})
    for token in _tokens(words):
        choice = {"index": 0, "delta": {"content": token}, "finish_reason": None}
        yield _data({**base, "choices": [choice]})
    yield _data({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        yield _data({**base, "choices": [], "usage": _usage(len(prompt.split()), len(words))})
    yield b"data: [DONE]\n\n"


def _data(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def response_object(body: dict[str, Any]) -> dict[str, Any]:
    prompt = prompt_of(RESPONSES, body)
    words = reply_words(prompt)
    rid = _ids(body, "resp")
    text = " ".join(words)
    given, produced = len(prompt.split()), len(words)
    return {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "model": str(body.get("model", "")),
        "output": [
            {
                "type": "message",
                "id": f"msg-{rid}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "usage": {
            "input_tokens": given,
            "output_tokens": produced,
            "total_tokens": given + produced,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }


def response_events(body: dict[str, Any]) -> Iterator[bytes]:
    """The SSE events of a streamed Responses answer."""
    done = response_object(body)
    started = {**done, "status": "in_progress", "output": [], "usage": None}
    sequence = 0

    def event(kind: str, **fields: Any) -> bytes:
        nonlocal sequence
        sequence += 1
        payload = {"type": kind, "sequence_number": sequence, **fields}
        return f"event: {kind}\ndata: {json.dumps(payload)}\n\n".encode()

    yield event("response.created", response=started)
    text = done["output"][0]["content"][0]["text"]
    item = done["output"][0]["id"]
    for token in _tokens(text.split()):
        yield event(
            "response.output_text.delta", item_id=item, output_index=0, content_index=0, delta=token
        )
    yield event("response.completed", response=done)


def embedding(text: str) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    return [round(b / 255 * 2 - 1, 6) for b in digest[:DIMENSIONS]]


def embeddings(body: dict[str, Any]) -> dict[str, Any]:
    raw = body.get("input")
    inputs = [raw] if isinstance(raw, str) else [str(v) for v in raw or ()]
    given = sum(len(t.split()) for t in inputs)
    return {
        "object": "list",
        "model": str(body.get("model", "")),
        "data": [
            {"object": "embedding", "index": i, "embedding": embedding(t)}
            for i, t in enumerate(inputs)
        ],
        "usage": {"prompt_tokens": given, "total_tokens": given},
    }


def answer(path: str, body: dict[str, Any]) -> tuple[dict[str, Any] | None, Iterator[bytes] | None]:
    """(JSON answer, or SSE events) of a request to one of PATHS."""
    stream = body.get("stream") is True
    if path == CHAT:
        return (None, chat_chunks(body)) if stream else (chat_completion(body), None)
    if path == RESPONSES:
        return (None, response_events(body)) if stream else (response_object(body), None)
    return embeddings(body), None


def error_body(message: str) -> dict[str, Any]:
    return {
        "error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}
    }
