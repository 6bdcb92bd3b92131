"""Small request helpers shared by routers: JSON bodies, UUID path parameters."""

from __future__ import annotations

import json
import uuid
from typing import Any

from fastapi import Request

from service.core.errors import FieldError, UnsupportedMediaType, ValidationFailed


async def read_json(request: Request) -> Any:
    """The request body as JSON: 415 unless the content type is JSON, 400 when it does not parse."""
    ctype = request.headers.get("content-type", "")
    mime = ctype.split(";", 1)[0].strip().lower()
    if mime != "application/json" and not (
        mime.startswith("application/") and mime.endswith("+json")
    ):
        raise UnsupportedMediaType(
            detail=f"request body must be application/json, got '{ctype or 'no content type'}'"
        )
    raw = await request.body()
    if not raw.strip():
        raise ValidationFailed.of([FieldError("body", "a JSON body is required")])
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValidationFailed.of([FieldError("body", f"is not valid JSON: {exc}")]) from None


def parse_uuid(value: str, name: str) -> uuid.UUID:
    return parse_uuids((value, name))[0]


def json_body_doc(schema_ref: str) -> dict[str, Any]:
    """OpenAPI `requestBody` for routes that validate their JSON body themselves."""
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{schema_ref}"}}
            },
        }
    }


def json_kind(value: Any) -> str:
    """How a JSON value reads in an error message: 'a string', 'a list', 'null'…"""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def require_json_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ValidationFailed.of(
            [FieldError("body", f"must be a JSON object, got {json_kind(body)}")]
        )
    return body


def parse_uuids(*pairs: tuple[str, str]) -> list[uuid.UUID]:
    """Several path ids at once, as `(value, name)` pairs; every malformed one is reported."""
    out: list[uuid.UUID] = []
    errors: list[FieldError] = []
    for value, name in pairs:
        try:
            out.append(uuid.UUID(value))
        except ValueError:
            errors.append(FieldError(name, f"'{value}' is not a UUID"))
    if errors:
        raise ValidationFailed.of(errors)
    return out
