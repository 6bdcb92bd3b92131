"""Shapes of the invocation routes: the wrapped `exec` form and the queue routes (camelCase),
and the poll time a request asks for (`NVCF-POLL-SECONDS`)."""

from __future__ import annotations

import json
import uuid
from typing import Any

from pydantic import ConfigDict, Field

from service.core.errors import BadRequest, FieldError, ValidationFailed
from service.core.http import NotJson, RefusedJson, load_json
from service.core.numbers import natural
from service.core.schemas import CamelModel

POLL_HEADER = "nvcf-poll-seconds"
DEFAULT_POLL_SECONDS = 60
MAX_POLL_SECONDS = 3600
MIN_POLL_SECONDS = 1


class ExecRequestHeader(CamelModel):
    poll_duration_seconds: int | None = Field(
        default=None, description=f"Seconds to wait for the answer (1–{MAX_POLL_SECONDS})."
    )
    input_asset_references: list[str] | None = None


class ExecRequest(CamelModel):
    """`POST /exec/...`: the body for the worker wrapped with request options."""

    model_config = ConfigDict(extra="allow")

    request_header: ExecRequestHeader | None = None
    request_body: Any = Field(description="Sent to the worker as JSON.")


class ExecResponse(CamelModel):
    """The wrapped answer: the worker's JSON in `response` once fulfilled."""

    req_id: uuid.UUID
    status: str = Field(examples=["fulfilled", "pending-evaluation", "in-progress", "errored"])
    percent_complete: int | None = None
    error_code: int | None = None
    response: Any = None
    response_reference: str | None = Field(
        default=None,
        description="A large result: the signed URL of its zip (`<reqId>.response` and the "
        "files the worker wrote), downloadable with no key until it expires.",
    )


class QueueOut(CamelModel):
    function_version_id: uuid.UUID
    function_name: str
    function_status: str
    queue_depth: int


class QueueList(CamelModel):
    function_id: uuid.UUID
    queues: list[QueueOut]


class QueuePosition(CamelModel):
    function_id: uuid.UUID
    function_version_id: uuid.UUID
    position_in_queue: int


def parse_exec(raw: bytes) -> tuple[bytes, int | None, list[str]]:
    """The worker body (the JSON of `requestBody`), `pollDurationSeconds` and
    `inputAssetReferences` of an exec body; 400 naming every problem."""
    try:
        data = load_json(raw) if raw else None
    except NotJson as exc:
        raise BadRequest(detail=f"the request body is not JSON: {exc}") from None
    except RefusedJson as exc:
        raise ValidationFailed.of(exc.errors) from None
    if not isinstance(data, dict):
        raise ValidationFailed.of(
            [FieldError("body", "must be an object with requestBody (and requestHeader)")]
        )
    errors: list[FieldError] = []
    if "requestBody" not in data:
        errors.append(FieldError("requestBody", "is required"))
    header = data.get("requestHeader")
    poll: int | None = None
    references: list[str] = []
    if header is not None and not isinstance(header, dict):
        errors.append(FieldError("requestHeader", "must be an object"))
    elif isinstance(header, dict):
        value = header.get("pollDurationSeconds")
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int):
                errors.append(
                    FieldError("requestHeader.pollDurationSeconds", "must be a whole number")
                )
            elif value > MAX_POLL_SECONDS:
                errors.append(
                    FieldError(
                        "requestHeader.pollDurationSeconds", f"must be <= {MAX_POLL_SECONDS}"
                    )
                )
            else:
                poll = max(MIN_POLL_SECONDS, value)
        refs = header.get("inputAssetReferences")
        if refs is not None:
            if not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
                errors.append(
                    FieldError("requestHeader.inputAssetReferences", "must be a list of asset ids")
                )
            else:
                references = refs
    if errors:
        raise ValidationFailed.of(errors)
    body = json.dumps(data["requestBody"], separators=(",", ":")).encode()
    return body, poll, references


def poll_seconds(raw: str | None) -> int:
    """`NVCF-POLL-SECONDS`: default 60, at least 1 (as NVCF rounds up), at most 3600."""
    if raw is None or not raw.strip():
        return DEFAULT_POLL_SECONDS
    text = raw.strip()
    value = natural(text)
    if value is None:
        raise BadRequest(
            detail=f"NVCF-POLL-SECONDS must be a whole number of seconds, got {text[:40]!r}"
        )
    if value > MAX_POLL_SECONDS:
        raise BadRequest(detail=f"NVCF-POLL-SECONDS must be <= {MAX_POLL_SECONDS}, got {value}")
    return max(MIN_POLL_SECONDS, value)
