"""Small request helpers shared by routers: JSON bodies, UUID path parameters."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any
from urllib.parse import parse_qsl

from fastapi import Request
from pydantic import BaseModel

from service.core.errors import FieldError, UnsupportedMediaType, ValidationFailed

#: deepest nesting of arrays and objects a JSON body (or JWT) may have; no request of the API
#: needs more than a few levels, and deep nesting makes recursive code fail
MAX_JSON_DEPTH = 64
#: characters no stored text may hold: NUL (PostgreSQL refuses it in text) and lone UTF-16
#: surrogates (no UTF-8 encoding: stored, they break every later response that includes them)
_BAD_CHAR = re.compile("[\x00\ud800-\udfff]")


class _Unreadable(ValueError):
    """A JSON value this service refuses to read (a non-finite number)."""


def _no_constant(name: str) -> Any:
    raise _Unreadable(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise _Unreadable("a number is too large")
    return value


def parse_json_text(raw: bytes | str) -> Any:
    """Parse JSON strictly: no NaN/Infinity, finite floats. Raises ValueError (also for an
    integer over Python's 4,300-digit limit) or RecursionError."""
    return json.loads(raw, parse_constant=_no_constant, parse_float=_finite_float)


def bad_char(text: str) -> str | None:
    """What `text` holds that no stored text may hold, or None; never quotes the text."""
    m = _BAD_CHAR.search(text)
    if m is None:
        return None
    if m.group() == "\x00":
        return "a NUL character (\\u0000)"
    return "a lone UTF-16 surrogate (such as \\ud800), which is not valid Unicode"


def text_error(text: str) -> str | None:
    """Why `text` cannot be accepted as a value, or None."""
    what = bad_char(text)
    return None if what is None else f"must not contain {what}"


def _join(path: str, key: str | int, root: str) -> str:
    if isinstance(key, int):
        return f"{path or root}[{key}]"
    if _BAD_CHAR.search(key):
        key = key.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")
    return f"{path}.{key}" if path else key


def json_errors(value: Any, root: str = "body", prefix: str = "") -> list[FieldError]:
    """Every string (keys included) with a NUL or a lone surrogate, and nesting deeper than
    MAX_JSON_DEPTH, as field errors named by JSON path (`containerEnvironment[0].value`).

    Paths start at `prefix` (`jwt` gives `jwt.sub`); the document itself is `root`. Iterative,
    so any depth is safe to walk."""
    errors: list[FieldError] = []
    stack: list[tuple[Any, str, int]] = [(value, prefix, 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, str):
            why = text_error(item)
            if why is not None:
                errors.append(FieldError(path or root, why))
            continue
        if not isinstance(item, dict | list):
            continue
        if depth >= MAX_JSON_DEPTH:
            errors.append(
                FieldError(path or root, f"is nested more than {MAX_JSON_DEPTH} levels deep")
            )
            continue
        children: list[tuple[Any, str, int]] = []
        if isinstance(item, dict):
            for k, v in item.items():
                what = bad_char(k)
                if what is not None:
                    errors.append(FieldError(path or root, f"has a key containing {what}"))
                children.append((v, _join(path, k, root), depth + 1))
        else:
            children = [(v, _join(path, i, root), depth + 1) for i, v in enumerate(item)]
        stack.extend(reversed(children))
    return errors


def query_errors(query_string: bytes) -> list[FieldError]:
    """Query parameters holding a NUL or a lone surrogate, named by parameter, decoded as
    Starlette decodes them."""
    if not query_string:
        return []
    errors: list[FieldError] = []
    for name, value in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
        what = bad_char(name)
        if what is not None:
            errors.append(FieldError("query", f"has a parameter name containing {what}"))
            continue
        why = text_error(value)
        if why is not None:
            errors.append(FieldError(name, why))
    return errors


class NotJson(ValueError):
    """Text that is not JSON at all (its syntax, or its encoding)."""


class RefusedJson(ValueError):
    """JSON this service refuses to read: a non-finite number, an integer past Python's
    digit limit, nesting deeper than MAX_JSON_DEPTH, text with a NUL or a lone surrogate;
    every problem as a field error."""

    def __init__(self, errors: list[FieldError]) -> None:
        super().__init__("; ".join(f"{e.field} {e.message}" for e in errors))
        self.errors = errors


def load_json(raw: bytes | str, root: str = "body") -> Any:
    """The one way JSON is read, whoever sent it (a caller's body, a worker's answer):
    `NotJson` when it does not parse, `RefusedJson` when it does but holds what no answer
    can carry on (nothing read past it can fail to be encoded again)."""
    try:
        value = parse_json_text(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise NotJson(str(exc)) from None
    except _Unreadable as exc:
        raise RefusedJson([FieldError(root, f"is not valid JSON: {exc}")]) from None
    except ValueError:  # Python's limit on the digits of an integer
        raise RefusedJson(
            [FieldError(root, "is not valid JSON: an integer has more than 4300 digits")]
        ) from None
    except RecursionError:
        raise RefusedJson(
            [FieldError(root, f"is nested more than {MAX_JSON_DEPTH} levels deep")]
        ) from None
    errors = json_errors(value, root=root)
    if errors:
        raise RefusedJson(errors)
    return value


async def read_json(request: Request) -> Any:
    """The request body as JSON: 415 unless the content type is JSON, 400 when it does not
    parse, nests too deeply, or holds text no field may hold (NUL, lone surrogates) — once
    here, for every body, before any route reads it."""
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
        return load_json(raw)
    except NotJson as exc:
        raise ValidationFailed.of([FieldError("body", f"is not valid JSON: {exc}")]) from None
    except RefusedJson as exc:
        raise ValidationFailed.of(exc.errors) from None


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


def inline_body_doc(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI `requestBody` with `model`'s schema inlined (no component references)."""
    schema = model.model_json_schema(by_alias=True)
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return resolve(defs[ref.removeprefix("#/$defs/")])
            return {k: resolve(v) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node

    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": resolve(schema)}},
        }
    }
