"""The NGC endpoints `ngcsdk` needs before (and around) its NVCF calls.

`Client().configure(api_key=..., org_name=...)` (ngcsdk 4.x, ngcbase) with `NGC_CLI_API_URL`
pointing here calls, for an `nvapi-` key:

1. `POST /v3/keys/get-caller-info`, form body `credentials=<key>`, no Authorization header:
   the key's `orgName` becomes the configured org (a different `org_name` is refused by the
   client itself);
2. the same request again while validating (`_check_org`): `type` `SERVICE_KEY` ends the
   validation there. Every later NVCF call validates the configuration again, so repeats it.

For a JWT it calls `GET /v2/orgs?page-size=500` (Bearer JWT) and checks `org_name` is one of
the `organizations[].name`. No token exchange (`/token`, `NGC_CLI_AUTH_URL`) happens for
either: ngcsdk sends `nvapi-` keys and JWTs as they are.

An NGC org is an account of this server (its `ncaId`). Errors are problem+json carrying NGC's
`requestStatus` as well; a credential is never echoed.

`GET /v2/org/{org}/...` is NGC's registry metadata (`ngcsdk` looks up an `nvcr.io` image, model,
resource or chart before creating a function with it). This server does not hold it: the
answer is 403, on which ngcsdk warns and goes on ("couldn't get access to resource ...
Proceeding"); a 404 would stop the create.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from service.auth.caller import caller
from service.auth.deps import AUTHENTICATOR, authenticate_request
from service.core.db import SESSIONMAKER
from service.core.deps import RATE_LIMITER
from service.core.errors import (
    DomainError,
    FieldError,
    Forbidden,
    Unauthorized,
    UnsupportedMediaType,
    ValidationFailed,
)
from service.core.http import parse_json_text
from service.core.numbers import natural_in
from service.core.problem import PROBLEM, problem_body
from service.ngc.schemas import (
    PRODUCTS,
    SERVICE_KEY,
    STATUS_CODES,
    CallerInfo,
    NgcError,
    Organization,
    OrgList,
    PaginationInfo,
    RequestStatus,
)

router = APIRouter(tags=["ngc"])

CALLER_INFO = "/v3/keys/get-caller-info"
FORM = "application/x-www-form-urlencoded"
_BEARER = {"WWW-Authenticate": "Bearer"}
#: ngcsdk asks for pages of 500
DEFAULT_PAGE_SIZE = 500

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": NgcError, "content": {PROBLEM: {}}} for status in (400, 401, 403, 429)
}
_CALLER_INFO_BODY: dict[str, Any] = {
    "requestBody": {
        "required": False,
        "description": "The credential to describe, as ngcsdk sends it (a form field). "
        "Without a body, the Authorization: Bearer credential is described.",
        "content": {
            FORM: {
                "schema": {
                    "type": "object",
                    "required": ["credentials"],
                    "properties": {
                        "credentials": {"type": "string", "description": "nvapi- key or JWT"}
                    },
                }
            },
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["credentials"],
                    "properties": {"credentials": {"type": "string"}},
                }
            },
        },
    }
}


def _request_id(request: Request) -> str:
    return str(getattr(request.state, "request_id", ""))


def _success(request: Request) -> RequestStatus:
    return RequestStatus(statusCode="SUCCESS", requestId=_request_id(request))


def ngc_error(request: Request, err: DomainError) -> JSONResponse:
    """problem+json with NGC's `requestStatus` (its error shape) alongside."""
    instance = str(getattr(request.state, "original_path", None) or request.url.path)
    body = problem_body(err, instance, _request_id(request))
    body["requestStatus"] = {
        "statusCode": STATUS_CODES.get(err.status, "UNKNOWN"),
        "statusDescription": body["detail"],
        "requestId": body["requestId"],
    }
    return JSONResponse(
        body, status_code=err.status, media_type=PROBLEM, headers=err.headers or None
    )


def _single(values: list[str], where: str) -> str | None:
    if not values:
        return None
    if len(values) > 1:
        raise ValidationFailed.of([FieldError(where, "is given more than once")])
    return values[0]


