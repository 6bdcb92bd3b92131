"""RFC 7807 problem+json rendering: the single place errors become responses."""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from sqlalchemy.exc import DBAPIError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse
from starlette.routing import Match

from service.core.db import is_contention
from service.core.errors import (
    MAX_LISTED_ERRORS,
    BadRequest,
    Conflict,
    DomainError,
    FieldError,
    Forbidden,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    ServiceUnavailable,
    TooManyRequests,
    Unauthorized,
    UnsupportedMediaType,
    ValidationFailed,
)

PROBLEM = "application/problem+json"
log = logging.getLogger("nvcf.errors")

#: longest `detail`, and longest `field`/`message` of one listed violation, in characters:
#: messages may quote the offending value, which can be as large as the request
MAX_DETAIL_CHARS = 4096
MAX_FIELD_CHARS = 256
MAX_MESSAGE_CHARS = 1024
_SURROGATE = re.compile("[\ud800-\udfff]")

#: status -> (type slug, title) for errors raised by the framework, not by this service
_TITLES = {
    cls.status: (cls.type_slug, cls.title)
    for cls in (
        BadRequest,
        Unauthorized,
        Forbidden,
        NotFound,
        MethodNotAllowed,
        Conflict,
        PayloadTooLarge,
        UnsupportedMediaType,
        TooManyRequests,
        DomainError,
    )
}


def safe_text(text: str, limit: int) -> str:
    """`text` as it can be sent: at most `limit` characters, any lone surrogate escaped (it
    cannot be encoded as UTF-8, and an error must never fail to render)."""
    if _SURROGATE.search(text):
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


def _body(
    slug: str, title: str, status: int, detail: str, instance: str, request_id: str
) -> dict[str, Any]:
    return {
        "type": f"urn:nvcf:problem-details:{slug}",
        "title": title,
        "status": status,
        "detail": safe_text(detail, MAX_DETAIL_CHARS),
        "instance": safe_text(instance, MAX_FIELD_CHARS * 4),
        "requestId": request_id,
    }


def _violation(err: FieldError) -> dict[str, Any]:
    out = err.as_dict()
    out["field"] = safe_text(err.field, MAX_FIELD_CHARS)
    out["message"] = safe_text(err.message, MAX_MESSAGE_CHARS)
    if err.object is not None:
        out["object"] = safe_text(err.object, MAX_FIELD_CHARS)
    return out


def problem_body(err: DomainError, instance: str, request_id: str) -> dict[str, Any]:
    """The problem+json body; only the first MAX_LISTED_ERRORS violations are listed, the
    number of the others is `errorsOmitted`."""
    body = _body(err.type_slug, err.title, err.status, err.detail, instance, request_id)
    if err.errors:
        body["errors"] = [_violation(e) for e in err.errors[:MAX_LISTED_ERRORS]]
        if len(err.errors) > MAX_LISTED_ERRORS:
            body["errorsOmitted"] = len(err.errors) - MAX_LISTED_ERRORS
    return body


def _request_id(request: Request) -> str:
    return str(getattr(request.state, "request_id", ""))


def _instance(request: Request) -> str:
    return str(getattr(request.state, "original_path", None) or request.url.path)


def problem_response(request: Request, err: DomainError) -> JSONResponse:
    return JSONResponse(
        problem_body(err, _instance(request), _request_id(request)),
        status_code=err.status,
        media_type=PROBLEM,
        headers=err.headers or None,
    )


def _loc_to_field(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:] or parts
    out = ""
    for p in parts:
        out += f"[{p}]" if p.isdigit() else (f".{p}" if out else p)
    return out or "request"


def allowed_methods(request: Request) -> str:
    """A 405's `Allow`: every method the routes of the request's path serve (the router
    names only those of the first route whose path matched; a path is often served by one
    route per method)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        route_methods = getattr(route, "methods", None)
        if route_methods and route.matches(request.scope)[0] is not Match.NONE:
            methods |= route_methods
    return ", ".join(sorted(methods))


def install_problem_handlers(app: FastAPI) -> None:
    @app.exception_handler(DomainError)
    async def _domain(request: Request, exc: DomainError) -> JSONResponse:
        return problem_response(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            FieldError(_loc_to_field(tuple(e.get("loc", ()))), str(e.get("msg", "is invalid")))
            for e in exc.errors()
        ]
        return problem_response(request, ValidationFailed.of(errors))

    @app.exception_handler(DBAPIError)
    async def _database(request: Request, exc: DBAPIError) -> JSONResponse:
        if not is_contention(exc):
            raise exc
        # the request's transaction was rolled back whole: nothing changed, send it again
        log.warning(
            "%s %s met another transaction: %s", request.method, _instance(request), exc.orig
        )
        return problem_response(
            request,
            ServiceUnavailable(
                detail="the request met a concurrent change and was rolled back; send it again",
                headers={"Retry-After": "1"},
            ),
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        slug, title = _TITLES.get(exc.status_code, ("error", "Error"))
        detail = exc.detail if isinstance(exc.detail, str) else title
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"no route matches {request.method} {_instance(request)}"
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            detail = f"method {request.method} is not allowed on {_instance(request)}"
            headers["Allow"] = allowed_methods(request) or headers.get("Allow", "")
        body = _body(slug, title, exc.status_code, detail, _instance(request), _request_id(request))
        return JSONResponse(
            body, status_code=exc.status_code, media_type=PROBLEM, headers=headers or None
        )
