"""What the OpenAPI document says of the HTTP entry's routes (http_routes.py), which no FastAPI
route declares: one declaration per operation, and the path items made of them (the error
responses are added by core/openapi.py: `truthful`, as for every route)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from service.invocation.http import API_PREFIX
from service.invocation.http_routes import OPERATIONS
from service.invocation.schemas import ExecRequest, ExecResponse, QueueList, QueuePosition


def _problem(text: str) -> dict[str, Any]:
    return {
        "description": text,
        "content": {
            "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
        },
    }


_WORKER_BODY: dict[str, Any] = {
    "required": False,
    "description": "Sent unchanged (with its content type) to the function's inferenceUrl.",
    "content": {"*/*": {"schema": {}}},
}
_EXEC_BODY: dict[str, Any] = {
    "required": True,
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ExecRequest"}}},
}
_INVOKE: dict[str, dict[str, Any]] = {
    "200": {"description": "The worker's answer (status, headers and body as it sent them)"},
    "202": {"description": "Not answered within NVCF-POLL-SECONDS: poll the status route"},
    "502": _problem("The worker could not be reached or failed"),
    "504": _problem("The worker did not answer in time"),
}
_STATUS: dict[str, dict[str, Any]] = {
    "200": {"description": "The worker's answer"},
    "202": {"description": "Still pending"},
    "502": _problem("The worker could not be reached or failed"),
    "504": _problem("The worker did not answer in time"),
}
_READ: dict[str, dict[str, Any]] = {"200": {"description": "Successful Response"}}
_POLL_HEADER: dict[str, Any] = {
    "in": "header",
    "name": "NVCF-POLL-SECONDS",
    "required": False,
    "description": "Seconds to wait for the worker's answer before 202 (1–3600, default 60)",
    "schema": {"type": "integer", "minimum": 1, "maximum": 3600},
}


@dataclass(frozen=True)
class Declared:
    """What the document says of one operation. The 200 answer's content is the model's, or
    the worker's own (`worker_answer`), or left unsaid."""

    summary: str
    responses: dict[str, dict[str, Any]]
    request_body: dict[str, Any] | None = None
    response_model: type[BaseModel] | None = None
    worker_answer: bool = False
    #: the operation reads NVCF-POLL-SECONDS
    polls: bool = True


DECLARED: dict[str, Declared] = {
    "pexec_function": Declared(
        "Invoke a function (its invocable version): the body goes to its inferenceUrl",
        _INVOKE,
        _WORKER_BODY,
        worker_answer=True,
    ),
    "pexec_version": Declared(
        "Invoke one version of a function", _INVOKE, _WORKER_BODY, worker_answer=True
    ),
    "pexec_status": Declared(
        "The answer of a request that got 202 (waits up to NVCF-POLL-SECONDS)",
        _STATUS,
        worker_answer=True,
    ),
    "exec_function": Declared(
        "Invoke a function, wrapped: {requestHeader, requestBody} → {reqId, status, response}",
        _INVOKE,
        _EXEC_BODY,
        ExecResponse,
    ),
    "exec_version": Declared(
        "Invoke one version of a function, wrapped", _INVOKE, _EXEC_BODY, ExecResponse
    ),
    "exec_status": Declared(
        "The wrapped answer of a request that got 202", _STATUS, response_model=ExecResponse
    ),
    "queues_of_function": Declared(
        "Requests waiting for an instance, per version of a function",
        _READ,
        response_model=QueueList,
        polls=False,
    ),
    "queues_of_version": Declared(
        "Requests waiting for an instance of one version",
        _READ,
        response_model=QueueList,
        polls=False,
    ),
    "queue_position": Declared(
        "The position of a waiting request in its queue (1 = next)",
        _READ,
        response_model=QueuePosition,
        polls=False,
    ),
}

#: models the declarations refer to (added to the document's components)
MODELS: tuple[type[BaseModel], ...] = (ExecRequest, ExecResponse, QueueList, QueuePosition)


def openapi_paths() -> dict[str, dict[str, Any]]:
    """The OpenAPI path items of the entry's routes."""
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        declared = DECLARED[op.operation_id]
        names = [s[1:-1] for s in op.path.split("/") if s.startswith("{")]
        uuid = {"type": "string", "format": "uuid"}
        parameters = [
            {"in": "path", "name": n, "required": True, "schema": dict(uuid)} for n in names
        ]
        if declared.polls:
            parameters.append(copy.deepcopy(_POLL_HEADER))
        responses = copy.deepcopy(declared.responses)
        if declared.response_model is not None:
            ref = {"$ref": f"#/components/schemas/{declared.response_model.__name__}"}
            responses["200"]["content"] = {"application/json": {"schema": ref}}
        elif declared.worker_answer:
            responses["200"]["content"] = {"*/*": {"schema": {}}}
        operation: dict[str, Any] = {
            "tags": ["invocation"],
            "summary": declared.summary,
            "operationId": op.operation_id,
            "parameters": parameters,
            "responses": responses,
        }
        if declared.request_body is not None:
            operation["requestBody"] = declared.request_body
        paths.setdefault(API_PREFIX + op.path, {})[op.method.lower()] = operation
    return paths