async def _credential_from_body(request: Request) -> str | None:
    """`credentials` from a form (what ngcsdk sends) or JSON body; None without a body."""
    raw = await request.body()
    if not raw.strip():
        return None
    ctype = request.headers.get("content-type", "")
    mime = ctype.split(";", 1)[0].strip().lower()
    if mime in (FORM, ""):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ValidationFailed.of([FieldError("body", "is not UTF-8")]) from None
        fields = parse_qsl(text, keep_blank_values=True)
        return _single([v for k, v in fields if k == "credentials"], "credentials")
    if mime == "application/json":
        try:
            body = parse_json_text(raw)
        except (ValueError, RecursionError):
            raise ValidationFailed.of([FieldError("body", "is not valid JSON")]) from None
        value = body.get("credentials") if isinstance(body, dict) else None
        if value is not None and not isinstance(value, str):
            raise ValidationFailed.of([FieldError("credentials", "must be a string")])
        return value
    raise UnsupportedMediaType(
        detail=f"send the credential as the form field 'credentials' ({FORM}), got '{ctype}'"
    )


async def _caller_info(request: Request) -> CallerInfo:
    credential = await _credential_from_body(request)
    if credential is not None and not credential.strip():
        raise Unauthorized(detail="the 'credentials' field is empty", headers=_BEARER)
    authorization = (
        f"Bearer {credential.strip()}" if credential else request.headers.get("authorization")
    )
    if not authorization:
        raise Unauthorized(
            detail="no credential: send the API key as the form field 'credentials' "
            "(or in an 'Authorization: Bearer' header)",
            headers=_BEARER,
        )
    principal = await caller(
        AUTHENTICATOR.of(request),
        authorization,
        sessions=SESSIONMAKER.of(request),
        limiter=RATE_LIMITER.of(request),
        state=request.scope.setdefault("state", {}),
    )
    return CallerInfo(
        type=SERVICE_KEY,
        orgName=principal.account_id,
        products=list(PRODUCTS),
        requestStatus=_success(request),
    )


@router.post(
    CALLER_INFO,
    response_model=CallerInfo,
    response_model_exclude_none=True,
    responses={**_ERRORS, 415: {"model": NgcError, "content": {PROBLEM: {}}}},
    openapi_extra=_CALLER_INFO_BODY,
    summary="NGC: the org (account) and type of a credential (ngcsdk's configure)",
)
async def get_caller_info(request: Request) -> Any:
    try:
        return await _caller_info(request)
    except DomainError as exc:
        return ngc_error(request, exc)


@router.get(
    CALLER_INFO,
    response_model=CallerInfo,
    response_model_exclude_none=True,
    responses=_ERRORS,
    summary="NGC: the org (account) and type of the Authorization: Bearer credential",
)
async def get_caller_info_of_header(request: Request) -> Any:
    try:
        return await _caller_info(request)
    except DomainError as exc:
        return ngc_error(request, exc)


#: the largest page size or page number a query may give
MAX_PAGE_PARAM = 999_999_999


def _page_param(request: Request, name: str, minimum: int) -> int | None:
    values = request.query_params.getlist(name)
    if not values:
        return None
    value = _single(values, name) or ""
    number = natural_in(value, minimum, MAX_PAGE_PARAM)
    if number is None:
        raise ValidationFailed.of(
            [FieldError(name, f"must be an integer from {minimum} to {MAX_PAGE_PARAM}")], "query"
        )
    return number


@router.get(
    "/v2/orgs",
    response_model=OrgList,
    response_model_exclude_none=True,
    responses=_ERRORS,
    summary="NGC: the caller's orgs, which is its account (ngcsdk's configure with a JWT)",
)
async def list_orgs(request: Request) -> Any:
    try:
        size = _page_param(request, "page-size", 1) or DEFAULT_PAGE_SIZE
        number = _page_param(request, "page-number", 0) or 0
        principal = await authenticate_request(request)
    except DomainError as exc:
        return ngc_error(request, exc)
    account = principal.account_id
    orgs = [
        Organization(
            name=account,
            displayName=account,
            description=f"account '{account}' of this NVCF server",
            type="ENTERPRISE",
        )
    ]
    return OrgList(
        organizations=orgs if number == 0 else [],
        paginationInfo=PaginationInfo(index=number, size=size, totalResults=1, totalPages=1),
        requestStatus=_success(request),
    )


@router.get(
    "/v2/org/{org}/{resource:path}",
    responses={**_ERRORS, 200: {"description": "Never: always 401 or 403"}},
    summary="NGC registry metadata (images, models, charts): not served, always 403",
)
async def registry_metadata(org: str, resource: str, request: Request) -> JSONResponse:
    try:
        await authenticate_request(request)  # 401 for a bad credential, 403 for another org
    except DomainError as exc:
        return ngc_error(request, exc)
    return ngc_error(
        request,
        Forbidden(
            detail="this server does not hold NGC registry metadata; ngcsdk goes on without "
            "this check (the image, model or chart is pulled when the function is deployed)"
        ),
    )


__all__ = ["ngc_error", "router"]
