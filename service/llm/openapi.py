"""The LLM gateway's routes in the OpenAPI document, generated from the gateway's own
declarations: its routes and methods (`routing.ROUTES`), under the prefix clients that cannot
set a Host use (`routing.PREFIX`), and the request bodies it checks (`schemas.REQUESTS`).
Its errors are declared in OpenAI's shape (`OpenAIError`), as errors.py answers them; a few
answered before the gateway sees the request (the body deadline, the connection cap, an
unexpected failure) stay problem+json and are declared as both.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from service.functions.llm_config import CHAT_COMPLETIONS, EMBEDDINGS, RESPONSES
from service.llm.routing import MODELS, PREFIX, ROUTES, SESSION_HEADER
from service.llm.schemas import REQUESTS

_ERROR_REF = {"$ref": "#/components/schemas/OpenAIError"}
_PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}

#: OpenAI's error object (errors.py `OpenAIError.body`)
OPENAI_ERROR: dict[str, Any] = {
    "type": "object",
    "description": "An error in OpenAI's shape (the LLM gateway's routes only), as OpenAI's "
    "clients parse it, with NVCF's top-level `message` beside it (the same text).",
    "required": ["error", "message"],
    "properties": {
        "message": {"type": "string", "description": "`error.message`, where NVCF puts it"},
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string", "examples": ["invalid_request_error"]},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"], "examples": ["model_not_found"]},
            },
        },
    },
}
#: OpenAI's model list (service.py `model_list`)
MODEL_LIST: dict[str, Any] = {
    "type": "object",
    "required": ["object", "data"],
    "properties": {
        "object": {"const": "list"},
        "data": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "object", "created", "owned_by"],
                "properties": {
                    "id": {
                        "type": "string",
                        "description": "`<function-id>/<model-name>`, the `model` a request gives",
                    },
                    "object": {"const": "model"},
                    "created": {"type": "integer"},
                    "owned_by": {"type": "string", "description": "the function's account"},
                },
            },
        },
    },
}
#: component schemas the operations refer to
SCHEMAS: dict[str, dict[str, Any]] = {"OpenAIError": OPENAI_ERROR, "ModelList": MODEL_LIST}
#: request models the operations refer to (added to the components like the API's models)
MODELS_DOCUMENTED: tuple[type[BaseModel], ...] = tuple(REQUESTS.values())

_SUMMARIES = {
    CHAT_COMPLETIONS: "OpenAI chat completions of an LLM function's model",
    RESPONSES: "OpenAI responses of an LLM function's model",
    EMBEDDINGS: "OpenAI embeddings of an LLM function's model",
    MODELS: "The models of the LLM functions the caller may invoke",
}
_ERRORS = {
    "400": "The body is not a valid request: every violation in the message, the first "
    "one's field as `param`; `model` missing or without its function-id prefix; a caller's "
    "X-Priority; with NVCF_LLM_MODEL_ALLOWLIST, a path the model's uris do not list",
    "401": "Missing, unknown, expired or invalid credential",
    "403": "The credential lacks the scope invoke_function, or is limited to other functions",
    "404": "No such model for the caller (unknown or unshared function, not an LLM function; "
    "with NVCF_LLM_MODEL_ALLOWLIST, a model the function does not declare)",
    "413": "The request body is too large",
    "429": "The function's rate limit, the model's tokenRateLimit or a full queue (see "
    "Retry-After)",
    "502": "The model server could not be reached or failed",
    "504": "The model server did not answer in time",
}
_BOTH = {
    "500": "An unexpected error (quote x-request-id)",
    "503": "No instance took the request in time, no version can serve now, or the server is "
    "not available (connection cap, database: problem+json)",
}


def _error(text: str, *, problem: bool = False) -> dict[str, Any]:
    content: dict[str, Any] = {"application/json": {"schema": _ERROR_REF}}
    if problem:
        content["application/problem+json"] = {"schema": _PROBLEM_REF}
    return {"description": text, "content": content}


_SESSION_ANSWER = {
    SESSION_HEADER: {
        "description": "The request's session, which keeps its turns on one instance",
        "schema": {"type": "string"},
    }
}
_SESSION_PARAMETER = {
    "in": "header",
    "name": SESSION_HEADER,
    "required": False,
    "description": "The session of a multi-turn conversation (after `prompt_cache_key` in "
    "precedence), at most 256 bytes",
    "schema": {"type": "string", "maxLength": 256},
}


def _ok(path: str) -> dict[str, Any]:
    if path == MODELS:
        ref = {"$ref": "#/components/schemas/ModelList"}
        return {
            "description": "OpenAI's model list",
            "content": {"application/json": {"schema": ref}},
        }
    text = "The model server's answer"
    content: dict[str, Any] = {"application/json": {"schema": {"type": "object"}}}
    if path == EMBEDDINGS:
        return {"description": text, "content": content}
    content["text/event-stream"] = {"schema": {"type": "string"}}
    return {
        "description": text + "; with `stream: true`, its server-sent events as they arrive "
        "(`[DONE]` last)",
        "headers": _SESSION_ANSWER,
        "content": content,
    }


def openapi_paths() -> dict[str, dict[str, Any]]:
    """The OpenAPI path items of the gateway's routes (under `PREFIX`), every status each
    can answer declared (core/openapi.py `truthful` leaves them as they are)."""
    paths: dict[str, dict[str, Any]] = {}
    for path, method in ROUTES.items():
        model = REQUESTS.get(path)
        statuses = ["401", "403"]
        if model is not None:
            statuses += ["400", "404", "413", "429", "502", "504"]
        responses: dict[str, Any] = {"200": _ok(path)}
        for status in sorted(statuses):
            responses[status] = _error(_ERRORS[status])
        for status, text in _BOTH.items():
            responses[status] = _error(text, problem=True)
        operation: dict[str, Any] = {
            "tags": ["llm"],
            "summary": _SUMMARIES[path],
            "description": f"Also `{method} {path}` on the LLM host (`Host: llm.` followed by "
            "NVCF_INVOKE_HOST_SUFFIX); errors in OpenAI's shape (docs/llm.md).",
            "operationId": "llm_" + path.removeprefix("/v1/").replace("/", "_"),
            "responses": responses,
        }
        if model is not None:
            responses["408"] = {
                "description": "The request body did not arrive in time",
                "content": {"application/problem+json": {"schema": _PROBLEM_REF}},
            }
            ref = {"$ref": f"#/components/schemas/{model.__name__}"}
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": ref}},
            }
            if path != EMBEDDINGS:  # embeddings have no session
                operation["parameters"] = [_SESSION_PARAMETER]
        paths[PREFIX + path] = {method.lower(): operation}
    return paths
