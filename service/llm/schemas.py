"""The request bodies of the LLM gateway, as far as routing needs them: `model` and `stream`
everywhere, what sessions and token estimates read (`prompt_cache_key`, `conversation`,
`messages`, `input`, `max_tokens`…). Every other field is passed to the worker unchanged;
only `model` is rewritten (to the model's name). The body is bounded by the invocation body
limit (NVCF_INVOKE_MAX_BODY_BYTES) and its nesting by MAX_JSON_DEPTH.

A body that breaks a rule is OpenAI's 400 with every violation in the message and the first
one's field as `param`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt
from pydantic import ValidationError as PydanticValidationError

from service.core.errors import FieldError
from service.core.http import NotJson, RefusedJson, json_kind, load_json
from service.core.validation import Check, Expect, field_errors
from service.functions.llm_config import CHAT_COMPLETIONS, EMBEDDINGS, RESPONSES
from service.llm.errors import OpenAIError, invalid
from service.llm.routing import ModelRef, parse_model, prompt_cache_key_error

#: NVCF's bound of an embeddings request's inputs
MAX_EMBEDDING_INPUTS = 2048
MAX_MODEL = 1024
#: the largest max_tokens an estimate takes at its word (beyond it, the limit refuses anyway)
MAX_TOKENS = 10**9


class OpenAIRequest(BaseModel):
    """Fields are OpenAI's snake_case names; unknown fields pass through unchanged."""

    model_config = ConfigDict(extra="allow")
    path: ClassVar[str] = ""

    model: Annotated[str, Expect((str,), "must be a string such as '<function-id>/<model>'")] = (
        Field(max_length=MAX_MODEL)
    )
    stream: StrictBool | None = None
    prompt_cache_key: (
        Annotated[str, Expect((str,), "must be a string"), Check(prompt_cache_key_error)] | None
    ) = None


Tokens = Annotated[StrictInt, Field(ge=0, le=MAX_TOKENS)]


def _messages(value: Any) -> str | None:
    if not isinstance(value, list) or not value:
        return f"must be a non-empty array of messages, got {json_kind(value)}"
    if not all(isinstance(m, dict) for m in value):
        return "must be an array of message objects"
    return None


class ChatCompletionsRequest(OpenAIRequest):
    path: ClassVar[str] = CHAT_COMPLETIONS

    messages: Annotated[list[Any], Check(_messages, before=True)]
    max_tokens: Tokens | None = None
    max_completion_tokens: Tokens | None = None


def _conversation(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return None
    if isinstance(value, dict) and isinstance(value.get("id", ""), str):
        return None
    return "must be a conversation id or an object with a string id"


class ResponsesRequest(OpenAIRequest):
    path: ClassVar[str] = RESPONSES

    input: (
        Annotated[
            str | list[Any], Expect((str, list), "must be a string or an array of input items")
        ]
        | None
    ) = None
    conversation: Annotated[Any, Check(_conversation, before=True)] = None
    max_output_tokens: Tokens | None = None


def _embedding_input(value: Any) -> str | None:
    if isinstance(value, str):
        return "must not be empty" if not value else None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return f"must be a string or an array of strings, got {json_kind(value)}"
    if not value:
        return "must not be empty"
    if len(value) > MAX_EMBEDDING_INPUTS:
        return f"must have at most {MAX_EMBEDDING_INPUTS} entries, got {len(value)}"
    if any(not v for v in value):
        return "must not contain empty strings"
    return None


class EmbeddingsRequest(OpenAIRequest):
    path: ClassVar[str] = EMBEDDINGS

    input: Annotated[Any, Check(_embedding_input, before=True)]


REQUESTS: dict[str, type[OpenAIRequest]] = {
    CHAT_COMPLETIONS: ChatCompletionsRequest,
    RESPONSES: ResponsesRequest,
    EMBEDDINGS: EmbeddingsRequest,
}


def _openai_error(errors: list[FieldError]) -> OpenAIError:
    listed = "; ".join(f"'{e.field}' {e.message}" for e in errors)
    return invalid(f"Invalid request body: {listed}.", param=errors[0].field)


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """A checked request: the routed model, whether the caller streams, the body as parsed
    (for sessions and estimates) and the request itself."""

    path: str
    ref: ModelRef
    stream: bool
    body: Mapping[str, Any]
    request: OpenAIRequest

    def worker_body(self, *, stream: bool | None = None) -> bytes:
        """The body the worker receives: the caller's, `model` rewritten to the model's
        name (and `stream` set when given), nothing else changed."""
        out = dict(self.body)
        out["model"] = self.ref.name
        if stream is not None:
            out["stream"] = stream
        return json.dumps(out, ensure_ascii=False, separators=(",", ":")).encode()


def parse_request(path: str, raw: bytes) -> ParsedRequest:
    """The body of a POST to `path` (one of REQUESTS) checked, or OpenAI's 400 listing every
    violation (404 for a `model` that cannot name a model here)."""
    try:
        body = load_json(raw)
    except NotJson:
        raise invalid(
            "We could not parse the JSON body of your request. The body must be a JSON object "
            "(Content-Type: application/json)."
        ) from None
    except RefusedJson as exc:
        raise _openai_error(exc.errors) from None
    if not isinstance(body, dict):
        raise invalid(f"The request body must be a JSON object, got {json_kind(body)}.")
    model = body.get("model")
    if model is None or isinstance(model, str):
        parse_model(model or "")  # NVCF checks `model` first, with its own words
    kind = REQUESTS[path]
    try:
        request = kind.model_validate(body)
    except PydanticValidationError as exc:
        raise _openai_error(field_errors(exc)) from None
    return ParsedRequest(
        path=path,
        ref=parse_model(request.model),
        stream=bool(request.stream),
        body=body,
        request=request,
    )
